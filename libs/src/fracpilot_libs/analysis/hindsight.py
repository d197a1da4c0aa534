"""The static per-pod sizing chosen in hindsight: what the engine must beat.

Per workload, the smallest fraction on the policy's grid that covers the whole trace's memory
peak and its compute p95, held from the first sample to the last. No online sizer can know
either number in advance, and it has no headroom at all: it is a bound to beat, not a policy
to run (its compute overruns are 5% of the samples of any pod that compute sizes).
"""

from __future__ import annotations

import math

from fracpilot_libs.analysis.accounting import Metrics
from fracpilot_libs.analysis.baselines import StaticSizer
from fracpilot_libs.analysis.replay import ReplayReport, replay_workload
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import Policy
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import clamp_to_policy

HINDSIGHT_PERCENTILE = 95.0


def hindsight_fraction(series: list[TracePoint], policy: Policy) -> float:
    """The smallest fraction on the grid (within the policy's bounds) that covers the series'
    memory peak and the nearest-rank p95 of its compute."""
    compute = sorted(p.sample.compute for p in series)
    rank = max(1, math.ceil(HINDSIGHT_PERCENTILE / 100 * len(compute)))
    p95 = compute[rank - 1]
    peak = max(p.sample.memory_share for p in series)
    return clamp_to_policy(max(peak, p95), policy)


def replay_hindsight(
    groups: dict[str, list[TracePoint]], policy: Policy, prices: GpuPrices | None = None
) -> ReplayReport:
    """Every workload held at its hindsight fraction, accounted as ``fracpilot replay`` does."""
    prices = prices or GpuPrices()
    totals = Metrics()
    results = []
    for key in sorted(groups):
        series = groups[key]
        sizer = StaticSizer(hindsight_fraction(series, policy), name="hindsight")
        hourly = prices.hourly(series[0].sample.gpu_model)
        result = replay_workload(series, sizer, usd_per_gpu_hour=hourly)
        totals.add(result.metrics)
        results.append(result)
    return ReplayReport(totals, results)
