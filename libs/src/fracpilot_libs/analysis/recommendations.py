"""What ``fracpilot recommend`` prints: each workload's history replayed through the engine, as
``fracpilot replay`` replays a trace (:func:`fracpilot_libs.analysis.replay.replay`, the same
sizer), and the fraction it ends on is the recommendation.

Per workload: the fraction recommended, the peaks it rests on (compute share, memory bytes and
share of the device), the fraction held (a whole GPU unless the history says otherwise), the
GPU-hours the engine would have saved over the history, and what holding the recommendation
saves per month. For the whole set: the cards the workloads hold now and the cards their
recommended fractions fit on (first-fit decreasing over memory and compute shares), so the
cards packing would free; and the nodes: those holding the workloads now, and the nodes those
cards fill at the most cards a node of that GPU model was seen with (None when the history
names no nodes). Pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.packing_bound import ffd_cards_2d
from fracpilot_libs.analysis.replay import Progress, ReplayReport, replay
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import Policy, UsageSample, WorkloadRef
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.isolation_policies import sizing_policy

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Recommendation:
    workload: WorkloadRef
    recommended_fraction: float
    held_fraction: float
    compute_peak: float  # share of a whole GPU
    memory_peak_bytes: int
    memory_peak_share: float  # of the device
    memory_total_bytes: int
    gpu_model: str
    samples: int
    pods: int
    gpus: int  # distinct GPUs the workload's pods were seen on
    mode: str  # enforced (HAMi-core's memory limit) or unknown (Prometheus does not say)
    saved_pct: float  # GPU-hours the engine would have saved over the history
    saved_gpu_hours: float
    monthly_saving_usd: float  # held minus recommended, for a month, at the model's price

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.workload.namespace,
            "workload": self.workload.owner_name,
            "kind": self.workload.owner_kind,
            "recommended_fraction": self.recommended_fraction,
            "held_fraction": self.held_fraction,
            "compute_peak": round(self.compute_peak, 4),
            "memory_peak_bytes": self.memory_peak_bytes,
            "memory_peak_share": round(self.memory_peak_share, 4),
            "memory_total_bytes": self.memory_total_bytes,
            "gpu_model": self.gpu_model,
            "samples": self.samples,
            "pods": self.pods,
            "gpus": self.gpus,
            "mode": self.mode,
            "saved_pct": round(self.saved_pct, 3),
            "saved_gpu_hours": round(self.saved_gpu_hours, 4),
            "monthly_saving_usd": round(self.monthly_saving_usd, 2),
        }


@dataclass(frozen=True)
class Recommendations:
    workloads: list[Recommendation]
    replay: ReplayReport
    cards_held: int  # distinct GPUs in the workloads' last samples
    cards_packed: int  # the recommended fractions packed first-fit decreasing
    nodes_held: int | None = None  # distinct nodes in the last samples; None: no node named
    nodes_packed: int | None = None  # the packed cards on nodes of the model's size

    @property
    def cards_freed(self) -> int:
        return max(0, self.cards_held - self.cards_packed)

    @property
    def nodes_freed(self) -> int | None:
        if self.nodes_held is None or self.nodes_packed is None:
            return None
        return max(0, self.nodes_held - self.nodes_packed)

    def as_dict(self) -> dict[str, Any]:
        totals = self.replay.totals
        return {
            "workloads": [w.as_dict() for w in self.workloads],
            "totals": {
                "workloads": len(self.workloads),
                "samples": totals.samples,
                "saved_pct": round(totals.savings_pct, 3),
                "saved_gpu_hours": round(totals.whole_gpu_hours - totals.fraction_hours, 4),
                "monthly_saving_usd": round(sum(w.monthly_saving_usd for w in self.workloads), 2),
                "cards_held": self.cards_held,
                "cards_packed": self.cards_packed,
                "cards_freed": self.cards_freed,
                "nodes_held": self.nodes_held,
                "nodes_packed": self.nodes_packed,
                "nodes_freed": self.nodes_freed,
            },
        }


def trace_points(samples: Sequence[UsageSample]) -> list[TracePoint]:
    """Samples as the replay's trace points (the fraction held: as the samples say, else a
    whole GPU, as a trace without ``requested_fraction``)."""
    requested = next((s.allocated_fraction for s in samples if s.allocated_fraction), None)
    return [TracePoint(s, requested) for s in samples]


def recommend(
    history: Mapping[str, Sequence[UsageSample]],
    policy: Policy,
    prices: GpuPrices | None = None,
    enforced_pods: AbstractSet[tuple[str, str]] = frozenset(),
    progress: Progress | None = None,
) -> Recommendations:
    """Each workload's samples (in time order) replayed through the engine under ``policy``."""
    prices = prices or GpuPrices()
    groups = {key: trace_points(series) for key, series in history.items() if series}
    sizer = EngineSizer(sizing_policy(policy))  # as the decision service sizes with it
    report = replay(groups, lambda: sizer, progress=progress, prices=prices)
    out = []
    last_gpus: set[str] = set()
    for account in report.workloads:
        series = history[account.workload.key]
        peak = max(series, key=lambda s: s.memory_share)
        held = groups[account.workload.key][0].requested_fraction or 1.0
        hourly = prices.hourly(series[0].gpu_model)
        last_at = series[-1].timestamp
        last_gpus |= {s.gpu_uuid for s in series if s.timestamp == last_at}
        pods = {s.pod for s in series}
        m = account.metrics
        out.append(
            Recommendation(
                workload=account.workload,
                recommended_fraction=account.final_fraction,
                held_fraction=held,
                compute_peak=max(s.compute for s in series),
                memory_peak_bytes=peak.memory_used_bytes,
                memory_peak_share=peak.memory_share,
                memory_total_bytes=series[-1].memory_total_bytes,
                gpu_model=series[-1].gpu_model,
                samples=len(series),
                pods=len(pods),
                gpus=len({s.gpu_uuid for s in series}),
                mode=_mode(account.workload, pods, enforced_pods),
                saved_pct=m.savings_pct,
                saved_gpu_hours=m.whole_gpu_hours - m.fraction_hours,
                monthly_saving_usd=(held - account.final_fraction) * hourly * HOURS_PER_MONTH,
            )
        )
    packed = _packed_cards(out, history)
    nodes_held, nodes_packed = _nodes(history, packed)
    return Recommendations(
        out, report, len(last_gpus), sum(packed.values()), nodes_held, nodes_packed
    )


