"""What a fraction held costs and whether usage overran it: the one account behind
``fracpilot replay``, ``fracpilot report`` and the demo's summary.

A sample stands for some seconds held at a fraction of a whole GPU: it adds that many
GPU-hours held against as many whole GPU-hours, and it is an overrun when its compute or its
memory share is above the fraction (a sample exactly at it is not). Money is GPU-hours times the
GPU model's hourly price (:mod:`fracpilot_libs.pricing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from fracpilot_libs.contracts import WorkloadRef

EPS = 1e-9  # float noise: usage this close to the fraction is at it, not above
DEFAULT_STEP_S = 60.0  # what a lone sample stands for
GAP_CAP_STEPS = 5  # a gap in a series counts for at most this many median steps


def overruns(usage: float, held: float) -> bool:
    """Whether a share in use (compute, or memory of the device) is above the fraction held."""
    return usage > held + EPS


def sample_intervals(times: list[float]) -> list[float]:
    """Seconds each sample of a series stands for (``times`` in order, unix seconds): until the
    next one, gaps capped at 5 median steps; the last one (and a lone one) a median step."""
    if len(times) < 2:
        return [DEFAULT_STEP_S] * len(times)
    steps = [b - a for a, b in pairwise(times)]
    median = sorted(steps)[len(steps) // 2] or DEFAULT_STEP_S
    cap = GAP_CAP_STEPS * median
    return [min(s, cap) for s in steps] + [median]


@dataclass
class Metrics:
    """GPU-hours held against whole GPUs, their cost, overruns and resizes, for one workload or
    in total (:meth:`add`)."""

    samples: int = 0
    workloads: int = 0
    fraction_hours: float = 0.0
    whole_gpu_hours: float = 0.0
    compute_overrun_samples: int = 0
    memory_overrun_samples: int = 0
    resizes: int = 0
    longest_overrun_s: float = 0.0
    allocated_cost_usd: float = 0.0
    whole_cost_usd: float = 0.0
    # the overrun going on at the last sample recorded, seconds (not a figure of its own)
    _overrun_s: float = field(default=0.0, init=False, repr=False, compare=False)

    def record(
        self,
        held: float,
        compute: float,
        memory_share: float,
        seconds: float,
        usd_per_gpu_hour: float | None = None,
    ) -> tuple[bool, bool]:
        """One sample held at ``held`` for ``seconds``: its GPU-hours and overruns, and with a
        price its cost (a series of one GPU model may be priced once instead: :meth:`price`).
        Returns whether compute and memory overran."""
        self.samples += 1
        held_hours = held * seconds / 3600
        whole_hours = seconds / 3600
        self.fraction_hours += held_hours
        self.whole_gpu_hours += whole_hours
        if usd_per_gpu_hour is not None:
            self.allocated_cost_usd += held_hours * usd_per_gpu_hour
            self.whole_cost_usd += whole_hours * usd_per_gpu_hour
        compute_over = overruns(compute, held)
        memory_over = overruns(memory_share, held)
        self.compute_overrun_samples += compute_over
        self.memory_overrun_samples += memory_over
        self._overrun_s = self._overrun_s + seconds if (compute_over or memory_over) else 0.0
        self.longest_overrun_s = max(self.longest_overrun_s, self._overrun_s)
        return compute_over, memory_over

    def price(self, usd_per_gpu_hour: float) -> None:
        """The cost of every GPU-hour recorded, at one hourly price."""
        self.allocated_cost_usd = self.fraction_hours * usd_per_gpu_hour
        self.whole_cost_usd = self.whole_gpu_hours * usd_per_gpu_hour

    @property
    def saved_gpu_hours(self) -> float:
        return self.whole_gpu_hours - self.fraction_hours

    @property
    def cost_saved_usd(self) -> float:
        return self.whole_cost_usd - self.allocated_cost_usd

    @property
    def savings_pct(self) -> float:
        if not self.whole_gpu_hours:
            return 0.0
        return 100.0 * (1 - self.fraction_hours / self.whole_gpu_hours)

    @property
    def compute_overrun_pct(self) -> float:
        return 100.0 * self.compute_overrun_samples / self.samples if self.samples else 0.0

    @property
    def memory_overrun_pct(self) -> float:
        return 100.0 * self.memory_overrun_samples / self.samples if self.samples else 0.0

    @property
    def resizes_per_workload_day(self) -> float:
        days = self.whole_gpu_hours / 24
        return self.resizes / days if days else 0.0

    def add(self, other: Metrics) -> None:
        self.samples += other.samples
        self.workloads += other.workloads
        self.fraction_hours += other.fraction_hours
        self.whole_gpu_hours += other.whole_gpu_hours
        self.compute_overrun_samples += other.compute_overrun_samples
        self.memory_overrun_samples += other.memory_overrun_samples
        self.resizes += other.resizes
        self.allocated_cost_usd += other.allocated_cost_usd
        self.whole_cost_usd += other.whole_cost_usd
        self.longest_overrun_s = max(self.longest_overrun_s, other.longest_overrun_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "workloads": self.workloads,
            "fraction_hours": round(self.fraction_hours, 4),
            "whole_gpu_hours": round(self.whole_gpu_hours, 4),
            "savings_pct": round(self.savings_pct, 3),
            "compute_overrun_pct": round(self.compute_overrun_pct, 4),
            "memory_overrun_samples": self.memory_overrun_samples,
            "memory_overrun_pct": round(self.memory_overrun_pct, 4),
            "resizes": self.resizes,
            "resizes_per_workload_day": round(self.resizes_per_workload_day, 3),
            "longest_overrun_s": round(self.longest_overrun_s, 1),
            "allocated_cost_usd": round(self.allocated_cost_usd, 2),
            "whole_cost_usd": round(self.whole_cost_usd, 2),
            "cost_saved_usd": round(self.cost_saved_usd, 2),
        }


@dataclass
class WorkloadAccount:
    """One workload's account over a series: its metrics, the fraction it ended on, and
    (unix time, compute, memory share, fraction in force) per sample when kept (plots)."""

    workload: WorkloadRef
    metrics: Metrics
    final_fraction: float
    timeline: list[tuple[float, float, float, float]] = field(default_factory=list)
