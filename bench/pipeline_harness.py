"""What the pipeline benches share: a sample publisher (its own process), services as processes,
an observer of decisions and results, and the decision service's metrics.

Samples are the wire model's JSON (about 490 bytes, validated once against ``UsageSample``),
published with a ``Nats-Msg-Id`` header as ingest does; the publish time rides in
``sample_id`` so that a decision (its ``trigger_sample_id``) and the result of that decision
say how long they took from the publish. Of ``workloads`` workloads a ``hot`` few grow in
memory every round (an upsize each sample, so decisions and actuations flow all along); the
others are steady and cause no decision (the service still decides on every sample).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import re
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from fracpilot_libs.contracts import UsageSample, WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_batch import MAX_BATCH_SAMPLES, encode_batch
from fracpilot_libs.server_process import ServerProcess, free_port

GIB = 1024**3
DEVICE = 80 * GIB
NAMESPACES = 100
HOT_START = 0.125  # the fraction hot workloads are seeded with on the simulated cluster
INTERVAL_S = 15.0  # the sampling interval of the sized platform


def workload(i: int) -> tuple[str, str]:
    return f"team-{i % NAMESPACES:02d}", f"svc-{i:06d}"


def payload(i: int, round_: int, hot: bool, now_ns: int, stamp: str) -> bytes:
    ns, name = workload(i)
    if hot:  # memory grows 12% of the device a round: a bigger fraction every sample
        memory, compute, allocated = min(0.95, 0.12 * (round_ + 1)), 0.1, HOT_START
    else:
        memory, compute, allocated = 0.1, 0.15 + (i * 7 + round_ * 13) % 20 / 100, 0.5
    return (
        f'{{"schema_version":1,"sample_id":"b|{i}|{round_}|{now_ns}","workload":{{'
        f'"cluster":"bench","namespace":"{ns}","owner_kind":"Deployment","owner_name":'
        f'"{name}"}},"pod":"{name}-0","container":"main","node":"node-{i // 8}",'
        f'"gpu_uuid":"GPU-{i}","timestamp":"{stamp}","compute":{compute:.3f},'
        f'"memory_used_bytes":{int(memory * DEVICE)},"memory_total_bytes":{DEVICE},'
        f'"allocated_fraction":{allocated},"source":"bench","attribution":"exact",'
        f'"signals":null}}'
    ).encode()


def published_ns(sample_id: str) -> int | None:
    parts = sample_id.split("|")
    return int(parts[3]) if len(parts) == 4 and parts[0] == "b" else None


def hot_set(workloads: int, hot: int) -> list[int]:
    """``hot`` workloads spread evenly over all of them."""
    count = max(1, min(workloads, hot))
    step = workloads / count
    return sorted({int(k * step) for k in range(count)})


# --- the publisher (a process of its own) --------------------------------------------------


@dataclass(frozen=True)
class PublishPlan:
    url: str
    workloads: int
    hot: tuple[int, ...]
    rounds: int
    first_round: int = 0
    rate: float | None = None  # samples/s; None: as fast as the server takes them
    subject_prefix: str = ""  # "": the usage subjects; else <prefix>.<i> (the raw baseline)
    batches_of: int = 0  # > 0: usage batches (per partition and round) of this many partitions


def _publisher(plan: PublishPlan, out: Any) -> None:
    out.send(asyncio.run(_publish(plan)))


async def _publish(plan: PublishPlan) -> dict[str, float]:
    nc = await nats.connect(plan.url.split(","), pending_size=64 * 1024 * 1024)
    js = nc.jetstream(publish_async_max_pending=8000)
    hot = set(plan.hot)
    subj = [
        f"{plan.subject_prefix}.{i}"
        if plan.subject_prefix
        else subjects.usage_subject(
            WorkloadRef(namespace=workload(i)[0], owner_name=workload(i)[1])
        )
        for i in range(plan.workloads)
    ]
    total = plan.workloads * plan.rounds
    started = time.monotonic()
    sent = 0
    if plan.batches_of:
        return await _publish_batches(plan, nc, js, hot, started)
    for r in range(plan.first_round, plan.first_round + plan.rounds):
        stamp = datetime.now(UTC).isoformat()
        for i in range(plan.workloads):
            if plan.rate is not None:
                due = started + sent / plan.rate
                if (wait := due - time.monotonic()) > 0.002:
                    await asyncio.sleep(wait)
            data = payload(i, r, i in hot, time.time_ns(), stamp)
            await js.publish_async(subj[i], data, headers={"Nats-Msg-Id": f"{i}:{r}"})
            sent += 1
    await js.publish_async_completed()
    elapsed = time.monotonic() - started
    await nc.close()
    return {"published": total, "seconds": elapsed, "rate": total / elapsed, "bytes": len(data)}


async def _publish_batches(
    plan: PublishPlan, nc: Any, js: Any, hot: set[int], started: float
) -> dict[str, float]:
    """The same samples as usage batches: each round's samples of a partition together
    (:mod:`fracpilot_libs.nats.usage_batch`), paced per batch."""
    by_partition: dict[int, list[int]] = {}
    for i in range(plan.workloads):
        ref = WorkloadRef(namespace=workload(i)[0], owner_name=workload(i)[1])
        by_partition.setdefault(subjects.usage_partition(ref, plan.batches_of), []).append(i)
    total = plan.workloads * plan.rounds
    sent, size = 0, 0
    for r in range(plan.first_round, plan.first_round + plan.rounds):
        stamp = datetime.now(UTC).isoformat()
        for p, members in sorted(by_partition.items()):
            for start in range(0, len(members), MAX_BATCH_SAMPLES):
                if plan.rate is not None:
                    due = started + sent / plan.rate
                    if (wait := due - time.monotonic()) > 0.002:
                        await asyncio.sleep(wait)
                rows = [
                    (f"{i}:{r}", payload(i, r, i in hot, time.time_ns(), stamp))
                    for i in members[start : start + MAX_BATCH_SAMPLES]
                ]
                batch = encode_batch(p, plan.batches_of, rows)
                await js.publish_async(
                    batch.subject, batch.payload, headers={"Nats-Msg-Id": batch.batch_id}
                )
                sent += len(rows)
                size = len(rows[-1][1])
    await js.publish_async_completed()
    elapsed = time.monotonic() - started
    await nc.close()
    return {"published": total, "seconds": elapsed, "rate": total / elapsed, "bytes": size}


def start_publisher(plan: PublishPlan) -> tuple[multiprocessing.process.BaseProcess, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_publisher, args=(plan, child), daemon=True)
    proc.start()
    return proc, parent


def check_payload() -> int:
    """The bench's samples are valid wire samples; returns their size."""
    data = payload(123, 0, False, time.time_ns(), datetime.now(UTC).isoformat())
    UsageSample.model_validate_json(data)
    data = payload(7, 3, True, time.time_ns(), datetime.now(UTC).isoformat())
    UsageSample.model_validate_json(data)
    return len(data)


