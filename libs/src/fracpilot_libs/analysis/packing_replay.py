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

from fracpilot_libs.analysis.accounting import Metrics, WorkloadAccount, sample_intervals
from fracpilot_libs.analysis.baselines import EngineSizer, Sizer
from fracpilot_libs.analysis.enforced_packing import (
    ENFORCED_MOVE_BUDGET,
    PopulationSizer,
    enforced_policy,
)
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.analysis.replay import Progress, ReplayReport
from fracpilot_libs.analysis.shared_packing import (
    SharedCluster,
    TenantSizer,
    TenantState,
    shared_policy,
)
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import PlanKind, Policy, WorkloadRef
from fracpilot_libs.placement.card_budget import CardRules, Isolation, TenantForecast
from fracpilot_libs.placement.consolidation import SAFE_TO_EVICT, consolidation_plan
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep, apply_consolidation
from fracpilot_libs.placement.planner import (
    ClusterState,
    Placement,
    ResizePlan,
    add_node,
    apply_pod_plan,
    move_or_scale_up,
    plan_workload,
)
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.forecast import forecast_of, population_prior

_END, _START = 0, 1  # at one instant, intervals end before samples start
_DAY_S = 24 * 3600.0


# The consolidation rate limit of the replay: moves per check (the planner's ``max_moves``).
# With 1, each check empties at most one card of one tenant; a card of two waits until one
# of them leaves or moves. Chosen on half the GenAI trace's pods (docs/sizing.md): with no
# limit, enforced isolation saved 1.2 points fewer card-hours there at 0.7 more moves per
# workload-day (budgets spent on cards of two tenants early on).
MAX_MOVES_PER_CHECK = 1


