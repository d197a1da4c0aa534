"""``fracpilot status`` on a large fleet, next to just reading what it reads.

Usage: python bench/status.py [--workloads N] [--repeat N] [--nats-url URL]

Publishes N workloads (default 10,000) to a real nats-server (an embedded one unless
``--nats-url`` names one; its fracpilot streams and buckets are replaced): per workload an
allocation, an engine checkpoint (the real engine's state after two hours of one-minute
samples, from 200 usage profiles), its latest usage sample and an actuation result. Then
times, best of ``--repeat``:

- ``read raw``: the baseline, the four sources read as bytes with the same consumers and no
  decoding (the floor any reader of these streams pays);
- ``kv keys``: nats-py's ``KeyValue.keys()`` on the engine-state bucket (headers only);
- ``read + rows``: reading, decoding and building the sorted rows in-process;
- ``render table`` / ``wide`` / ``json`` / ``yaml``: rendering those rows alone;
- ``fracpilot status``: the command end to end as a new process (interpreter start, imports,
  connect, read, rows, table to a pipe), and the same with ``-o json``; ``fracpilot --help``
  for the interpreter start and imports alone. Their CPU time (user + system) is printed
  beside the wall time: on a shared machine it is the steadier figure.

Each line gives wall and CPU seconds and their ratios to the baseline (CPU is the steadier
figure on a shared machine). The target is under 2 s wall, end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry

from fracpilot_cli import render
from fracpilot_cli.operator_cli import status_rows
from fracpilot_cli.operator_data import read_bucket, read_stream, read_usage
from fracpilot_cli.settings import CliSettings
from fracpilot_cli.status import StatusRow
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    Outcome,
    PlanKind,
    Policy,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus, default_streams
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.nats.usage_streams import usage_streams
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState, dump_state

GIB = 1024**3
DEVICE = 80 * GIB
T0 = datetime(2026, 3, 2, tzinfo=UTC)
PROFILES = 200
FRACPILOT = Path(sys.executable).parent / "fracpilot"


def profile_states(policy: Policy, rng: random.Random) -> list[tuple[bytes, float, float]]:
    """(checkpoint, fraction, last compute) of the engine after two hours of a usage profile."""
    out = []
    ref = WorkloadRef(namespace="bench", owner_name="profile")
    for p in range(PROFILES):
        base_c, base_m = rng.uniform(0.02, 0.8), rng.uniform(0.05, 0.7)
        fraction = rng.choice([0.25, 0.375, 0.5, 0.75, 1.0])
        state = WorkloadState()
        compute = base_c
        for minute in range(120):
            compute = min(1.0, max(0.0, base_c + rng.gauss(0, 0.05)))
            sample = UsageSample(
                sample_id=f"{p}-{minute}",
                workload=ref,
                pod="profile-0",
                timestamp=T0 + timedelta(minutes=minute),
                compute=compute,
                memory_used_bytes=int(base_m * DEVICE),
                memory_total_bytes=DEVICE,
                allocated_fraction=fraction,
                source="bench",
            )
            state, decision = decide(state, sample, policy)
            if decision is not None:
                fraction = decision.new_fraction
        out.append((dump_state(state), fraction, compute))
    return out


async def populate(url: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    usage = [subjects.usage_stream(p) for p in range(16)]
    for name in (*(spec.name for spec in default_streams()), *usage):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    bus = Bus("bench", ServiceSettings(nats={"url": url}), CollectorRegistry())
    await bus.connect(retry_for_s=10)
    await bus.ensure_streams()
    for bucket in (subjects.ALLOCATION_BUCKET, subjects.DECISION_STATE_BUCKET):
        with contextlib.suppress(NotFoundError):
            await js.delete_key_value(bucket)
        await bus.kv(bucket)
    await bus.close()

    rng = random.Random(7)
    states = profile_states(Policy(), rng)
    at = T0 + timedelta(hours=2)
    for i in range(n):
        ref = WorkloadRef(cluster="bench", namespace=f"ns-{i % 50}", owner_name=f"workload-{i:05d}")
        key = subjects.kv_key(ref)
        state, fraction, compute = states[i % PROFILES]
        allocation = Allocation(
            workload=ref,
            pod=f"workload-{i:05d}-0",
            node=f"node-{i % 500}",
            gpu_uuid=f"GPU-{i % 2000}",
            fraction=fraction,
            device_memory_bytes=DEVICE,
            updated_at=at,
        )
        sample = UsageSample(
            sample_id=f"bench-{i}",
            workload=ref,
            pod=f"workload-{i:05d}-0",
            node=f"node-{i % 500}",
            gpu_uuid=f"GPU-{i % 2000}",
            gpu_model="NVIDIA A100-SXM4-80GB" if i % 3 else "NVIDIA H100 80GB HBM3",
            timestamp=at,
            compute=compute,
            memory_used_bytes=int(0.3 * DEVICE),
            memory_total_bytes=DEVICE,
            allocated_fraction=fraction,
            source="bench",
        )
        result = ActuationResult(
            decision_id=f"d-{i}",
            workload=ref,
            plan=PlanKind.IN_PLACE,
            outcome=Outcome.APPLIED if i % 7 else Outcome.FAILED,
            fraction_before=1.0,
            fraction_after=fraction,
            detail="bench",
            finished_at=at,
        )
        # Core publishes into the streams (no ack per message), flushed in batches.
        await nc.publish(f"$KV.{subjects.ALLOCATION_BUCKET}.{key}", allocation.to_json())
        await nc.publish(f"$KV.{subjects.DECISION_STATE_BUCKET}.{key}", state)
        await nc.publish(subjects.usage_subject(ref), sample.to_json())
        await nc.publish(subjects.actuation_subject(ref), result.to_json())
        if i % 500 == 499:
            await nc.flush()
    await nc.flush()
    for streams in (
        [f"KV_{subjects.ALLOCATION_BUCKET}"],
        [f"KV_{subjects.DECISION_STATE_BUCKET}"],
        await usage_streams(js),
        [subjects.ACTUATION_STREAM],
    ):
        for _ in range(200):
            held = sum([(await js.stream_info(stream)).state.messages for stream in streams])
            if held >= n:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"{streams} hold {held} of {n} messages")
    await nc.close()


async def read_raw(url: str) -> int:
    nc = await nats.connect(url)
    got = await asyncio.gather(
        read_bucket(nc, subjects.ALLOCATION_BUCKET),
        read_bucket(nc, subjects.DECISION_STATE_BUCKET),
        read_usage(nc, DeliverPolicy.LAST_PER_SUBJECT),
        read_stream(
            nc,
            subjects.ACTUATION_STREAM,
            f"{subjects.ACTUATION_PREFIX}.>",
            DeliverPolicy.LAST_PER_SUBJECT,
        ),
    )
    await nc.close()
    return sum(len(g) for g in got)


async def kv_keys(url: str) -> int:
    nc = await nats.connect(url)
    kv = await nc.jetstream().key_value(subjects.DECISION_STATE_BUCKET)
    keys = await kv.keys()
    await nc.close()
    return len(keys)


async def read_rows(url: str) -> list[object]:
    """What the command does between connecting and printing (operator_cli.status_rows)."""
    rows, _ = await status_rows(CliSettings(nats={"url": url}), GpuPrices(), None)
    return list(rows)


@dataclass
class Timing:
    name: str
    wall: float  # best of the runs, seconds
    cpu: float  # CPU seconds (user + system) of that work: this process's, or the command's
    note: str = ""


def best(repeat: int, run: Callable[[], object]) -> tuple[float, float, object]:
    """Best wall time, best CPU time of this process, the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus), result


