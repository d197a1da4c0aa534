"""What a run did, computed from the usage and actuation streams alone.

Each sample stands for one simulated step at the fraction it reports (a workload not placed yet
holds a whole GPU), priced by its GPU's model; the account is
:mod:`fracpilot_libs.analysis.accounting`, as in ``fracpilot replay`` and ``report``. Cards
(GPUs in use for the pods, cards freed, card-hours) are ``report``'s
(:func:`fracpilot_cli.report.card_use`); the simulated cluster's own state says which of its GPUs
hold no pod (:func:`cluster_cards`), and its autoscaled node group which nodes the simulated
autoscaler added and removed over the run. LLM servers that preallocate (samples whose signals
name the server) count the memory they gave back: what their server preallocates on a GPU of its
own (its flag's default) less what they held (:class:`PreallocatedMemory`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fracpilot_cli.report import CardUse, card_use
from fracpilot_libs.analysis.accounting import Metrics
from fracpilot_libs.contracts import ActuationResult, UsageSample
from fracpilot_libs.llm_servers import FLAGS, LlmServer
from fracpilot_libs.placement.planner import ClusterState
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.usage.mig import card_of

# The key of the simulated cluster's state in subjects.ACTUATOR_STATE_BUCKET: the actuator's
# fracpilot_actuator.simulated.cluster.STATE_KEY (the CLI imports no service).
SIMULATED_CLUSTER_KEY = "simulated-cluster"


@dataclass
class WorkloadView:
    """The latest picture of one workload, for the live table."""

    name: str
    compute: float = 0.0
    memory_share: float = 0.0
    fraction: float | None = None
    node: str = ""
    card: str = ""  # the GPU of its latest sample (a MIG instance's card)
    last_action: str = ""
    last_plan: str = ""  # the latest result's, for the live table's short form
    last_outcome: str = ""
    last_change: str = ""  # "0.5->0.15"
    samples: int = 0
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def cost_saved_usd(self) -> float:
        return self.metrics.cost_saved_usd


GIB = 1024**3


@dataclass
class PreallocatedMemory:
    """GPU memory held by LLM servers that preallocate, in GiB-hours, against what each would
    preallocate on a GPU of its own with its flag's default (vLLM 0.92 of the card, TGI all of
    it; SGLang sizes itself: all of it). Their memory in use is their preallocation, so what
    they hold is what a smaller flag gave back."""

    held_gib_hours: float = 0.0
    alone_gib_hours: float = 0.0
    samples: int = 0

    def add(self, s: UsageSample, step_s: float) -> None:
        server = s.signals.llm_server if s.signals is not None else None
        if server is None:
            return
        alone = FLAGS[LlmServer(server)].default or 1.0
        hours = step_s / 3600
        self.held_gib_hours += s.memory_used_bytes / GIB * hours
        self.alone_gib_hours += alone * s.memory_total_bytes / GIB * hours
        self.samples += 1

    @property
    def released_gib_hours(self) -> float:
        return self.alone_gib_hours - self.held_gib_hours

    @property
    def released_pct(self) -> float:
        if self.alone_gib_hours <= 0:
            return 0.0
        return 100 * self.released_gib_hours / self.alone_gib_hours


@dataclass
class RunSummary:
    step_s: float
    totals: Metrics = field(default_factory=Metrics)
    actions: Counter[str] = field(default_factory=Counter)
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    prices: GpuPrices = field(default_factory=GpuPrices)
    cluster: ClusterCards | None = None  # the simulated cluster's GPUs, read at the end
    preallocated: PreallocatedMemory = field(default_factory=PreallocatedMemory)
    _seen: list[UsageSample] = field(default_factory=list, repr=False)

    @property
    def samples(self) -> int:
        return self.totals.samples

    @property
    def allocated_gpu_hours(self) -> float:
        return self.totals.fraction_hours

    @property
    def whole_gpu_hours(self) -> float:
        return self.totals.whole_gpu_hours

    @property
    def compute_overruns(self) -> int:
        return self.totals.compute_overrun_samples

    @property
    def memory_overruns(self) -> int:
        return self.totals.memory_overrun_samples

    @property
    def allocated_cost_usd(self) -> float:
        return self.totals.allocated_cost_usd

    @property
    def whole_cost_usd(self) -> float:
        return self.totals.whole_cost_usd

    @property
    def cost_saved_usd(self) -> float:
        return self.totals.cost_saved_usd

    @property
    def savings_pct(self) -> float:
        return self.totals.savings_pct

    def add_sample(self, s: UsageSample) -> None:
        view = self.workloads.setdefault(s.workload.key, WorkloadView(s.workload.display))
        view.compute, view.memory_share, view.samples = s.compute, s.memory_share, view.samples + 1
        view.node = s.node or view.node
        view.card = card_of(s.gpu_uuid) if s.gpu_uuid else view.card
        self._seen.append(s)
        if s.allocated_fraction is not None:
            view.fraction = s.allocated_fraction
        held = 1.0 if s.allocated_fraction is None else s.allocated_fraction  # not placed: whole
        hourly = self.prices.hourly(s.gpu_model)
        for metrics in (self.totals, view.metrics):
            metrics.record(held, s.compute, s.memory_share, self.step_s, hourly)
        self.preallocated.add(s, self.step_s)

    def add_result(self, r: ActuationResult) -> None:
        self.actions[f"{r.plan.value}/{r.outcome.value}"] += 1
        view = self.workloads.setdefault(r.workload.key, WorkloadView(r.workload.display))
        arrow = f"{r.fraction_before:g}->{r.fraction_after:g}" if r.fraction_before else ""
        view.last_action = f"{r.plan.value} {arrow} {r.outcome.value}".strip()
        view.last_plan, view.last_outcome, view.last_change = r.plan.value, r.outcome.value, arrow

    @property
    def cards_now(self) -> int:
        """Cards holding the workloads, as their latest samples place them (the live table)."""
        return len({v.card for v in self.workloads.values() if v.card})

    def cards(self) -> CardUse:
        """GPUs in use for the pods at the end, cards freed, card-hours (report's account)."""
        return card_use(self._seen)


@dataclass(frozen=True)
class ClusterCards:
    """The simulated cluster's GPUs and how many hold a pod; its nodes, and those its node
    group added (scale-ups) and removed (the simulated autoscaler, once consolidation emptied
    them)."""

    gpus: int
    with_pods: int
    nodes: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0

    @property
    def without_pods(self) -> int:
        return self.gpus - self.with_pods


def cluster_cards(state: ClusterState, node_group: dict[str, Any] | None = None) -> ClusterCards:
    held = {p.gpu_uuid for p in state.placements}
    group = node_group or {}
    return ClusterCards(
        len(state.gpus),
        sum(g.uuid in held for g in state.gpus),
        nodes=len({g.node for g in state.gpus}),
        nodes_added=len(group.get("added", ())),
        nodes_removed=len(group.get("removed", ())),
    )


def cluster_cards_of(stored: bytes) -> ClusterCards:
    """From the simulated cluster's KV value: ``{"cluster": ..., "applied": [...],
    "node_group": {...}}`` or, as written before it carried the decisions, the cluster
    alone (the node group's fields are the actuator's
    ``fracpilot_actuator.simulated.autoscaler.NodeGroup.as_json``)."""
    body = json.loads(stored)
    state = ClusterState.model_validate(body.get("cluster", body))
    return cluster_cards(state, body.get("node_group") if "cluster" in body else None)