# --- observing decisions and results ---------------------------------------------------------


@dataclass
class Observer:
    """Times from a sample's publish to its decision and to the decision's result."""

    to_decision_ms: list[float] = field(default_factory=list)
    to_result_ms: list[float] = field(default_factory=list)
    _published: dict[str, int] = field(default_factory=dict)  # decision id -> publish ns
    _nc: Any = None

    async def start(self, url: str) -> None:
        self._nc = await nats.connect(url.split(","), pending_size=256 * 1024 * 1024)
        await self._nc.subscribe(f"{subjects.DECISION_PREFIX}.>", cb=self._on_decision)
        await self._nc.subscribe(f"{subjects.ACTUATION_PREFIX}.>", cb=self._on_result)
        await self._nc.flush()

    async def _on_decision(self, msg: Msg) -> None:
        now = time.time_ns()
        body = json.loads(msg.data)
        sent = published_ns(body.get("trigger_sample_id", ""))
        if sent is not None:
            self._published[body["decision_id"]] = sent
            self.to_decision_ms.append((now - sent) / 1e6)

    async def _on_result(self, msg: Msg) -> None:
        now = time.time_ns()
        sent = self._published.get(json.loads(msg.data).get("decision_id", ""))
        if sent is not None:
            self.to_result_ms.append((now - sent) / 1e6)

    def reset(self) -> None:
        self.to_decision_ms.clear()
        self.to_result_ms.clear()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


