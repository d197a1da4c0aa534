"""An ingest's CPU a cycle over many cycles, the collector's work included: this build beside
another commit's, each in a process of its own.

Usage: python bench/ingest_cycles.py [--workloads 100000] [--cycles 6] [--cluster]
                                     [--compare REV] [--repeat 1]

bench/ingest.py times a cycle from the response's bytes to the last acknowledgement; a
collection the cycle leaves for later (the cyclic collector walking what is still alive when
a pause ends) falls after its clock, and it times two cycles of a new process. Here a process
runs ``--cycles`` cycles of the same GPUs an interval apart (bench/ingest.py's response, its
bodies made before the first cycle), each as that build's reading loop runs it
(``bench/ingest.py``'s ``service_cycle``: its pauses of the collector), then what the service
does between two readings: a scrape of its metrics (``generate_latest``, as Prometheus scrapes
an ingest) and a short sleep. Per cycle: the cycle's wall seconds, the process's CPU seconds
from its start to the next cycle's (so the collections it left are counted with it), and the
collector's own seconds in them (``gc.callbacks``). Each build on a fresh server (``--cluster``:
three routed on loopback, R3 streams). ``--compare REV``: that commit's libs and services
(``git archive``), first on the path of its process. ``--repeat k``: the builds k times,
alternating; the medians of cycles 2 on are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Nothing of fracpilot is imported at the top: a process imports it once its build's code is
# first on its path.
BENCH = str(Path(__file__).resolve().parent)
INTERVAL = 15.0

Cycle = tuple[int, float, float, float]  # samples sent, wall s, CPU s to the next, collector s


async def cycles_of(url: str, workloads: int, cycles: int, at: float) -> list[Cycle]:
    import gc

    from ingest import prometheus_response, service_cycle
    from prometheus_client import generate_latest

    from fracpilot_ingest.service import IngestService
    from fracpilot_ingest.settings import IngestSettings

    settings = IngestSettings(
        nats={"url": url}, sources="prometheus", cluster="bench", interval_s=INTERVAL,
        usage_view=False,
    )  # fmt: skip
    service = IngestService(settings)
    await service.runtime.bus.connect()
    await service.runtime.bus.ensure_streams()
    bodies = [
        json.dumps({"data": {"result": prometheus_response(workloads, at + k * INTERVAL)}}).encode()
        for k in range(cycles)
    ]
    gc.collect()
    collector = [0.0]
    began = [0.0]

    def note(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.process_time()
        else:
            collector[0] += time.process_time() - began[0]

    gc.callbacks.append(note)
    out: list[Cycle] = []
    cpu = time.process_time()
    for k in range(cycles):
        collector[0] = 0.0
        start = time.perf_counter()
        body, bodies[k] = bodies[k], b""
        sent = await service_cycle(service, body, {"wait": False})
        wall = time.perf_counter() - start
        del body
        # Between two readings: Prometheus scrapes the ingest, the loop sleeps.
        generate_latest(service.runtime.registry)
        await asyncio.sleep(0.3)
        now = time.process_time()
        out.append((sent, wall, now - cpu, collector[0]))
        cpu = now
    gc.callbacks.remove(note)
    await service.runtime.bus.close()
    return out


def _process(code: list[str], cluster: bool, workloads: int, cycles: int, at: float) -> list[Cycle]:
    sys.path[:0] = [*code, BENCH]
    logging.basicConfig(level=logging.ERROR)
    from ingest import nats_under_test

    with nats_under_test(cluster) as url:
        return asyncio.run(cycles_of(url, workloads, cycles, at))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--cluster", action="store_true", help="a three-node cluster (R3)")
    parser.add_argument("--compare", metavar="REV", help="that commit's code too, alternated")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    at = float(int(time.time()))
    ctx = mp.get_context("spawn")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs: dict[str, list[list[Cycle]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cycles-") as tmp:
        from ingest_replicas import unpacked  # this script's folder is first on the path

        builds = [("this build", [])]
        if args.compare:
            builds.append((args.compare, unpacked(args.compare, tmp)))
        for _ in range(args.repeat):
            for name, code in builds:
                with ctx.Pool(1) as pool:
                    run = pool.apply(
                        _process, (code, args.cluster, args.workloads, args.cycles, at)
                    )
                runs.setdefault(name, []).append(run)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    where = "three-node cluster, R3" if args.cluster else "one server, R1"
    print(
        f"{args.workloads} GPUs a cycle, {args.cycles} cycles a process; {where}; "
        f"load {load_before} before, {load} after; {args.repeat} run(s) a build, alternated"
    )
    print(f"{'build':<14}{'run':>4}  cycle: wall s / CPU s to the next / collector s")
    for name, rs in runs.items():
        for i, run in enumerate(rs):
            cells = "  ".join(f"{w:.2f}/{c:.2f}/{g:.2f}" for _, w, c, g in run)
            print(f"{name:<14}{i + 1:>4}  {cells}")
    print(
        f"{'build':<14}{'cycles 2 on (median)':>22}{'CPU s':>8}{'collector s':>13}{'samples/s':>11}"
    )
    medians = {}
    for name, rs in runs.items():
        later = [c for run in rs for c in run[1:]]
        cpu = statistics.median(c[2] for c in later)
        collected = statistics.median(c[3] for c in later)
        wall = statistics.median(c[1] for c in later)
        medians[name] = cpu
        print(f"{name:<14}{'':>22}{cpu:>8.2f}{collected:>13.2f}{later[0][0] / wall:>11,.0f}")
    if args.compare:
        ratio = medians[args.compare] / medians["this build"]
        print(f"CPU a cycle, {args.compare} over this build: {ratio:.2f}x")


if __name__ == "__main__":
    main()
