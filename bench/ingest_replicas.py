"""Ingest replicas sharing one source: two sharded replicas against one ingest, in one run.

Usage: python bench/ingest_replicas.py [--workloads 100000] [--replicas 2] [--shards 16]
                                       [--cluster] [--repeat 3] [--cycles 1] [--compare REV]

The response is bench/ingest.py's (a Prometheus range-query response of N GPUs, dcgm-exporter
device series, one pod per GPU, one instant). Each replica is its own process (as in a
deployment: one Python process uses one core) running the real service path on the whole
response: decode the body of its query's answer (``range_result``, as the source decodes it;
``json.loads`` for a commit before it), parse it, attribute, validate, encode each shard's
batches and publish them through the publish window. The decode is timed (bench/ingest.py
starts from the decoded response): what a replica's answer holds is what sharding changes. A
replica (``FRACPILOT_INGEST_SHARDS``, each holding an equal share: the leases are not timed)
gets the series Prometheus answers its query with, those whose UUID matches its shards'
regex (``CyclePlan.uuid_regex``); a commit before the query carried it gets the whole response
and cuts it (``CyclePlan.of_shards``), as that code did. The replicas start together (a
barrier before each cycle); a cycle's time is the slowest replica's, its rate all samples
stored over that time. Rows, each on a fresh nats-server (``--cluster``: three routed on
loopback, R3 streams):

- one ingest, unsharded (today);
- one replica holding every shard (what sharding costs a replica: smaller batches);
- ``--replicas`` replicas, the shards split evenly.

``--cycles N``: each replica process runs N cycles, the same GPUs an interval apart (as a
deployed replica does, cycle after cycle). The first cycle of a fresh process is printed
alone (each GPU's shard hashed for the first time, the process's first batches); the cycles
after it are a replica's steady state, the best of them printed too. ``--compare REV``: the
same rows with that commit's libs and ingest (``git archive``, imported by the replica
processes in place of this tree's), interleaved with this build's.

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
import subprocess
import sys
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

# Nothing of fracpilot is imported at the top: a replica process imports it once its code
# (this tree's, or --compare's) is first on its path.
BENCH = str(Path(__file__).resolve().parent)
INTERVAL = 15.0

Cycle = tuple[int, float, float]  # samples sent, seconds, CPU seconds


async def replica_path(
    url: str, workloads: int, at: float, shards: int, mine: list[int], barrier: Barrier,
    cycles: int,
) -> list[Cycle]:  # fmt: skip
    """One replica's reading of the whole response, ``cycles`` times (an interval apart):
    each cycle's samples sent, seconds, CPU seconds."""
    import contextlib
    import inspect
    import json
    import re

    from ingest import prometheus_response, range_result

    from fracpilot_ingest.service import IngestService
    from fracpilot_ingest.settings import IngestSettings
    from fracpilot_ingest.shard_plan import plan_cycle
    from fracpilot_libs.gc_pause import gc_paused
    from fracpilot_libs.usage.attribution import GpuInventory
    from fracpilot_libs.usage.range_queries import points_by_instant

    settings = IngestSettings(
        nats={"url": url}, sources="prometheus", cluster="bench", usage_view=False,
        ingest={"shards": shards},
    )  # fmt: skip
    service = IngestService(settings)
    await service.runtime.bus.connect()
    await service.runtime.bus.ensure_streams()
    plan = plan_cycle(shards, mine, {}, fallback=0.0)
    keep = plan.kept if shards > 1 else None
    # This build asks Prometheus for its shards' series (None: it holds every shard); a
    # commit before that asked for all and cut them.
    by_query = hasattr(plan, "uuid_regex")
    one_pause = hasattr(service, "_publish_reading")
    labels: tuple[str, ...] = ()
    if not by_query:  # the labels a commit before cut the answer by
        from fracpilot_ingest.shard_plan import gpu_uuid_labels

        labels = gpu_uuid_labels(service.table)
    regex = re.compile(plan.uuid_regex()) if by_query and not plan.holds_all else None
    # As the source hands the decoded response over (a commit before ``owned``: copied).
    owned = {"owned": True} if "owned" in inspect.signature(points_by_instant).parameters else {}
    timed = []
    for k in range(cycles):
        # Made before each cycle (not timed), the last one dropped: one response alive, as in
        # a replica between its readings (a collection's work grows with what is alive).
        response = None
        result = prometheus_response(workloads, at + k * INTERVAL)
        if regex is not None:  # what Prometheus answers this replica's query with
            result = [s for s in result if regex.fullmatch(s["metric"]["UUID"])]
        body = json.dumps({"data": {"result": result}}).encode()
        del result
        await asyncio.to_thread(barrier.wait)
        start, cpu = time.perf_counter(), time.process_time()
        sent = 0
        # The collector paused as the service pauses it: over the whole reading, freed inside
        # (this build); a commit before: over the parse (the source's fetch), then over the
        # publishing, the reading freed after the cycle (its collections then outside this
        # clock).
        with gc_paused() if one_pause else contextlib.nullcontext():
            with gc_paused():
                # Decoded from its bytes as the source decodes them (range_result; json.loads
                # for a commit before it), so its strings are the objects the source's are.
                response = range_result(body)
                if by_query or shards <= 1:  # as the source: the answer's own labels
                    instants = points_by_instant(response, **owned)
                else:  # a commit before: the whole answer cut, the share's labels copied
                    instants = points_by_instant(plan.of_shards(response, labels))
                response = None
            with gc_paused():
                for points in instants.values():
                    inventory = GpuInventory()
                    sent += await service.publish_instant(
                        "prometheus", points, inventory, keep=keep
                    )
            if one_pause:
                instants = points = None
        timed.append((sent, time.perf_counter() - start, time.process_time() - cpu))
        instants = points = None
    await service.runtime.bus.close()
    return timed


