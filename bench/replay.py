"""Replay time on one core: unpacked against packed (``fracpilot replay --pack``), side by side.

Usage: python bench/replay.py [--trace PATH] [--repeat N]

The trace is parsed once; then, for fracpilot and the VPA-style baseline, the unpacked replay
(each workload on its own) and the packed one (every workload in time order, placed on cards by
the actuator's planner, card-hours and contention accounted) run on it. Printed: seconds,
samples/s and packed / unpacked as a ratio. ``fracpilot replay --pack`` must finish the GenAI
trace in under 30 s, reading included.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from pathlib import Path

from fracpilot_libs.analysis.baselines import EngineSizer, Sizer, VpaSizer
from fracpilot_libs.analysis.packing_replay import replay_packed
from fracpilot_libs.analysis.replay import replay
from fracpilot_libs.analysis.trace import TracePoint, group_by_workload, read_trace
from fracpilot_libs.contracts import Policy

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/data/genai_public.csv.gz"


def best_of(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    start = time.perf_counter()
    groups: dict[str, list[TracePoint]] = group_by_workload(read_trace(args.trace))
    reading = time.perf_counter() - start
    n = sum(len(s) for s in groups.values())
    print(
        f"trace: {args.trace.name}, {n} samples, {len(groups)} workloads, read in {reading:.2f} s"
    )
    print(f"best of {args.repeat}, one core")
    print(f"{'sizer':<11}{'unpacked s':>11}{'packed s':>10}{'packed/s':>12}{'packed/unpacked':>17}")
    sizers: list[Sizer] = [EngineSizer(Policy()), VpaSizer()]
    for sizer in sizers:

        def unpacked_run(s: Sizer = sizer) -> object:
            return replay(groups, lambda: s)

        def packed_run(s: Sizer = sizer) -> object:
            return replay_packed(groups, s)

        unpacked = best_of(args.repeat, unpacked_run)
        packed = best_of(args.repeat, packed_run)
        print(
            f"{sizer.name:<11}{unpacked:>11.2f}{packed:>10.2f}{n / packed:>12,.0f}"
            f"{packed / unpacked:>17.2f}"
        )


if __name__ == "__main__":
    main()