# --- the decision service's metrics ----------------------------------------------------------


_SAMPLE = re.compile(r"^([a-z_]+)(?:\{([^}]*)\})? ([0-9.e+-]+|\+Inf|NaN)$")


def scrape(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if m := _SAMPLE.match(line):
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def metric(snapshot: dict[tuple[str, str], float], name: str, labels: str = "") -> float:
    return snapshot.get((name, labels), 0.0)


def histogram_quantile(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], name: str, q: float
) -> float:
    """The q-quantile (0..1) of a histogram's observations between two scrapes, interpolated
    within the bucket as Prometheus does."""
    buckets = []
    for (n, labels), value in after.items():
        if n == f"{name}_bucket":
            le = labels.split('le="')[1].rstrip('"')
            bound = math.inf if le == "+Inf" else float(le)
            buckets.append((bound, value - before.get((n, labels), 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


# --- services as processes -------------------------------------------------------------------


def service_env(url: str, **extra: str) -> dict[str, str]:
    return {
        "FRACPILOT_NATS_URL": url,
        "FRACPILOT_LOG_LEVEL": "WARNING",
        **extra,
    }


def decision_env(url: str, port: int, **extra: str) -> dict[str, str]:
    return service_env(url, FRACPILOT_METRICS_PORT=str(port), **extra)


def actuator_env(url: str, hot: list[int]) -> dict[str, str]:
    pods = ",".join(f"{workload(i)[0]}/{workload(i)[1]}={HOT_START}" for i in hot)
    return service_env(
        url,
        FRACPILOT_SIM_CLUSTER="bench",
        FRACPILOT_SIM_PODS=pods,
        FRACPILOT_SIM_NODES=str(max(1, math.ceil(len(hot) / 2))),  # a GPU each: in place
        FRACPILOT_SIM_GPUS_PER_NODE="2",
        FRACPILOT_OPTIN_DEFAULT_MODE="auto",  # the bench's cluster opts every namespace in
        FRACPILOT_METRICS_PORT=str(free_port()),
    )


def wait_ready(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"service on port {port} not ready within {timeout_s}s")


def machine_note() -> str:
    load = os.getloadavg()
    return (
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} at the start"
    )


def log_dir(name: str) -> Path:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fracpilot-bench-{name}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Service:
    """A fracpilot service as a child process (optionally under cProfile)."""

    module: str
    env: dict[str, str]
    log: Path
    profile: Path | None = None
    server: ServerProcess | None = None

    @property
    def proc(self) -> Any:
        return self.server.proc if self.server is not None else None

    def start(self) -> Service:
        cmd = [sys.executable]
        if self.profile is not None:
            cmd += ["-m", "cProfile", "-o", str(self.profile)]
        cmd += ["-m", self.module]
        self.server = ServerProcess(self.module, self.log)
        self.server.start(cmd, env={**os.environ, **self.env})
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.server is not None:
            self.server.stop(timeout_s)

    def kill(self) -> None:
        if self.server is not None:
            self.server.stop(kill=True)


async def declare_streams(url: str, partitions: int) -> None:
    """The streams as the services declare them (a usage stream per partition)."""
    from prometheus_client import CollectorRegistry

    from fracpilot_libs.config import ServiceSettings
    from fracpilot_libs.nats.bus import Bus

    bus = Bus("bench", ServiceSettings(nats={"url": url}, decision_partitions=partitions),
              CollectorRegistry())  # fmt: skip
    await bus.connect(retry_for_s=10)
    await bus.ensure_streams(assign_partitions=True)
    await bus.close()


async def wait_decided(port: int, count: float, timeout_s: float) -> float | None:
    """Seconds until the decision service has decided ``count`` samples (None: it did not)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if metric(scrape(port), "fracpilot_decision_samples_total") >= count:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    return None


async def poll_until(predicate: Any, every_s: float = 0.1, timeout_s: float = 600.0) -> None:
    """Call ``predicate`` every ``every_s`` until it is true; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(every_s)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