class ReplayCluster:
    """Identical cards and the workloads on them, changed only through the planners: a
    decision through :func:`~fracpilot_libs.placement.planner.plan_workload`, consolidation
    through :func:`~fracpilot_libs.placement.consolidation.consolidation_plan` (the
    actuator's), at each :meth:`consolidate`."""

    def __init__(
        self,
        memory_bytes: int,
        gpus: int | None,
        consolidate: bool = True,
        gpus_per_node: int = 1,
    ) -> None:
        if gpus_per_node < 1 or (gpus is not None and gpus % gpus_per_node):
            raise ValueError("gpus_per_node must be at least 1 and divide the pinned gpus")
        self.memory_bytes = memory_bytes
        self.consolidate_cards = consolidate
        self.pinned = gpus is not None
        self.gpus_per_node = gpus_per_node
        self.state = ClusterState()
        self._node_of: dict[str, str] = {}
        for _ in range((gpus or 0) // gpus_per_node):
            self._add_node()
        self.card_of: dict[str, str] = {}  # workload key -> GPU uuid
        # the consolidation planner's moves (no decision of the moved workload asked for them)
        self.neighbour_moves = 0
        # At most this many moves per workload in any 24 h (enforced isolation): a workload
        # that has made them is protected from consolidation; a move a resize needs (it fits
        # nowhere else) is counted, never withheld. None: no budget.
        self.move_budget: float | None = None
        self.now = 0.0  # the replay's instant (the move budget's clock)
        self.move_times: dict[str, list[float]] = {}
        self.changed = False  # a card lost share since the last consolidation check
        self.max_moves = MAX_MOVES_PER_CHECK

    def _add_node(self) -> None:
        """A node of ``gpus_per_node`` cards (one card: the node is the card)."""
        # Zero-padded so that the planner's tie-break on uuid follows the order cards came in.
        n = len(self.state.gpus) // self.gpus_per_node
        node = f"card-{n:05d}" if self.gpus_per_node == 1 else f"node-{n:05d}"
        before = len(self.state.gpus)
        self.state = add_node(self.state, node, self.gpus_per_node, self.memory_bytes)
        self._node_of.update((g.uuid, node) for g in self.state.gpus[before:])

    def node_of(self, card: str) -> str:
        return self._node_of[card]

    def place(self, workload: WorkloadRef, pod: str, fraction: float) -> bool:
        """Put an arriving workload on the best-fitting card; False when none holds it."""
        plan = self._best_fit(workload, fraction)
        if plan.kind is PlanKind.SCALE_UP:
            if self.pinned:
                return False
            self._add_node()
            plan = self._best_fit(workload, fraction)
        placement = Placement(
            workload=workload, pod=pod, gpu_uuid=plan.gpu_after, fraction=fraction
        )
        self.state = self.state.model_copy(
            update={"placements": (*self.state.placements, placement)}
        )
        self.card_of[workload.key] = plan.gpu_after
        return True

    def _best_fit(self, workload: WorkloadRef, fraction: float) -> ResizePlan:
        base = {"workload": workload, "fraction_before": None, "fraction_after": fraction}
        return move_or_scale_up(self.state, "", fraction, base, self.state.free)

    def resize(self, workload: WorkloadRef, fraction: float) -> PlanKind:
        """The planner's plan for a new fraction, carried out: ``in_place``,
        ``recreate_elsewhere`` (onto a new card when none fits and cards may be added), or
        ``scale_up`` when it fits nowhere on pinned cards (refused: nothing changes)."""
        pods = tuple(p for p in self.state.placements if p.workload.key == workload.key)
        step = plan_workload(self.state, workload, pods, fraction).steps[0]
        if step.kind is PlanKind.SCALE_UP:
            if self.pinned:
                return PlanKind.SCALE_UP
            self._add_node()
            step = plan_workload(self.state, workload, pods, fraction).steps[0]
        self.state = apply_pod_plan(self.state, step)
        if step.kind is PlanKind.RECREATE_ELSEWHERE:
            self._moved(workload.key)
        self.card_of[workload.key] = step.gpu_after
        self.changed = True
        return step.kind

    def release(self, workload: WorkloadRef) -> None:
        """The workload leaves its card."""
        placements = tuple(p for p in self.state.placements if p.workload.key != workload.key)
        self.state = self.state.model_copy(update={"placements": placements})
        self.card_of.pop(workload.key)
        self.changed = True

    def consolidate(self) -> tuple[ConsolidationStep, ...]:
        """The consolidation planner's plan for the cluster as it is, carried out (when
        consolidating, and something changed since the last check, or the last check made
        all the moves the rate limit allows): its moves empty whole cards, each a recreate
        counted in :attr:`neighbour_moves`; a workload with no move
        left in its budget is a pod that may not be evicted."""
        if not self.consolidate_cards or not self.changed:
            return ()
        self.changed = False
        protected = {
            p.pod_key: {SAFE_TO_EVICT: "false"}
            for p in self.state.placements
            if not self._may_move(p.workload.key)
        }
        plan = consolidation_plan(
            self.state,
            max_moves=self.max_moves,
            pod_annotations=protected,
        )
        self.state = apply_consolidation(self.state, plan)
        # a plan cut short by the rate limit may have more to free: check again next instant
        self.changed = len(plan.moves) >= self.max_moves
        for step in plan.moves:
            self.card_of[step.placement.workload.key] = step.to_gpu
            self.neighbour_moves += 1
            self._moved(step.placement.workload.key)
        return plan.steps

    def _may_move(self, key: str) -> bool:
        """Whether one more move keeps the workload within the move budget (always, without)."""
        if self.move_budget is None:
            return True
        recent = [t for t in self.move_times.get(key, ()) if self.now - t < _DAY_S]
        self.move_times[key] = recent
        return len(recent) + 1 <= self.move_budget + 1e-9

    def _moved(self, key: str) -> None:
        if self.move_budget is not None:
            self.move_times.setdefault(key, []).append(self.now)

    def cards_in_use(self) -> int:
        return len(set(self.card_of.values()))

    def overcommitted(self) -> list[str]:
        """Cards whose fractions sum above 1.0 (the planner never leaves one)."""
        return [g.uuid for g in self.state.gpus if self.state.used(g.uuid) > 1.0 + 1e-9]


_Cluster = ReplayCluster | SharedCluster


@dataclass
class PackedReport:
    """The packed account, and the per-workload accounts of the same run."""

    replay: ReplayReport
    packed: PackedAccount


@dataclass
class _Workload:
    ref: WorkloadRef
    key: str
    series: list[TracePoint]
    intervals: list[float]  # seconds each sample stands for
    leaves: list[bool]  # whether the workload leaves its card when a sample's interval ends
    metrics: Metrics
    fraction: float  # accounted (the fraction the scheduler holds)
    state: object
    base: float = 0.0  # what its sizer decided (shared isolation: its need; else the fraction)
    shown: float = 0.0  # memory share of the sample it arrived with (shared isolation)
    pending: float | None = None
    util: float = 0.0
    memory: int = 0
    on_card: bool = False  # placed and inside a sample's interval


def _events(workloads: list[_Workload]) -> list[tuple[float, int, int, int]]:
    """(time, END or START, workload index, sample index), in time order. A sample's END
    event is at the next sample's time unless the interval was capped (a gap) or is the last;
    a sample at the same time as the next (an interval of 0 s) has none: see :func:`_rounds`."""
    events = []
    for w, wl in enumerate(workloads):
        times = [p.sample.timestamp.timestamp() for p in wl.series]
        wl.intervals = sample_intervals(times)
        for i, (at, dt) in enumerate(zip(times, wl.intervals, strict=True)):
            events.append((at, _START, w, i))
            leaves = i + 1 == len(times) or at + dt < times[i + 1]
            wl.leaves.append(leaves)
            if dt > 0:
                events.append((at + dt if leaves else times[i + 1], _END, w, i))
    events.sort()
    return events


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
        _Workload(
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
        forecasts = _Forecasts(workloads, sizer.policy)
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
    events = _events(workloads)
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
        _end_intervals(account, workloads, cluster, [e for e in batch if e[1] == _END])
        if isinstance(cluster, SharedCluster):
            _sync_fractions(workloads, cluster)
        else:
            cluster.consolidate()  # the cards as the departures and decisions left them
        starts = [(workloads[w], i) for _, kind, w, i in batch if kind == _START]
        for n, round_ in enumerate(_rounds(starts)):
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
    workloads: list[_Workload],
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
    workloads: list[_Workload],
    cluster: _Cluster,
    ends: list[tuple[float, int, int, int]],
) -> None:
    changes: list[_Workload] = []
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


def _rounds(starts: list[tuple[_Workload, int]]) -> list[list[tuple[_Workload, int]]]:
    """The samples starting at one instant, in rounds: the n-th sample of each workload at
    that instant is in round n (a trace may repeat a timestamp; each sample still counts, and
    a decision on one applies to the next, as in the unpacked replay)."""
    rounds: list[list[tuple[_Workload, int]]] = []
    seen: dict[str, int] = {}
    for wl, i in starts:
        n = seen[wl.key] = seen.get(wl.key, -1) + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append((wl, i))
    return rounds


def _apply(account: PackedAccount, cluster: _Cluster, changes: list[_Workload]) -> None:
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
    workloads: list[_Workload],
    cluster: _Cluster,
    starts: list[tuple[_Workload, int]],
) -> None:
    placed: list[tuple[_Workload, int]] = []
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
    started: list[_Workload] = []
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


