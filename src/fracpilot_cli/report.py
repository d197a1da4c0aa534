"""``fracpilot report``'s pure core: what the fleet used, held, saved and did over a window.

From the usage samples, decisions and actuation results the streams hold for the window:
per workload, usage against the fraction in force over time (a sample's ``allocated_fraction``;
a workload not placed yet holds a whole GPU, as in the demo's summary), GPU-hours held against
whole GPUs, their cost by the GPU's model, overruns (usage above the fraction), the fraction
changes, the decisions and the actions; and the fleet's totals. The account is
:mod:`fracpilot_libs.analysis.accounting`, as in ``fracpilot replay``: each sample stands for the
time until the next one, gaps capped at 5 median steps.

Cards (:func:`card_use`, ``fleet.cards`` in the JSON): which GPUs the pods were on, from the
samples' ``gpu_uuid`` (a MIG instance counts as its card), through replay's packing account
(:class:`fracpilot_libs.analysis.packing.PackedAccount`): card-hours are the hours each card
had a pod on it, whole-card-hours the hours each pod was on a card (one whole GPU each, as
without fractions). At the window's end (the latest sample's instant), ``gpus_whole`` pods are
on cards, which would take as many whole GPUs, and ``gpus_in_use`` cards hold them: the
difference is the cards freed. A sample without a GPU counts as a card of its own.

Consolidation (``consolidation`` in the JSON, None when the window holds none of it): the
actuator's moves over the window (started, verified, failed, plans given up, nodes and GPUs
freed, from ``ConsolidationMove``) and its latest plan in the window (would free N GPUs / M
nodes with K moves, from ``ConsolidationReport``); the cluster's, whatever ``-n`` says.
:meth:`Report.as_dict` is ``report.json``; the HTML shows exactly those numbers.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from fracpilot_cli.status import ConsolidationStatus, MoveTally, consolidation_status, tally_moves
from fracpilot_libs.analysis.accounting import Metrics, WorkloadAccount, sample_intervals
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.contracts import (
    ActuationResult,
    ConsolidationMove,
    ConsolidationReport,
    FractionDecision,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.usage.mig import card_of


def _iso(at: datetime | float | None) -> str | None:
    if at is None:
        return None
    if isinstance(at, float):
        at = datetime.fromtimestamp(at, UTC)
    return at.isoformat()


@dataclass
class CardUse:
    """Cards held over a window and at its end (see the module notes)."""

    account: PackedAccount
    gpus_whole: int = 0  # at the end: pods on a card, a whole GPU each without fractions
    gpus_in_use: int = 0  # at the end: cards with at least one pod on them

    @property
    def cards_freed(self) -> int:
        return max(0, self.gpus_whole - self.gpus_in_use)

    @property
    def card_hours_saved(self) -> float:
        return self.account.whole_card_hours - self.account.card_hours

    def as_dict(self) -> dict[str, Any]:
        a = self.account
        return {
            "gpus_whole": self.gpus_whole,
            "gpus_in_use": self.gpus_in_use,
            "cards_freed": self.cards_freed,
            "card_hours": round(a.card_hours, 4),
            "whole_card_hours": round(a.whole_card_hours, 4),
            "card_hours_saved": round(self.card_hours_saved, 4),
            "card_hours_saved_pct": round(a.card_hours_saved_pct, 3),
            "peak_cards": a.peak_cards,
        }


def card_use(samples: Iterable[UsageSample]) -> CardUse:
    """Who was on which card, slice by slice, into replay's packing account.

    Each pod's sample stands for its interval (:func:`sample_intervals`, per pod); between two
    consecutive interval bounds, the pods then on a card are its tenants."""
    by_pod: dict[str, list[UsageSample]] = defaultdict(list)
    for s in samples:
        by_pod[f"{s.workload.key}/{s.pod}"].append(s)
    # (start, end, pod, card, compute), each pod's intervals back to back
    spans: list[tuple[float, float, str, str, float]] = []
    for pod, series in by_pod.items():
        series.sort(key=lambda s: s.timestamp)
        times = [s.timestamp.timestamp() for s in series]
        for s, at, dt in zip(series, times, sample_intervals(times), strict=True):
            card = card_of(s.gpu_uuid) if s.gpu_uuid else f"no-gpu:{pod}"
            spans.append((at, at + dt, pod, card, s.compute))
    account = PackedAccount(card_memory_bytes=0)
    if not spans:
        return CardUse(account)
    spans.sort()
    latest = max(start for start, *_ in spans)
    bounds = sorted({t for start, end, *_ in spans for t in (start, end)})
    on: dict[str, tuple[float, str, float]] = {}  # pod -> (end, card, compute)
    end_state = (0, 0)
    i = 0
    for at, until in pairwise(bounds):
        on = {pod: held for pod, held in on.items() if held[0] > at}
        while i < len(spans) and spans[i][0] <= at:
            _, end, pod, card, compute = spans[i]
            on[pod] = (end, card, compute)
            i += 1
        cards: dict[str, dict[str, float]] = defaultdict(dict)
        for pod, (_, card, compute) in on.items():
            cards[card][pod] = compute
        account.hold(until - at, cards.values())
        account.in_use(at, len(cards))
        if at <= latest:
            end_state = (len(on), len(cards))
    account.in_use(bounds[-1], 0)
    return CardUse(account, *end_state)


@dataclass
class WorkloadReport:
    workload: WorkloadRef
    gpu_model: str
    usd_per_gpu_hour: float
    replay: WorkloadAccount  # metrics, and (time, compute, memory share, fraction) per sample
    decisions: list[FractionDecision] = field(default_factory=list)
    actions: list[ActuationResult] = field(default_factory=list)

    @property
    def metrics(self) -> Metrics:
        return self.replay.metrics

    def fraction_changes(self) -> list[tuple[float, float, float]]:
        """(unix time, from, to) wherever the fraction in force changed between samples."""
        return [
            (b[0], a[3], b[3])
            for a, b in pairwise(self.replay.timeline)
            if not math.isclose(a[3], b[3])
        ]

    def as_dict(self) -> dict[str, Any]:
        tl = self.replay.timeline
        m = self.metrics
        return {
            "cluster": self.workload.cluster,
            "namespace": self.workload.namespace,
            "workload": self.workload.owner_name,
            "kind": self.workload.owner_kind,
            "gpu_model": self.gpu_model,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            **m.as_dict(),
            "compute_overrun_samples": m.compute_overrun_samples,
            "saved_gpu_hours": round(m.saved_gpu_hours, 4),
            "first_sample_at": _iso(tl[0][0]) if tl else None,
            "last_sample_at": _iso(tl[-1][0]) if tl else None,
            "final_fraction": self.replay.final_fraction,
            "fraction_changes": [
                {"at": _iso(t), "from": a, "to": b} for t, a, b in self.fraction_changes()
            ],
            "decisions": len(self.decisions),
            "decisions_by_direction": dict(
                sorted(Counter(d.direction.value for d in self.decisions).items())
            ),
            "actions": [
                {
                    "decision_id": a.decision_id,
                    "finished_at": _iso(a.finished_at),
                    "plan": a.plan.value,
                    "outcome": a.outcome.value,
                    "fraction_before": a.fraction_before,
                    "fraction_after": a.fraction_after,
                    "detail": a.detail,
                    "error": a.error,
                }
                for a in self.actions
            ],
        }


@dataclass
class Report:
    generated_at: datetime
    since: datetime
    until: datetime
    totals: Metrics
    workloads: list[WorkloadReport]  # see :func:`report_order`
    decisions_by_direction: dict[str, int]
    actions_by_plan: dict[str, int]
    actions_by_outcome: dict[str, int]
    actions_by_plan_outcome: dict[str, int]
    cards: CardUse = field(default_factory=lambda: CardUse(PackedAccount(card_memory_bytes=0)))
    consolidation: ConsolidationAccount | None = None

    def as_dict(self) -> dict[str, Any]:
        t = self.totals
        return {
            "generated_at": self.generated_at.isoformat(),
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "fleet": {
                **t.as_dict(),
                "compute_overrun_samples": t.compute_overrun_samples,
                "saved_gpu_hours": round(t.saved_gpu_hours, 4),
                "decisions": sum(self.decisions_by_direction.values()),
                "decisions_by_direction": self.decisions_by_direction,
                "actions": sum(self.actions_by_plan.values()),
                "actions_by_plan": self.actions_by_plan,
                "actions_by_outcome": self.actions_by_outcome,
                "actions_by_plan_outcome": self.actions_by_plan_outcome,
                "cards": self.cards.as_dict(),
            },
            "consolidation": (
                self.consolidation.as_dict() if self.consolidation is not None else None
            ),
            "workloads": [w.as_dict() for w in self.workloads],
        }


def measure(
    workload: WorkloadRef, samples: list[UsageSample], usd_per_gpu_hour: float
) -> WorkloadAccount:
    """Usage against the fraction in force, sample by sample (``samples`` in time order); a
    sample of a workload not placed yet holds a whole GPU."""
    times = [s.timestamp.timestamp() for s in samples]
    m = Metrics(workloads=1)
    timeline: list[tuple[float, float, float, float]] = []
    previous: float | None = None
    for s, at, dt in zip(samples, times, sample_intervals(times), strict=True):
        held = s.allocated_fraction if s.allocated_fraction is not None else 1.0
        m.record(held, s.compute, s.memory_share, dt)
        if previous is not None and not math.isclose(previous, held):
            m.resizes += 1
        previous = held
        timeline.append((at, s.compute, s.memory_share, held))
    m.price(usd_per_gpu_hour)
    return WorkloadAccount(workload, m, previous if previous is not None else 1.0, timeline)


def report_order(w: WorkloadReport) -> tuple[int, float, str]:
    """Workloads with overruns first, then by GPU-hours held, then by key."""
    m = w.metrics
    overran = m.memory_overrun_samples + m.compute_overrun_samples > 0
    return (0 if overran else 1, -m.fraction_hours, w.workload.key)


@dataclass(frozen=True)
class ConsolidationAccount:
    """Consolidation over a report's window (the module docstring)."""

    moves: MoveTally
    freed_nodes: tuple[str, ...]  # the nodes freed, in order
    plan: ConsolidationStatus | None  # the latest plan reported in the window

    def as_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            **self.moves.as_dict(),
            "freed_node_names": list(self.freed_nodes),
            "modes": list(plan.modes) if plan else [],
            "would_free_gpus": plan.would_free_gpus if plan else 0,
            "would_free_nodes": plan.would_free_nodes if plan else 0,
            "would_move": plan.move_count if plan else 0,
            "reported_at": _iso(plan.reported_at) if plan else None,
        }


