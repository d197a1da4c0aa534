"""Decision-engine throughput on one core, next to a plain loop over the same samples.

Usage: python bench/engine.py [--trace PATH] [--repeat N]

The samples are parsed and validated once (as the service receives them already decoded);
then, per workload in time order, each sample goes through ``decide`` with the default
policy. The baseline is a plain Python loop that touches the same samples and keeps a
running peak per workload: the floor any per-sample work in Python pays. The engine's
figure must reach 50,000 samples/s.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

from fracpilot_libs.analysis.trace import group_by_workload, read_trace
from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/data/genai_public.csv.gz"


def plain_loop(series: list[list[UsageSample]]) -> float:
    start = time.perf_counter()
    for samples in series:
        peak = 0.0
        for s in samples:
            share = s.memory_used_bytes / s.memory_total_bytes
            if s.compute > peak or share > peak:
                peak = max(peak, s.compute, share)
    return time.perf_counter() - start


def engine_loop(series: list[list[UsageSample]], policy: Policy) -> tuple[float, int]:
    decisions = 0
    start = time.perf_counter()
    for samples in series:
        state = WorkloadState()
        for s in samples:
            state, decision = decide(state, s, policy)
            decisions += decision is not None
    return time.perf_counter() - start, decisions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    groups = group_by_workload(read_trace(args.trace))
    # Allocations as the service sees them: the sample says what the pod holds (1.0 here).
    series = [
        [p.sample.model_copy(update={"allocated_fraction": 1.0}) for p in g]
        for g in groups.values()
    ]
    n = sum(len(s) for s in series)
    policy = Policy()
    gc.collect()
    plain = min(plain_loop(series) for _ in range(args.repeat))
    runs = [engine_loop(series, policy) for _ in range(args.repeat)]
    engine = min(t for t, _ in runs)
    print(
        f"trace: {args.trace.name}, {n} samples, {len(series)} workloads, "
        f"best of {args.repeat}, one core"
    )
    print(f"{'loop':<12}{'seconds':>10}{'samples/s':>14}{'vs plain':>10}")
    print(f"{'plain loop':<12}{plain:>10.3f}{n / plain:>14,.0f}{1.0:>10.2f}")
    print(f"{'engine':<12}{engine:>10.3f}{n / engine:>14,.0f}{engine / plain:>10.2f}")
    print(
        f"decisions: {runs[0][1]}; target 50,000 samples/s: "
        f"{'met' if n / engine >= 50_000 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