def _sync_fractions(workloads: list[_Workload], cluster: SharedCluster) -> None:
    """Each tenant's accounted fraction as its card divides itself now."""
    for wl in workloads:
        fraction = cluster.fraction_of.get(wl.key)
        if fraction is not None:
            wl.fraction = fraction


# A young workload's need under shared isolation: the most memory it has shown plus this (its
# engine still holds what the workload asked for, often a whole card). Pods that start late in
# the GenAI trace load their model in their first minutes: 0.2-0.3 of the card. A card admits
# it only with YOUNG_SPARE more free, which it may then use before anyone moves (hysteresis:
# a young workload's memory still climbs). Chosen on half the GenAI trace's pods
# (docs/sizing.md): margin 0.3 and no spare saved 0.6 points fewer card-hours there, at 0.4
# more moves per workload-day.
YOUNG_MARGIN = 0.2
YOUNG_SPARE = 0.1


TIDY_S = 600.0  # how often a shared card is checked against its tenants' forecasts


class _Forecasts:
    """Each workload's forecast for the card planner, as it stands at the instant set by
    :meth:`at` (cached for that instant): its need is the fraction its engine decided; a
    workload with less than the policy's ``memory_headroom.warmup`` of history takes at least
    the population prior as its jump."""

    def __init__(self, workloads: list[_Workload], policy: Policy) -> None:
        self.by_key = {wl.key: wl for wl in workloads}
        self.policy = policy
        self.now = 0.0
        self.cache: dict[str, TenantForecast] = {}
        self.prior: float | None = None
        self.young_margin: float | None = YOUNG_MARGIN

    def at(self, now: float) -> None:
        self.now, self.prior = now, None
        self.cache.clear()

    def forget(self, keys: list[str]) -> None:
        """These workloads' forecasts are to be read again (their sizers saw a sample)."""
        for key in keys:
            self.cache.pop(key, None)

    def _prior(self) -> float:
        if self.prior is None:
            warm = self.policy.memory_headroom.warmup
            self.prior = population_prior(
                st.jump
                for wl in self.by_key.values()
                if isinstance(st := wl.state, TenantState)
                and st.first_seen is not None
                and self.now - st.first_seen >= warm
            )
        return self.prior

    def __call__(self, key: str) -> TenantForecast:
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        wl = self.by_key[key]
        st = wl.state
        assert isinstance(st, TenantState)
        jump = st.jump
        young = (
            st.first_seen is None or self.now - st.first_seen < self.policy.memory_headroom.warmup
        )
        if young:
            jump = max(jump, self._prior())
        level = need_of(st.engine, self.policy).compute_need if st.engine.samples else 0.0
        # A young workload's need is what it has shown (its engine still holds what it asked
        # for), its jump at least the population's; else the fraction its engine decided.
        peak = wl.base
        if young and self.young_margin is not None:
            slots = st.engine.memory_slots
            shown = max([wl.shown, *slots[1::2]]) + self.young_margin
            peak = shown if shown < peak else peak
        f = forecast_of(st.engine, self.policy, jump, level, memory_peak=peak)
        # A young workload has not shown its peaks: its need counts in every period.
        profile = () if young else st.peak_profile(self.now, self.policy)
        spare = YOUNG_SPARE if young else 0.0
        out = TenantForecast(f.memory_peak, f.memory_jump, f.compute, f.burst, profile, spare)
        self.cache[key] = out
        return out


def _step_sizers(sizer: Sizer, starts: list[tuple[_Workload, int]]) -> None:
    for wl, i in starts:
        if not wl.on_card:
            continue
        sample = wl.series[i].sample.model_copy(update={"allocated_fraction": wl.base})
        wl.state, new = sizer.step(wl.state, sample)
        if new is not None and not math.isclose(new, wl.base):
            wl.pending = new