def command(url: str, *args: str) -> Callable[[], tuple[float, int]]:
    # As installed: bytecode caches written once and used (a shell may forbid writing them).
    env = {**os.environ, "FRACPILOT_NATS_URL": url}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run() -> tuple[float, int]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([str(FRACPILOT), *args], env=env, capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return cpu, done.stdout.count(b"\n")

    return run


def timed_command(repeat: int, url: str, label: str, *args: str) -> Timing:
    """The command as a new process, after a warm-up run: best wall and CPU times."""
    run = command(url, *args)
    run()
    walls, cpus, lines = [], [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        cpu, lines = run()
        walls.append(time.perf_counter() - start)
        cpus.append(cpu)
    return Timing(label, min(walls), min(cpus), f"{lines:,} lines, new process")


def measure(url: str, repeat: int) -> list[Timing]:
    wall, cpu, count = best(repeat, lambda: asyncio.run(read_raw(url)))
    out = [Timing("read raw (baseline)", wall, cpu, f"{count:,} messages")]
    wall, cpu, keys = best(repeat, lambda: asyncio.run(kv_keys(url)))
    out.append(Timing("kv keys (state bucket)", wall, cpu, f"{keys:,} keys"))
    wall, cpu, got = best(repeat, lambda: asyncio.run(read_rows(url)))
    rows: list[StatusRow] = got  # type: ignore[assignment]
    out.append(Timing("read + rows", wall, cpu, f"{len(rows):,} rows"))
    renders: list[tuple[str, Callable[[], object]]] = [
        ("render table", lambda: render.status_lines(rows)),
        ("render wide", lambda: render.status_lines(rows, wide=True)),
        ("render json", lambda: render.to_json(render.status_document(rows, datetime.now(UTC)))),
        ("render yaml", lambda: render.to_yaml(render.status_document(rows, datetime.now(UTC)))),
    ]
    for name, fn in renders:
        wall, cpu, _ = best(repeat, fn)
        out.append(Timing(name, wall, cpu))
    for label, cmd in (
        ("fracpilot status", ("status",)),
        ("fracpilot status -o json", ("status", "-o", "json")),
        ("fracpilot --help", ("--help",)),
    ):
        out.append(timed_command(repeat, url, label, *cmd))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nats-url", default=None)
    args = parser.parse_args()
    server = None if args.nats_url else EmbeddedNats().start()
    url = args.nats_url or (server.url if server else "")
    try:
        start = time.perf_counter()
        asyncio.run(populate(url, args.workloads))
        print(
            f"published {args.workloads:,} workloads to {url} in "
            f"{time.perf_counter() - start:.1f} s; best of {args.repeat}; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        timings = measure(url, args.repeat)
    finally:
        if server is not None:
            server.cleanup()
    base = timings[0]
    print(f"{'':<26}{'wall s':>8}{'CPU s':>8}{'wall/base':>11}{'CPU/base':>10}  note")
    for t in timings:
        print(
            f"{t.name:<26}{t.wall:>8.3f}{t.cpu:>8.3f}{t.wall / base.wall:>11.2f}"
            f"{t.cpu / base.cpu:>10.2f}  {t.note}"
        )
    status = next(t for t in timings if t.name == "fracpilot status")
    verdict = "met" if status.wall < 2.0 else "NOT met"
    print(
        f"target: fracpilot status on {args.workloads:,} workloads under 2 s wall: {verdict} "
        f"({status.wall:.2f} s wall, {status.cpu:.2f} s CPU)"
    )


if __name__ == "__main__":
    main()
