"""Memory per workload in the decision service at 100,000 workloads, with full histories.

Usage: python bench/decision_memory.py [--workloads 100000] [--skip-service]

Every workload gets a full history: a day of hourly samples (the 24 h memory window full, a
compute histogram spread over many buckets), so the figures are the steady state, not the
first minutes. Measured:

1. in process (tracemalloc): the service's per-workload structures (the state by
   ``subjects.kv_key``, as ``Partition.states`` holds it), next to a baseline of the same
   keys mapped to one float each (the floor of any per-workload Python state);
2. the checkpoint of a state (``dump_state``), mean and largest;
3. the decision service as a process (RSS from /proc): started with an empty checkpoint bucket,
   then with one checkpoint per workload, which it restores on claiming its partitions, then
   after one sample per workload (partitions' dirty sets, the policy path): the growth per
   workload.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nats
from pipeline_harness import (
    PublishPlan,
    Service,
    decision_env,
    declare_streams,
    log_dir,
    machine_note,
    metric,
    scrape,
    start_publisher,
    wait_decided,
    wait_ready,
    workload,
)
from prometheus_client import CollectorRegistry

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_libs.contracts import Policy, UsageSample, WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.server_process import free_port
from fracpilot_libs.sizing.checkpoint_groups import group_key
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state

KIB = 1024
T0 = datetime(2026, 3, 2, tzinfo=UTC)


def full_state(rng: random.Random, policy: Policy) -> WorkloadState:
    """A day and an hour of hourly samples: every memory slot used, a spread histogram."""
    state = WorkloadState()
    ref = WorkloadRef(cluster="bench", namespace="team-00", owner_name="proto")
    base = rng.uniform(0.05, 0.6)
    for h in range(26):
        s = UsageSample(
            sample_id=f"m|{h}",
            workload=ref,
            pod="proto-0",
            timestamp=T0 + timedelta(hours=h),
            compute=min(1.0, max(0.0, rng.gauss(base, 0.15))),
            memory_used_bytes=int(rng.uniform(0.05, 0.5) * 80 * 1024**3),
            memory_total_bytes=80 * 1024**3,
            allocated_fraction=0.5,
            source="bench",
        )
        state, _ = decide(state, s, policy)
    return state


def keys(n: int) -> list[str]:
    out = []
    for i in range(n):
        ns, name = workload(i)
        out.append(subjects.kv_key(WorkloadRef(cluster="bench", namespace=ns, owner_name=name)))
    return out


def traced(build: object) -> int:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build() if callable(build) else None
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def service_rss(n: int, checkpoints: list[bytes], partitions: int) -> dict[str, float]:
    """RSS of the decision service idle, with every workload restored, after a sample each."""
    out: dict[str, float] = {}
    with EmbeddedNats() as server:
        await declare_streams(server.url, partitions)
        logs = log_dir("memory")
        env = {"FRACPILOT_DECISION_PARTITIONS": str(partitions)}
        port = free_port()
        idle = Service("fracpilot_decision", decision_env(server.url, port, **env),
                       logs / "idle.log").start()  # fmt: skip
        try:
            wait_ready(port)
            await asyncio.sleep(2)
            out["idle"] = rss_kib(idle.proc.pid)
        finally:
            idle.stop()

        nc = await nats.connect(server.url)
        cp = Checkpointer(nc, CollectorRegistry())
        await cp.open()
        names = keys(n)
        by_group: dict[str | None, list[int]] = {}  # a write holds whole groups (it is the
        for j, k in enumerate(names):  # value of every state in them): chunks of whole groups
            by_group.setdefault(group_key(k), []).append(j)
        started = time.monotonic()
        chunk: dict[str, WorkloadState] = {}
        groups = list(by_group.values())
        for g, members in enumerate(groups, start=1):
            chunk.update((names[j], load_state(checkpoints[j % len(checkpoints)])) for j in members)
            if len(chunk) >= 5000 or g == len(groups):
                failed = await cp.write(chunk, chunk.keys())
                assert not failed, f"{len(failed)} checkpoint writes failed"
                chunk = {}
        out["write_s"] = time.monotonic() - started
        await nc.close()

        port = free_port()
        loaded = Service("fracpilot_decision", decision_env(server.url, port, **env),
                         logs / "loaded.log").start()  # fmt: skip
        try:
            started = time.monotonic()
            wait_ready(port, timeout_s=300)
            out["restore_s"] = time.monotonic() - started
            await asyncio.sleep(2)
            out["loaded"] = rss_kib(loaded.proc.pid)
            out["restored"] = metric(scrape(port), "fracpilot_decision_checkpoints_restored_total")
            proc, pipe = start_publisher(PublishPlan(server.url, n, (), 1, first_round=30))
            proc.join()
            pipe.recv()
            await wait_decided(port, n, 300)
            await asyncio.sleep(2)
            out["sampled"] = rss_kib(loaded.proc.pid)
            out["workloads"] = metric(scrape(port), "fracpilot_decision_workloads")
        finally:
            loaded.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--skip-service", action="store_true")
    args = parser.parse_args()
    n = args.workloads
    print(f"{machine_note()}; {n:,} workloads with a day of history each")
    rng = random.Random(7)
    policy = Policy()
    protos = [full_state(rng, policy) for _ in range(500)]
    checkpoints = [dump_state(s) for s in protos]
    names = keys(n)

    baseline = traced(lambda: {k: float(i) for i, k in enumerate(names)})
    # Fresh objects per workload (a restore parses each checkpoint anew: nothing shared).
    states = traced(lambda: {k: load_state(checkpoints[i % 500]) for i, k in enumerate(names)})
    sizes = [len(c) for c in checkpoints]
    print("\nin process (tracemalloc), per workload")
    print(f"{'what':<44}{'bytes':>8}{'vs baseline':>13}{'vs 4 KiB':>10}")
    rows = [
        ("baseline: key -> one float", baseline / n),
        ("engine state by key (Partition.states)", states / n),
        ("checkpoint (dump_state), mean", sum(sizes) / len(sizes)),
        ("checkpoint (dump_state), largest", max(sizes)),
    ]
    for what, value in rows:
        print(f"{what:<44}{value:>8,.0f}{value / (baseline / n):>13.1f}{value / (4 * KIB):>10.2f}")
    print(f"state slots: {len(protos[0].memory_peaks)} memory peaks, "
          f"{sum(1 for w in protos[0].compute_weights if w)} histogram buckets used")  # fmt: skip

    if args.skip_service:
        return
    rss = asyncio.run(service_rss(n, checkpoints, args.partitions))
    print("\nthe decision service process (RSS)")
    print(f"{'state':<52}{'RSS MiB':>9}{'per workload':>14}{'vs 4 KiB':>10}")
    for label, key in (
        ("idle (no workload)", "idle"),
        (f"{int(rss['restored']):,} workloads restored from checkpoints", "loaded"),
        (f"then one sample each ({int(rss['workloads']):,} workloads)", "sampled"),
    ):
        per = (rss[key] - rss["idle"]) * KIB / n
        print(f"{label:<52}{rss[key] / KIB:>9,.1f}{per:>14,.0f}{per / (4 * KIB):>10.2f}")
    print(f"writing {n:,} checkpoints took {rss['write_s']:.1f} s; the restart restoring "
          f"them was ready in {rss['restore_s']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