def _mode(workload: WorkloadRef, pods: set[str], enforced: AbstractSet[tuple[str, str]]) -> str:
    """``enforced``: a container's own numbers (HAMi-core, which limits its memory); otherwise
    Prometheus does not say whether a scheduler only accounts the share (KAI) or holds whole
    GPUs."""
    if any((workload.namespace, pod) in enforced for pod in pods):
        return "enforced"
    return "unknown"


def _nodes(
    history: Mapping[str, Sequence[UsageSample]], packed: Mapping[str, int]
) -> tuple[int | None, int | None]:
    """(nodes holding the workloads' last samples, nodes the packed cards fill): a model's
    cards on nodes of the most cards a node of that model was seen with. (None, None) when a
    sample names no node (the exporter's Hostname label missing)."""
    cards_on: dict[tuple[str, str], set[str]] = defaultdict(set)  # (model, node) -> GPUs
    held: set[str] = set()
    for series in history.values():
        if not series:
            continue
        if any(not s.node for s in series):
            return None, None
        last_at = series[-1].timestamp
        held |= {s.node for s in series if s.timestamp == last_at}
        for s in series:
            cards_on[s.gpu_model, s.node].add(s.gpu_uuid)
    per_node: dict[str, int] = defaultdict(int)
    for (model, _node), gpus in cards_on.items():
        per_node[model] = max(per_node[model], len(gpus))
    return len(held), sum(-(-cards // per_node[model]) for model, cards in packed.items())


def _packed_cards(
    recommendations: Sequence[Recommendation], history: Mapping[str, Sequence[UsageSample]]
) -> dict[str, int]:
    """Cards the recommended fractions need, per GPU model (a card holds 1.0 of memory and of
    compute; each pod of a workload holds the workload's fraction)."""
    by_model: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in recommendations:
        series = history[r.workload.key]
        last_at = series[-1].timestamp
        replicas = len({s.pod for s in series if s.timestamp == last_at})
        f = r.recommended_fraction
        by_model[r.gpu_model].extend([(f, f)] * replicas)
    return {model: ffd_cards_2d(items) for model, items in by_model.items()}
