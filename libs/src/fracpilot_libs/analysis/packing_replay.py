"""Packed replay: every workload of a trace on shared GPUs, placed by the actuator's planner.

All workloads are replayed together in time order. At each instant, first the intervals that
end there end: a workload that stops reporting (its last sample, or a gap longer than the cap
of :func:`~fracpilot_libs.analysis.accounting.sample_intervals`) leaves its card, then the
decisions taken on the samples just ended take effect, downsizes before upsizes so that room
freed on a card can be used by its neighbours; each goes through
:func:`fracpilot_libs.placement.planner.plan_workload` (in place when it fits on the current
card, else a recreate on the best-fitting other card, else a scale-up). Then the samples of the
instant start: a workload not on a card is placed by best fit, every sample is accounted
against the placement in force (:mod:`fracpilot_libs.analysis.packing`, and the per-workload
:class:`~fracpilot_libs.analysis.accounting.Metrics` of the unpacked replay), and is shown to
the sizer. A fraction decided on a sample thus applies when that sample's interval ends, as in
:func:`fracpilot_libs.analysis.replay.replay_workload`: without ``gpus`` the fractions, overruns
and resizes are the unpacked replay's, and only the cards are new.

With ``consolidate`` (the default), the consolidation is the product's: at every instant at
which a workload left a card or changed its fraction (after the decisions of the instant took
effect), :func:`~fracpilot_libs.placement.consolidation.consolidation_plan` plans for the
cluster as it is, and its moves are carried out, each a recreate counted as a move (whole
cards emptied, onto the card the scheduler's best fit predicts; at most
:data:`MAX_MOVES_PER_CHECK` a check, and a check that made them checks again at the next
instant). Under a move budget (enforced isolation) a workload
that has spent it is a pod that may not be evicted (``safe-to-evict: "false"``).

Cards are identical, with the trace's device memory. Without ``gpus`` a scale-up adds a card;
with ``gpus`` the cards are fixed and what fits nowhere is refused or left unplaced.

``isolation`` (:class:`~fracpilot_libs.placement.card_budget.Isolation`): ``shared`` packs the
engine's workloads with the card planner instead (:mod:`fracpilot_libs.analysis.shared_packing`:
a workload's engine sizes its need, the card divides itself among its tenants);
``enforced`` packs fractions as above, the engine learning each workload's memory headroom
with the population's prior (:mod:`fracpilot_libs.analysis.enforced_packing`); None (not set)
is today's packing of the policy as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby

from fracpilot_libs.analysis.accounting import Metrics, WorkloadAccount
from fracpilot_libs.analysis.baselines import EngineSizer, Sizer
from fracpilot_libs.analysis.enforced_packing import (
    ENFORCED_MOVE_BUDGET,
    PopulationSizer,
    enforced_policy,
)
from fracpilot_libs.analysis.packed_workload import (
    END,
    START,
    PackedWorkload,
    rounds_of,
    sample_events,
)
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.analysis.replay import Progress, ReplayReport
from fracpilot_libs.analysis.replay_cluster import MAX_MOVES_PER_CHECK, ReplayCluster
from fracpilot_libs.analysis.shared_packing import SharedCluster
from fracpilot_libs.analysis.tenant_forecasts import YOUNG_MARGIN, YOUNG_SPARE, TenantForecasts
from fracpilot_libs.analysis.tenant_sizing import TenantSizer, shared_policy
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.placement.card_budget import CardRules, Isolation
from fracpilot_libs.pricing import GpuPrices

# the names callers import from here since the cluster and the forecasts had modules of their own
__all__ = [
    "MAX_MOVES_PER_CHECK",
    "TIDY_S",
    "YOUNG_MARGIN",
    "YOUNG_SPARE",
    "PackedReport",
    "ReplayCluster",
    "replay_packed",
]

TIDY_S = 600.0  # how often a shared card is checked against its tenants' forecasts


_Cluster = ReplayCluster | SharedCluster


@dataclass
class PackedReport:
    """The packed account, and the per-workload accounts of the same run."""

    replay: ReplayReport
    packed: PackedAccount


def replay_packed(
    groups: dict[str, list[TracePoint]],
    sizer: Sizer,
    gpus: int | None = None,
    card_memory_bytes: int | None = None,
    progress: Progress | None = None,
    prices: GpuPrices | None = None,
    consolidate: bool = True,
    isolation: Isolation | None = None,
    card_rules: CardRules | None = None,
    gpus_per_node: int = 1,
) -> PackedReport:
    """Every workload replayed together through ``sizer``, packed on cards of
    ``card_memory_bytes`` (the largest device memory in the trace by default); ``gpus`` pins
    the number of cards; ``consolidate`` runs the consolidation planner after every change
    (module docstring); cards come in nodes of ``gpus_per_node`` (the account's node-hours,
    and how many of the card-hours freed were whole nodes).
    ``isolation`` shared: the engine's workloads packed by the card planner under
    ``card_rules`` (a baseline sizer's fractions are packed as fractions whatever the mode).
    A workload whose trace names its own isolation (the ``isolation`` column) is packed with
    the workloads of that mode, on cards of their own (a GPU has one mode), and the accounts
    are added up (``isolation`` "mixed" when there are several)."""
    modes = {k: series[0].isolation or isolation for k, series in groups.items()}
    if (
        all(series[0].isolation is None for series in groups.values())
        or len(set(modes.values())) == 1
    ):
        return _replay_packed(
            groups,
            sizer,
            gpus,
            card_memory_bytes,
            progress,
            prices,
            consolidate,
            next(iter(modes.values())) if modes else isolation,
            card_rules,
            gpus_per_node,
        )
    if gpus is not None:
        raise ValueError("pinned GPUs (gpus) and several isolation modes do not mix")
    memory = card_memory_bytes or max(s[0].sample.memory_total_bytes for s in groups.values())
    reports = []
    for mode in sorted(set(modes.values()), key=lambda m: m.value if m else ""):
        part = {k: series for k, series in groups.items() if modes[k] is mode}
        reports.append(
            _replay_packed(
                part,
                sizer,
                None,
                memory,
                progress,
                prices,
                consolidate,
                mode,
                card_rules,
                gpus_per_node,
            )
        )
    return _merged(reports)


def _merged(reports: list[PackedReport]) -> PackedReport:
    """The reports of disjoint workloads on disjoint cards, added up."""
    totals = Metrics()
    accounts = []
    for r in reports:
        totals.add(r.replay.totals)
        accounts.extend(r.replay.workloads)
    accounts.sort(key=lambda a: a.workload.key)
    packed = reports[0].packed
    for r in reports[1:]:
        packed = packed.merged(r.packed)
    packed.isolation = "mixed"
    return PackedReport(ReplayReport(totals, accounts), packed)


def _replay_packed(
    groups: dict[str, list[TracePoint]],
    sizer: Sizer,
    gpus: int | None = None,
    card_memory_bytes: int | None = None,
    progress: Progress | None = None,
    prices: GpuPrices | None = None,
    consolidate: bool = True,
    isolation: Isolation | None = None,
    card_rules: CardRules | None = None,
    gpus_per_node: int = 1,
) -> PackedReport:
    """:func:`replay_packed` for workloads of one isolation mode."""
    if gpus is not None and gpus < 1:
        raise ValueError("gpus must be at least 1")
    prices = prices or GpuPrices()
    shared = isolation is Isolation.SHARED and isinstance(sizer, EngineSizer | TenantSizer)
    if shared and isinstance(sizer, EngineSizer):
        sizer = TenantSizer(shared_policy(sizer.policy), name=sizer.name)
    elif isolation is Isolation.ENFORCED and isinstance(sizer, EngineSizer):
        sizer = PopulationSizer(enforced_policy(sizer.policy), name=sizer.name)
    workloads = [
        PackedWorkload(
            ref=groups[k][0].sample.workload,
            key=groups[k][0].sample.workload.key,
            series=groups[k],
            intervals=[],
            leaves=[],
            metrics=Metrics(workloads=1),
            fraction=sizer.initial(groups[k][0].requested_fraction),
            state=sizer.start(),
        )
        for k in sorted(groups)
    ]
    for wl in workloads:
        wl.base = wl.fraction
    memory = card_memory_bytes or max(wl.series[0].sample.memory_total_bytes for wl in workloads)
    cluster: _Cluster
    forecasts = None
    if shared:
        assert isinstance(sizer, TenantSizer)
        forecasts = TenantForecasts(workloads, sizer.policy)
        cluster = SharedCluster(
            memory,
            gpus,
            card_rules or CardRules(),
            forecasts,
            consolidate,
            gpus_per_node=gpus_per_node,
        )
    else:
        cluster = ReplayCluster(memory, gpus, consolidate, gpus_per_node)
        if isinstance(sizer, PopulationSizer):
            cluster.move_budget = ENFORCED_MOVE_BUDGET
    account = PackedAccount(
        card_memory_bytes=memory,
        gpus=gpus,
        isolation=isolation.value if isolation else None,
        gpus_per_node=gpus_per_node,
    )
    events = sample_events(workloads)
    previous: float | None = None
    next_tidy = 0.0
    for at, group in groupby(events, key=lambda e: e[0]):
        if previous is not None:
            _hold(account, workloads, cluster, at - previous)
        previous = at
        if forecasts is not None:
            forecasts.at(at)
        if isinstance(cluster, SharedCluster):
            cluster.at(at)
        if isinstance(cluster, ReplayCluster):
            cluster.now = at
        batch = list(group)
        _end_intervals(account, workloads, cluster, [e for e in batch if e[1] == END])
        if isinstance(cluster, SharedCluster):
            _sync_fractions(workloads, cluster)
        else:
            cluster.consolidate()  # the cards as the departures and decisions left them
        starts = [(workloads[w], i) for _, kind, w, i in batch if kind == START]
        for n, round_ in enumerate(rounds_of(starts)):
            if n:  # a workload's earlier sample of this instant decided: it applies now
                _apply(account, cluster, [wl for wl, _ in round_ if wl.pending is not None])
                if isinstance(cluster, ReplayCluster):
                    cluster.consolidate()
            _start_samples(account, workloads, cluster, round_)
            _step_sizers(sizer, round_)
            if forecasts is not None and isinstance(cluster, SharedCluster):
                stepped = [wl.key for wl, _ in round_ if wl.on_card]
                forecasts.forget(stepped)  # they saw a sample: their forecasts changed
                if cluster.relieve_memory(stepped):
                    _sync_fractions(workloads, cluster)
        if isinstance(cluster, SharedCluster) and at >= next_tidy:
            cluster.tidy()
            _sync_fractions(workloads, cluster)
            next_tidy = at + TIDY_S
        account.in_use(at, cluster.cards_in_use())
        if progress is not None and starts:
            progress(len(starts))
    totals = Metrics()
    accounts = []
    for wl in workloads:
        wl.metrics.price(prices.hourly(wl.series[0].sample.gpu_model))
        totals.add(wl.metrics)
        accounts.append(WorkloadAccount(wl.ref, wl.metrics, wl.fraction))
    account.memory_overrun_samples = totals.memory_overrun_samples
    account.neighbour_moves = cluster.neighbour_moves
    if isinstance(cluster, SharedCluster):  # the cluster counts every move, whoever asked
        account.moves = cluster.moves
        account.redivisions = cluster.redivisions
        account.moves_by_cause = dict(sorted(cluster.move_causes.items()))
        account.moves_over_budget = cluster.moves_over_budget
        account.move_budget_per_day = cluster.move_rules.budget_per_day
    else:
        account.moves += cluster.neighbour_moves
    return PackedReport(ReplayReport(totals, accounts), account)


def _hold(
    account: PackedAccount,
    workloads: list[PackedWorkload],
    cluster: _Cluster,
    seconds: float,
) -> None:
    cards: dict[str, dict[str, float]] = {}
    held: dict[str, float] = {}
    for wl in workloads:
        if wl.on_card:
            card = cluster.card_of[wl.key]
            cards.setdefault(card, {})[wl.ref.display] = wl.util
            held[card] = held.get(card, 0.0) + wl.fraction
    account.peak_card_fraction = max(account.peak_card_fraction, *held.values(), 0.0)
    account.hold(seconds, cards.values())
    nodes = {cluster.node_of(card) for card in cards}
    account.hold_nodes(seconds, len(nodes), sum(len(on) for on in cards.values()))


def _end_intervals(
    account: PackedAccount,
    workloads: list[PackedWorkload],
    cluster: _Cluster,
    ends: list[tuple[float, int, int, int]],
) -> None:
    changes: list[PackedWorkload] = []
    for _, _, w, i in ends:
        wl = workloads[w]
        if not wl.on_card:
            continue  # unplaced: its sample was not replayed
        if wl.leaves[i]:
            wl.on_card = False
            cluster.release(wl.ref)
            if wl.pending is not None:  # it returns (if ever) at the fraction decided
                wl.fraction = wl.base = wl.pending
                wl.pending = None
                wl.metrics.resizes += 1
        elif wl.pending is not None:
            changes.append(wl)
    _apply(account, cluster, changes)


def _apply(account: PackedAccount, cluster: _Cluster, changes: list[PackedWorkload]) -> None:
    """Decisions taking effect, each through the planner."""
    # Downsizes first: the room they free may let an upsize stay in place.
    changes.sort(key=lambda wl: (wl.pending is not None and wl.pending > wl.fraction, wl.key))
    for wl in changes:
        assert wl.pending is not None
        before, wl.base = wl.base, wl.pending  # a shared card reads the new need
        kind = cluster.resize(wl.ref, wl.pending)
        if kind is PlanKind.SCALE_UP:
            account.decisions_refused += 1
            wl.base = before
        else:
            wl.fraction = wl.pending
            wl.metrics.resizes += 1
            account.in_place += kind is PlanKind.IN_PLACE
            account.moves += kind is PlanKind.RECREATE_ELSEWHERE
        wl.pending = None
    if isinstance(cluster, SharedCluster):
        _sync_fractions(changes, cluster)


def _start_samples(
    account: PackedAccount,
    workloads: list[PackedWorkload],
    cluster: _Cluster,
    starts: list[tuple[PackedWorkload, int]],
) -> None:
    placed: list[tuple[PackedWorkload, int]] = []
    if isinstance(cluster, SharedCluster):  # largest first, as first-fit-decreasing does
        starts = sorted(starts, key=lambda wi: -wi[0].series[wi[1]].sample.memory_share)
    for wl, i in starts:
        if wl.key not in cluster.card_of:
            wl.shown = wl.series[i].sample.memory_share  # what an arriving workload shows
            if not cluster.place(wl.ref, wl.series[i].sample.pod, wl.base):
                account.unplaced.add(wl.ref.display)
                account.unplaced_samples += 1
                continue
            account.placements += 1
        placed.append((wl, i))
    if isinstance(cluster, SharedCluster):
        _sync_fractions(workloads, cluster)
    started: list[PackedWorkload] = []
    for wl, i in placed:
        s = wl.series[i].sample
        wl.on_card = True
        wl.util, wl.memory = s.compute, s.memory_used_bytes
        wl.metrics.record(wl.fraction, s.compute, s.memory_share, wl.intervals[i])
        started.append(wl)
    if not started:
        return
    used: dict[str, int] = {}
    for wl in workloads:
        if wl.on_card:
            card = cluster.card_of[wl.key]
            used[card] = used.get(card, 0) + wl.memory
    account.samples += len(started)
    account.memory_collision_samples += sum(
        used[cluster.card_of[wl.key]] > cluster.memory_bytes for wl in started
    )
    reporting = {cluster.card_of[wl.key] for wl in started}
    account.card_samples += len(reporting)
    account.memory_collision_card_samples += sum(
        used[card] > cluster.memory_bytes for card in reporting
    )


def _sync_fractions(workloads: list[PackedWorkload], cluster: SharedCluster) -> None:
    """Each tenant's accounted fraction as its card divides itself now."""
    for wl in workloads:
        fraction = cluster.fraction_of.get(wl.key)
        if fraction is not None:
            wl.fraction = fraction


def _step_sizers(sizer: Sizer, starts: list[tuple[PackedWorkload, int]]) -> None:
    for wl, i in starts:
        if not wl.on_card:
            continue
        sample = wl.series[i].sample.model_copy(update={"allocated_fraction": wl.base})
        wl.state, new = sizer.step(wl.state, sample)
        if new is not None and not math.isclose(new, wl.base):
            wl.pending = new