def consolidation_account(
    reports: Iterable[ConsolidationReport], moves: Iterable[ConsolidationMove], until: datetime
) -> ConsolidationAccount | None:
    """None when the window holds no report and no move."""
    moves = sorted(moves, key=lambda m: m.at)
    plan = consolidation_status(reports, (), until)
    if plan is None and not moves:
        return None
    return ConsolidationAccount(
        moves=tally_moves(moves),
        freed_nodes=tuple(m.freed_node for m in moves if m.freed_node),
        plan=plan,
    )


def build_report(
    samples: Iterable[UsageSample],
    decisions: Iterable[FractionDecision],
    results: Iterable[ActuationResult],
    prices: GpuPrices,
    since: datetime,
    until: datetime,
    generated_at: datetime,
    consolidation_reports: Iterable[ConsolidationReport] = (),
    consolidation_moves: Iterable[ConsolidationMove] = (),
) -> Report:
    """The report of a window from what the streams held for it."""
    samples = list(samples)
    by_key: dict[str, list[UsageSample]] = defaultdict(list)
    refs: dict[str, WorkloadRef] = {}
    for s in samples:
        by_key[s.workload.key].append(s)
        refs.setdefault(s.workload.key, s.workload)
    own_decisions: dict[str, list[FractionDecision]] = defaultdict(list)
    for d in decisions:
        own_decisions[d.workload.key].append(d)
        refs.setdefault(d.workload.key, d.workload)
    own_actions: dict[str, list[ActuationResult]] = defaultdict(list)
    for r in results:
        own_actions[r.workload.key].append(r)
        refs.setdefault(r.workload.key, r.workload)

    totals = Metrics()
    workloads = []
    for key, ref in refs.items():
        series = sorted(by_key.get(key, []), key=lambda s: s.timestamp)
        model = next((s.gpu_model for s in reversed(series) if s.gpu_model), "")
        hourly = prices.hourly(model)
        replay = measure(ref, series, hourly)
        if not series:
            replay.metrics.workloads = 0  # decisions or actions only: no usage in the window
        totals.add(replay.metrics)
        workloads.append(
            WorkloadReport(
                ref,
                model,
                hourly,
                replay,
                sorted(own_decisions.get(key, []), key=lambda d: d.decided_at),
                sorted(own_actions.get(key, []), key=lambda r: r.finished_at),
            )
        )
    workloads.sort(key=report_order)
    all_decisions = [d for w in workloads for d in w.decisions]
    all_actions = [a for w in workloads for a in w.actions]
    return Report(
        generated_at=generated_at,
        since=since,
        until=until,
        totals=totals,
        workloads=workloads,
        decisions_by_direction=_counts(d.direction.value for d in all_decisions),
        actions_by_plan=_counts(a.plan.value for a in all_actions),
        actions_by_outcome=_counts(a.outcome.value for a in all_actions),
        actions_by_plan_outcome=_counts(f"{a.plan.value}/{a.outcome.value}" for a in all_actions),
        cards=card_use(samples),
        consolidation=consolidation_account(consolidation_reports, consolidation_moves, until),
    )


def _counts(values: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))
