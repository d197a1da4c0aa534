"""Replay a usage trace through a sizer and measure what would have happened.

Each workload is replayed on its own, in time order: a sample is judged against the allocation
in force (:mod:`fracpilot_libs.analysis.accounting`), then shown to the sizer, and a new fraction
applies from the next sample on. The same engine as the decision service's runs here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fracpilot_libs.analysis.accounting import Metrics, WorkloadAccount, sample_intervals
from fracpilot_libs.analysis.baselines import Sizer
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.kv_memory import PoolLearning, kv_sizing


@dataclass
class ReplayReport:
    totals: Metrics
    workloads: list[WorkloadAccount]

    def top(self, n: int) -> list[WorkloadAccount]:
        """The n workloads with the most GPU-hours allocated (ties by workload key)."""
        ranked = sorted(self.workloads, key=lambda w: (-w.metrics.fraction_hours, w.workload.key))
        return ranked[:n]

    def as_dict(self) -> dict[str, Any]:
        return {
            "totals": self.totals.as_dict(),
            "workloads": [
                {
                    **w.metrics.as_dict(),
                    "namespace": w.workload.namespace,
                    "workload": w.workload.owner_name,
                    "final_fraction": w.final_fraction,
                }
                for w in self.workloads
            ],
        }


class Progress(Protocol):
    def __call__(self, advance: int) -> None: ...


def replay_workload(
    series: list[TracePoint],
    sizer: Sizer,
    keep_timeline: bool = False,
    usd_per_gpu_hour: float = 0.0,
) -> WorkloadAccount:
    times = [p.sample.timestamp.timestamp() for p in series]
    alloc = sizer.initial(series[0].requested_fraction)
    state = sizer.start()
    m = Metrics(workloads=1)
    timeline: list[tuple[float, float, float, float]] = []
    learning = PoolLearning()  # a KV pool's bytes per token, learned as the engine does
    for point, at, dt in zip(series, times, sample_intervals(times), strict=True):
        s = point.sample
        # What the pod needs: a preallocating LLM server's fixed part + used KV, not its flat
        # preallocation (sizing/kv_memory.py); the memory in use for every other pod.
        sized = kv_sizing(s, learning)
        if sized is None:
            memory = s.memory_share
        else:
            need, learning = sized
            memory = need.need_bytes / s.memory_total_bytes
        m.record(alloc, s.compute, memory, dt)
        if keep_timeline:
            timeline.append((at, s.compute, memory, alloc))
        state, new = sizer.step(state, s.model_copy(update={"allocated_fraction": alloc}))
        if new is not None and not math.isclose(new, alloc):
            alloc = new
            m.resizes += 1
    m.price(usd_per_gpu_hour)
    return WorkloadAccount(series[0].sample.workload, m, alloc, timeline)


def replay(
    groups: dict[str, list[TracePoint]],
    sizer_factory: Callable[[], Sizer],
    progress: Progress | None = None,
    keep_timeline: bool = False,
    prices: GpuPrices | None = None,
) -> ReplayReport:
    """Every workload replayed on its own; GPU-hours priced by each workload's GPU model."""
    prices = prices or GpuPrices()
    totals = Metrics()
    results = []
    for key in sorted(groups):
        hourly = prices.hourly(groups[key][0].sample.gpu_model)
        result = replay_workload(groups[key], sizer_factory(), keep_timeline, hourly)
        totals.add(result.metrics)
        results.append(result)
        if progress is not None:
            progress(len(groups[key]))
    return ReplayReport(totals, results)
