"""What a run did, computed from the usage and actuation streams alone."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fracpilot_libs.contracts import ActuationResult, UsageSample
from fracpilot_libs.pricing import GpuPrices


@dataclass
class WorkloadView:
    """The latest picture of one workload, for the live table."""

    name: str
    compute: float = 0.0
    memory_share: float = 0.0
    fraction: float | None = None
    node: str = ""
    last_action: str = ""
    samples: int = 0
    cost_saved_usd: float = 0.0


@dataclass
class RunSummary:
    step_s: float
    samples: int = 0
    allocated_gpu_hours: float = 0.0
    whole_gpu_hours: float = 0.0
    compute_overruns: int = 0
    memory_overruns: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    prices: GpuPrices = field(default_factory=GpuPrices)
    allocated_cost_usd: float = 0.0
    whole_cost_usd: float = 0.0

    @property
    def cost_saved_usd(self) -> float:
        return self.whole_cost_usd - self.allocated_cost_usd

    @property
    def savings_pct(self) -> float:
        if self.whole_gpu_hours == 0:
            return 0.0
        return 100.0 * (1 - self.allocated_gpu_hours / self.whole_gpu_hours)

    def add_sample(self, s: UsageSample) -> None:
        view = self.workloads.setdefault(s.workload.key, WorkloadView(s.workload.display))
        view.compute, view.memory_share, view.samples = s.compute, s.memory_share, view.samples + 1
        view.node = s.node or view.node
        self.samples += 1
        hours = self.step_s / 3600
        hourly = self.prices.hourly(s.gpu_model)
        self.whole_gpu_hours += hours
        self.whole_cost_usd += hours * hourly
        if s.allocated_fraction is None:  # not placed yet: it holds a whole GPU
            self.allocated_gpu_hours += hours
            self.allocated_cost_usd += hours * hourly
            return
        view.fraction = s.allocated_fraction
        self.allocated_gpu_hours += s.allocated_fraction * hours
        self.allocated_cost_usd += s.allocated_fraction * hours * hourly
        view.cost_saved_usd += (1 - s.allocated_fraction) * hours * hourly
        # Tolerance: a sample exactly at its fraction is not an overrun.
        if s.compute > s.allocated_fraction + 1e-9:
            self.compute_overruns += 1
        if s.memory_share > s.allocated_fraction + 1e-9:
            self.memory_overruns += 1

    def add_result(self, r: ActuationResult) -> None:
        self.actions[f"{r.plan.value}/{r.outcome.value}"] += 1
        view = self.workloads.setdefault(r.workload.key, WorkloadView(r.workload.display))
        arrow = f"{r.fraction_before:g}->{r.fraction_after:g}" if r.fraction_before else ""
        view.last_action = f"{r.plan.value} {arrow} {r.outcome.value}".strip()
