"""Ingest replicas sharing one source: two sharded replicas against one ingest, in one run.

Usage: python bench/ingest_replicas.py [--workloads 100000] [--replicas 2] [--shards 16]
                                       [--cluster] [--repeat 3]

The response is bench/ingest.py's (a Prometheus range-query response of N GPUs, dcgm-exporter
device series, one pod per GPU, one instant). Each replica is its own process (as in a
deployment: one Python process uses one core) running the real service path on the whole
response: keep the series of its shards' GPUs (``FRACPILOT_INGEST_SHARDS``, each replica
holding an equal share: the leases are not timed), parse them, attribute, validate, encode
each shard's batches and publish them through the publish window. As in bench/ingest.py the
timing starts from the decoded response: each replica still downloads and decodes the whole
of it (JSON), which is not timed. The replicas start together (a barrier);
a run's time is the slowest replica's, its rate all samples stored over that time. Rows, each
on a fresh nats-server (``--cluster``: three routed on loopback, R3 streams):

- one ingest, unsharded (today);
- one replica holding every shard (what sharding costs a replica: smaller batches);
- ``--replicas`` replicas, the shards split evenly.

Each row is the best of ``--repeat`` runs, the rows interleaved (the box is shared: the best
is the least disturbed). Beside the wall time, the busiest replica's own CPU time: one
ingest's over it is the speed-up with a core per replica, which a busy box's wall time hides.
The machine's load average is printed with them: the target (two replicas at least 1.7x one)
assumes two idle cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import time
from multiprocessing.synchronize import Barrier

from ingest import nats_under_test, prometheus_response

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.shard_plan import gpu_uuid_labels, plan_cycle
from fracpilot_libs.usage.attribution import GpuInventory
from fracpilot_libs.usage.range_queries import points_by_instant


async def replica_path(
    url: str, workloads: int, at: float, shards: int, mine: list[int], barrier: Barrier
) -> tuple[int, float, float]:
    """One replica's reading of the whole response: samples sent, seconds, CPU seconds."""
    response = prometheus_response(workloads, at)
    settings = IngestSettings(
        nats={"url": url}, sources="prometheus", cluster="bench", usage_view=False,
        ingest={"shards": shards},
    )  # fmt: skip
    service = IngestService(settings)
    await service.runtime.bus.connect()
    await service.runtime.bus.ensure_streams()
    plan = plan_cycle(shards, mine, {}, fallback=0.0)
    keep = plan.kept if shards > 1 else None
    labels = gpu_uuid_labels(service.table)
    await asyncio.to_thread(barrier.wait)
    start, cpu = time.perf_counter(), time.process_time()
    sent = 0
    series = plan.of_shards(response, labels) if shards > 1 else response  # as the source does
    for points in points_by_instant(series).values():
        sent += await service.publish_instant("prometheus", points, GpuInventory(), keep=keep)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    await service.runtime.bus.close()
    return sent, seconds, cpu


def _replica(
    url: str, workloads: int, at: float, shards: int, mine: list[int], barrier: Barrier
) -> tuple[int, float, float]:
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(replica_path(url, workloads, at, shards, mine, barrier))


def one_run(
    cluster: bool, workloads: int, at: float, shards: int, owned: list[list[int]]
) -> tuple[int, float, float]:
    """The replicas (one per entry of ``owned``) in processes of their own, on a fresh
    server: samples sent by all, the slowest replica's seconds and the most CPU seconds one
    replica used."""
    ctx = mp.get_context("spawn")
    with nats_under_test(cluster) as url, ctx.Manager() as manager:
        barrier = manager.Barrier(len(owned))
        with ctx.Pool(len(owned)) as pool:
            results = pool.starmap(
                _replica, [(url, workloads, at, shards, mine, barrier) for mine in owned]
            )
    return sum(r[0] for r in results), max(r[1] for r in results), max(r[2] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--cluster", action="store_true", help="a three-node cluster (R3)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    at = float(int(time.time()))
    every = list(range(args.shards))
    split = [every[r :: args.replicas] for r in range(args.replicas)]
    rows = [
        ("one ingest, unsharded (today)", 0, [every]),
        (f"one replica holding all {args.shards} shards", args.shards, [every]),
        (f"{args.replicas} replicas, {args.shards} shards split", args.shards, split),
    ]
    where = "three-node cluster, R3" if args.cluster else "one server, R1"
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[int, float, float]]] = {what: [] for what, _, _ in rows}
    for _ in range(args.repeat):  # interleaved: each row sees the box as busy as the others
        for what, shards, owned in rows:
            runs[what].append(one_run(args.cluster, args.workloads, at, shards, owned))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    before = " ".join(f"{x:.2f}" for x in load_before)
    print(
        f"{args.workloads} GPUs, one instant; {where}; {os.cpu_count()} cores; "
        f"load {before} before, {load} after; best of {args.repeat}, interleaved"
    )
    print(
        f"{'path':<38}{'samples':>8}{'wall s':>8}{'samples/s':>11}{'vs one':>8}"
        f"{'CPU s':>7}{'vs one':>8}"
    )
    # "CPU s": the busiest replica's own CPU time; one over it is the speed-up on cores of
    # their own (a quiet box), which the wall time on a shared box cannot show.
    best = {what: min(r, key=lambda run: run[1]) for what, r in runs.items()}
    cpu = {what: min(run[2] for run in r) for what, r in runs.items()}
    one = rows[0][0]
    base = best[one][0] / best[one][1]
    for what, (n, seconds, _) in best.items():
        rate = n / seconds
        print(
            f"{what:<38}{n:>8}{seconds:>8.2f}{rate:>11,.0f}{rate / base:>8.2f}"
            f"{cpu[what]:>7.2f}{cpu[one] / cpu[what]:>8.2f}"
        )


if __name__ == "__main__":
    main()