def _replica(
    code: list[str], url: str, workloads: int, at: float, shards: int, mine: list[int],
    barrier: Barrier, cycles: int,
) -> list[Cycle]:  # fmt: skip
    sys.path[:0] = [*code, BENCH]
    logging.basicConfig(level=logging.ERROR)
    return asyncio.run(replica_path(url, workloads, at, shards, mine, barrier, cycles))


async def streams(url: str) -> None:
    """The streams made once, before the replicas (at R3 two replicas creating them at once
    on a cluster just started timed out now and then); theirs then finds them made."""
    from fracpilot_ingest.service import IngestService
    from fracpilot_ingest.settings import IngestSettings

    settings = IngestSettings(nats={"url": url}, sources="prometheus", cluster="bench")
    bus = IngestService(settings).runtime.bus
    await bus.connect()
    await bus.ensure_streams()
    await bus.close()


def one_run(
    code: list[str], cluster: bool, workloads: int, at: float, shards: int,
    owned: list[list[int]], cycles: int,
) -> list[Cycle]:  # fmt: skip
    """The replicas (one per entry of ``owned``) in processes of their own, on a fresh
    server; for each cycle: samples sent by all, the slowest replica's seconds and the most
    CPU seconds one replica used."""
    from ingest import nats_under_test

    ctx = mp.get_context("spawn")
    with nats_under_test(cluster) as url, ctx.Manager() as manager:
        asyncio.run(streams(url))
        barrier = manager.Barrier(len(owned))
        with ctx.Pool(len(owned)) as pool:
            results = pool.starmap(
                _replica,
                [(code, url, workloads, at, shards, mine, barrier, cycles) for mine in owned],
            )
    return [
        (sum(r[0] for r in cycle), max(r[1] for r in cycle), max(r[2] for r in cycle))
        for cycle in zip(*results, strict=True)
    ]


def unpacked(rev: str, into: str) -> list[str]:
    """Commit ``rev``'s libs and services, unpacked into ``into``: the paths to import."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "libs/src", "services"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return [f"{into}/libs/src", *(str(p) for p in sorted(Path(into, "services").glob("*/src")))]


def table(title: str, runs: dict[str, list[Cycle]]) -> None:
    print(title)
    print(
        f"{'path':<46}{'samples':>8}{'wall s':>8}{'samples/s':>11}{'vs one':>8}"
        f"{'CPU s':>7}{'vs one':>8}"
    )
    # "CPU s": the busiest replica's own CPU time; one over it is the speed-up on cores of
    # their own (a quiet box), which the wall time on a shared box cannot show.
    best = {what: min(r, key=lambda run: run[1]) for what, r in runs.items()}
    cpu = {what: min(run[2] for run in r) for what, r in runs.items()}
    for what, (n, seconds, _) in best.items():
        build = what[: what.index(": ") + 2] if ": " in what else ""  # --compare's rows: "REV: "
        one = f"{build}one ingest, unsharded (today)"
        rate, base = n / seconds, best[one][0] / best[one][1]
        print(
            f"{what:<46}{n:>8}{seconds:>8.2f}{rate:>11,.0f}{rate / base:>8.2f}"
            f"{cpu[what]:>7.2f}{cpu[one] / cpu[what]:>8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--cluster", action="store_true", help="a three-node cluster (R3)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=1, help="cycles per replica process")
    parser.add_argument("--compare", metavar="REV", help="that commit's code too, interleaved")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, BENCH)
    at = float(int(time.time()))
    every = list(range(args.shards))
    split = [every[r :: args.replicas] for r in range(args.replicas)]
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        builds = [("", [])] + ([(f"{args.compare}: ", unpacked(args.compare, tmp))]
                               if args.compare else [])  # fmt: skip
        rows = [
            (f"{build}{what}", code, shards, owned)
            for build, code in builds
            for what, shards, owned in (
                ("one ingest, unsharded (today)", 0, [every]),
                (f"one replica holding all {args.shards} shards", args.shards, [every]),
                (f"{args.replicas} replicas, {args.shards} shards split", args.shards, split),
            )
        ]
        where = "three-node cluster, R3" if args.cluster else "one server, R1"
        load_before = os.getloadavg()
        runs: dict[str, list[list[Cycle]]] = {what: [] for what, *_ in rows}
        for _ in range(args.repeat):  # interleaved: each row sees the box as busy as the others
            for what, code, shards, owned in rows:
                runs[what].append(
                    one_run(code, args.cluster, args.workloads, at, shards, owned, args.cycles)
                )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    before = " ".join(f"{x:.2f}" for x in load_before)
    print(
        f"{args.workloads} GPUs, one instant a cycle; {where}; {os.cpu_count()} cores; "
        f"load {before} before, {load} after; best of {args.repeat}, interleaved"
    )
    table("first cycle of a fresh process:", {w: [r[0] for r in rs] for w, rs in runs.items()})
    if args.cycles > 1:
        table(
            f"steady state (cycles 2-{args.cycles} of each process, the best):",
            {w: [c for r in rs for c in r[1:]] for w, rs in runs.items()},
        )


if __name__ == "__main__":
    main()
