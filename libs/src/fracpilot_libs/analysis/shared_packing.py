"""Packed replay where memory is shared (``--isolation shared``): cards sized by their tenants.

The replay loop is :func:`fracpilot_libs.analysis.packing_replay.replay_packed`; with
``shared`` isolation it places workloads through :class:`SharedCluster` instead of the
actuator's fraction planner. Each workload's engine sizes its own *need* (the policy's fraction
without per-pod memory headroom: the
:data:`~fracpilot_libs.analysis.tenant_sizing.SHARED_HEADROOM` fields) and keeps its jump
statistic (:class:`~fracpilot_libs.analysis.tenant_sizing.TenantSizer`); the card planner
(:mod:`fracpilot_libs.placement.card_budget`) decides which cards hold which tenants (their
needs plus the card's one pooled headroom and burst budget fit in 1.0) and divides each card
into accounted fractions that sum to at most 1.0.

- A card *admits* a tenant (an arrival, or any move's target: the fullest card in use that
  does) when its whole budget fits, and *keeps* its tenants while their peaks leave part of the
  pooled headroom free (:func:`~fracpilot_libs.placement.card_budget.holds`: hysteresis).
- **Memory first**: a card whose tenants' memory it no longer keeps (a tenant's resize, or a
  sample that raised a peak profile: checked at every sample, not at the tidy) moves one
  tenant at a time until it does: the one whose leaving restores it and that a card in use
  admits, the smallest first (not necessarily the one that grew). Never withheld, counted.
- **Moves bounded by construction** (:class:`MoveRules`): a move that only saves a card (a
  workload alone on its card, or a card of at most two tenants that the others admit, emptied)
  waits for the tidy (every 10 min) and is made only within each moved workload's move budget
  (2 in any 24 h, its memory moves counted). A card short of compute only moves nobody: its
  work waits (time-sliced), and contention measures it.
- Re-dividing a card among its tenants (a tenant came, left or changed) is an annotation patch
  in place, no restart: counted as *re-divisions*, apart from the workload's own resizes.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fracpilot_libs.analysis.tenant_sizing import (
    MODE_RESIZE_BUDGET,
    SHARED_HEADROOM,
    SHARED_RESIZE_BUDGET,
    TenantSizer,
    TenantState,
    shared_policy,
    with_resize_budget,
)
from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.placement.card_budget import (
    EPS,
    CardRules,
    TenantForecast,
    budget,
    divide,
    fits,
    holds,
    holds_memory,
)
from fracpilot_libs.placement.consolidation import SAFE_TO_EVICT, consolidation_plan
from fracpilot_libs.placement.consolidation_limits import pooled_card_budget
from fracpilot_libs.placement.planner import ClusterState, Gpu, Placement

# the tenant's engine has a module of its own (tenant_sizing); its names stay importable here
__all__ = [
    "MODE_RESIZE_BUDGET",
    "SHARED_HEADROOM",
    "SHARED_RESIZE_BUDGET",
    "Forecasts",
    "MoveRules",
    "SharedCluster",
    "TenantSizer",
    "TenantState",
    "shared_policy",
    "with_resize_budget",
]

HOUR_S = 3600.0

Forecasts = Callable[[str], TenantForecast]

DAY_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class MoveRules:
    """When a shared cluster moves a tenant to another card (a recreate: a restart).

    A move for memory (a card whose tenants' peaks no longer leave the pooled headroom the
    card keeps) is never withheld, but it is counted. A move that only saves a card (a
    consolidation) waits for the tidy, and is made only when each tenant it moves has made
    fewer than ``budget_per_day`` moves in the last 24 h, its memory moves included. A card
    short of compute only (time-sliced: work waits, nothing fails) moves nobody unless
    ``compute_moves``; its contention is measured.
    """

    budget_per_day: float | None = 2.0  # moves per workload in any 24 h; None: no budget
    drain: bool = True  # a tidy empties a card whose tenants the other cards admit
    drain_most: int = 2  # ... of at most this many tenants
    # a workload left alone on its card moves at the next tidy, not at once (a departure
    # followed by another within the tidy's period moves nobody)
    deferred: bool = True
    compute_moves: bool = False  # a card short of compute only moves a tenant, within budget
    # the tidy's consolidation is the actuator's planner (placement/consolidation.py: nodes
    # first, then cards, pooled card budgets) within its rate limit; False: the lone and drain
    # rules above
    planner: bool = True
    # the planner's moves in any hour, across the cluster (the actuator's
    # FRACPILOT_CONSOLIDATION_MAX_MOVES_PER_HOUR, 4 by default); None: only the workloads'
    # move budgets bound them, as in the enforced replay (docs/sizing.md gives both figures:
    # the trace starts every pod on a card of its own, a consolidation a cluster makes once)
    planner_moves_per_hour: int | None = None


class SharedCluster:
    """Identical cards, each holding the tenants the card planner admits, divided by it.

    ``forecast(key)`` is the workload's forecast as it stands (its need is the fraction its
    engine decided). The interface is the fraction cluster's
    (:class:`fracpilot_libs.analysis.replay_cluster.ReplayCluster`) that the replay loop uses;
    :attr:`fraction_of` holds each tenant's accounted fraction after every change. Time comes
    from :meth:`at` (the move budget's 24 h).

    A card *admits* a tenant when they all :func:`fits` (placement, any move's target), and
    *keeps* its tenants while they :func:`holds` (part of the pooled headroom may be used
    first: hysteresis). Every move is counted in :attr:`move_causes`: ``grew`` (a tenant's
    resize left its card short of memory) and ``overflow`` (forecasts changed: its card short
    of memory), never withheld; ``compute`` (short of compute only), ``lone`` (alone on its
    card) and ``drain`` (its card emptied), within the move budget.
    """

    def __init__(
        self,
        memory_bytes: int,
        gpus: int | None,
        rules: CardRules,
        forecast: Forecasts,
        consolidate: bool = True,
        moves: MoveRules | None = None,
        gpus_per_node: int = 1,
    ) -> None:
        self.memory_bytes = memory_bytes
        # Cards are opened in order and fill nodes of this many (its moves do not aim at
        # whole nodes: the node figures are measured, not planned for).
        self.gpus_per_node = gpus_per_node
        self.rules = rules
        self.forecast = forecast
        self.consolidate = consolidate
        self.move_rules = moves or MoveRules()
        self.pinned = gpus is not None
        self.cards: dict[str, set[str]] = {}
        self.pods: dict[str, tuple[WorkloadRef, str]] = {}  # workload key -> (ref, pod name)
        self.planned_times: list[float] = []  # the planner's moves of the last hour
        for _ in range(gpus or 0):
            self._add_card()
        self.card_of: dict[str, str] = {}
        self.fraction_of: dict[str, float] = {}
        self.now = 0.0
        self.move_times: dict[str, list[float]] = {}  # each workload's moves of the last day
        self.move_causes: dict[str, int] = {}
        self.moves_over_budget = 0  # memory moves of a workload whose budget was spent
        self.own_moves = 0  # moves of a workload its own resize asked for
        self.redivisions = 0  # a tenant's accounted fraction changed by a neighbour's change

    @property
    def moves(self) -> int:
        return sum(self.move_causes.values())

    @property
    def neighbour_moves(self) -> int:
        """Moves no decision of the moved workload asked for."""
        return self.moves - self.own_moves

    def at(self, now: float) -> None:
        self.now = now

    def _add_card(self) -> str:
        card = f"card-{len(self.cards):05d}"
        self.cards[card] = set()
        return card

    def node_of(self, card: str) -> str:
        return f"node-{int(card.removeprefix('card-')) // self.gpus_per_node:05d}"

    def recent_moves(self, key: str) -> int:
        """``key``'s moves in the 24 h before now."""
        times = self.move_times.get(key)
        if not times:
            return 0
        while times and self.now - times[0] >= DAY_S:
            times.pop(0)
        return len(times)

    def may_move(self, key: str) -> bool:
        """Whether one more move keeps ``key`` within its move budget."""
        most = self.move_rules.budget_per_day
        return most is None or self.recent_moves(key) + 1 <= most + EPS

    def _move(self, key: str, target: str, cause: str) -> str:
        """Recreate ``key`` on ``target``, counted; returns the card it left."""
        if not self.may_move(key):
            self.moves_over_budget += 1
        self.move_times.setdefault(key, []).append(self.now)
        self.move_causes[cause] = self.move_causes.get(cause, 0) + 1
        card = self._take(key)
        self._put(key, target)
        return card

    def _best_card(
        self,
        key: str,
        exclude: str | None,
        planned: dict[str, str] | None = None,
        in_use_only: bool = True,
    ) -> str | None:
        """The fullest card (by budget) in use but ``exclude`` that admits ``key`` besides
        the tenants ``planned`` to move onto it, else (unless ``in_use_only``) an empty card;
        None when none does."""
        planned = planned or {}
        best, best_budget = None, -1.0
        empty = None
        mine = self.forecast(key)
        for card, tenants in self.cards.items():
            if card == exclude:
                continue
            if not tenants:
                if empty is None and card not in planned.values():
                    empty = card
                continue
            keys = [k for k in tenants if k != key]
            keys += [k for k, c in planned.items() if c == card]
            candidate = [self.forecast(k) for k in keys] + [mine]
            if not fits(candidate, self.rules):
                continue
            b = budget(candidate, self.rules)
            if b > best_budget:
                best, best_budget = card, b
        if best is not None or in_use_only:
            return best
        return empty

    def _divide(self, card: str, changed: str | None) -> None:
        """Re-divide ``card`` among its tenants; a change to anyone's but ``changed``'s
        fraction is a re-division."""
        tenants = self.cards[card]
        fractions = divide({k: self.forecast(k) for k in sorted(tenants)}, self.rules)
        for key, fraction in fractions.items():
            before = self.fraction_of.get(key)
            if key != changed and before is not None and abs(before - fraction) > 1e-9:
                self.redivisions += 1
            self.fraction_of[key] = fraction

    def _put(self, key: str, card: str) -> None:
        self.cards[card].add(key)
        self.card_of[key] = card

    def _take(self, key: str) -> str:
        card = self.card_of.pop(key)
        self.cards[card].discard(key)
        return card

    def _tenants(self, card: str) -> list[TenantForecast]:
        return [self.forecast(k) for k in self.cards[card]]

    def _load(self, card: str) -> float:
        return budget(self._tenants(card), self.rules)

    def place(self, workload: WorkloadRef, pod: str, fraction: float) -> bool:
        """Put an arriving workload on the fullest card that admits it; False when none does
        on pinned cards."""
        key = workload.key
        card = self._best_card(key, None, in_use_only=False)
        if card is None:
            if self.pinned:
                return False
            card = self._add_card()
        self.pods[key] = (workload, pod)
        self._put(key, card)
        self._divide(card, key)
        return True

    def resize(self, workload: WorkloadRef, fraction: float) -> PlanKind:
        """The workload's need changed (its forecast says so): in place while its card keeps
        its tenants, else the card moves tenants off (:meth:`_relieve`, the tenant that
        restores it at the least cost, which need not be this one): ``recreate_elsewhere``
        when this workload moved, ``scale_up`` (refused) when the card stays short of memory
        (pinned cards, no room), else ``in_place``. Without deferred consolidation, a workload
        then left alone moves to a card in use that admits it (within its budget)."""
        key = workload.key
        card = self.card_of[key]
        moved = self._relieve(card, "grew") if not self._keeps(card) else []
        if self._memory_short(card):
            return PlanKind.SCALE_UP
        self._divide(self.card_of[key], key)
        kind = PlanKind.RECREATE_ELSEWHERE if key in moved else PlanKind.IN_PLACE
        self.own_moves += key in moved
        if not self.move_rules.deferred:
            if self._consolidate(key, "lone"):
                kind = PlanKind.RECREATE_ELSEWHERE
                self.own_moves += 1
            self._consolidate_lone(card)
        return kind

    def release(self, workload: WorkloadRef) -> None:
        card = self._take(workload.key)
        self.fraction_of.pop(workload.key, None)
        self.pods.pop(workload.key, None)
        self._divide(card, None)
        if not self.move_rules.deferred:
            self._consolidate_lone(card)

    def _keeps(self, card: str) -> bool:
        return holds(self._tenants(card), self.rules)

    def _memory_short(self, card: str) -> bool:
        """Whether ``card``'s tenants, two or more, leave less memory than it keeps."""
        tenants = self._tenants(card)
        if len(tenants) < 2:
            return False
        return not holds_memory(tenants, self.rules)

    def _relieve(self, card: str, cause: str) -> list[str]:
        """Move tenants off ``card`` until it keeps the rest: memory first, whatever the move
        budget; short of compute only, within it and only with ``compute_moves``. Each time
        the tenant whose leaving restores the card, onto a card in use that admits it, and
        the smallest of those, else onto a new card (none on pinned cards: then it stops).
        Returns the workloads moved."""
        moved: list[str] = []
        while len(self.cards[card]) >= 2 and not self._keeps(card):
            memory = self._memory_short(card)
            choice = self._victim(card, within_budget=not memory)
            if choice is None or not (memory or self.move_rules.compute_moves):
                break
            key, target = choice
            self._move(key, target, cause if memory else "compute")
            self._divide(target, key)
            moved.append(key)
        if moved:
            self._divide(card, None)
        return moved

    def _victim(self, card: str, within_budget: bool) -> tuple[str, str] | None:
        """The tenant of ``card`` to move and where to: the one whose leaving lets the card
        keep the rest, with a card in use that admits it, with budget left, the smallest,
        first (a new card for it when no card in use admits it)."""
        options = []
        tenants = sorted(self.cards[card])
        for key in tenants:
            if within_budget and not self.may_move(key):
                continue
            rest = [self.forecast(k) for k in tenants if k != key]
            target = self._best_card(key, card, in_use_only=False)
            new_card = target is None or not self.cards[target]
            spent = not self.may_move(key)
            need = self.forecast(key).need
            options.append((not holds(rest, self.rules), new_card, spent, need, key, target))
        if not options:
            return None
        *_, key, target = min(options, key=lambda o: o[:5])
        if target is None:
            if self.pinned:
                return None
            target = self._add_card()
        return key, target

    def _consolidate(self, key: str, cause: str) -> bool:
        """Move ``key``, alone on its card, to the fullest card in use that admits it, when
        its move budget allows."""
        card = self.card_of[key]
        if not self.consolidate or len(self.cards[card]) != 1 or not self.may_move(key):
            return False
        target = self._best_card(key, card)
        if target is None:
            return False
        self._move(key, target, cause)
        self._divide(target, key)
        return True

    def _consolidate_lone(self, card: str) -> None:
        if len(self.cards[card]) == 1:
            (lone,) = self.cards[card]
            self._consolidate(lone, "lone")

    def relieve_memory(self, keys: Iterable[str]) -> list[str]:
        """The cards of ``keys`` (tenants whose forecasts just changed) that are short of
        memory move tenants off at once (memory first: never withheld, never waiting for the
        tidy). Returns the workloads moved."""
        moved: list[str] = []
        for card in sorted({self.card_of[k] for k in keys if k in self.card_of}):
            if self._memory_short(card):
                moved += self._relieve(card, "overflow")
        return moved

    def tidy(self) -> list[str]:
        """What the forecasts, as they changed since the last change, ask of the cards: a card
        that no longer keeps its tenants moves them off (:meth:`_relieve`); then, within the
        move budgets, a workload alone on its card moves to the fullest card in use that
        admits it, and a card whose tenants the others admit is emptied. Returns the
        workloads moved."""
        moved = []
        for card in list(self.cards):
            if not self._keeps(card):
                moved += self._relieve(card, "overflow")
        if not self.consolidate:
            return moved
        if self.move_rules.planner:
            return moved + self._planned()
        if self.move_rules.deferred:
            for card in sorted(self.cards, key=lambda c: (self._load(c), c)):
                if len(self.cards[card]) == 1:
                    (lone,) = self.cards[card]
                    if self._consolidate(lone, "lone"):
                        moved.append(lone)
        if self.move_rules.drain:
            moved += self._drain()
        return moved

    def _planned(self) -> list[str]:
        """The consolidation planner's plan for the cards as they are, carried out (the
        actuator's: :func:`~fracpilot_libs.placement.consolidation.consolidation_plan` with the
        pooled card budgets; a workload with no move left in its budget is a pod that may not
        be evicted). Returns the workloads moved."""
        gpus = tuple(
            Gpu(uuid=card, node=self.node_of(card), memory_bytes=self.memory_bytes)
            for card in self.cards
        )
        placements, key_of = [], {}
        forecasts: dict[str, TenantForecast] = {}
        protected: dict[str, dict[str, str]] = {}
        for key, card in self.card_of.items():
            ref, pod = self.pods[key]
            held = max(self.fraction_of.get(key, 0.0), EPS)
            placement = Placement(workload=ref, pod=pod, gpu_uuid=card, fraction=held)
            placements.append(placement)
            key_of[placement.pod_key] = key
            forecasts[placement.pod_key] = self.forecast(key)
            if not self.may_move(key):
                protected[placement.pod_key] = {SAFE_TO_EVICT: "false"}
        self.planned_times = [t for t in self.planned_times if self.now - t < HOUR_S]
        per_hour = self.move_rules.planner_moves_per_hour
        left = len(self.card_of) if per_hour is None else per_hour - len(self.planned_times)
        if left <= 0:
            return []
        plan = consolidation_plan(
            ClusterState(gpus=gpus, placements=tuple(placements)),
            max_moves=left,
            pod_annotations=protected,
            card_budget=pooled_card_budget(forecasts, self.rules),
            spread=False,
        )
        moved, touched = [], set()
        for step in plan.moves:
            key = key_of[step.pod_key]
            touched.add(self._move(key, step.to_gpu, "planned"))
            self.planned_times.append(self.now)
            touched.add(step.to_gpu)
            moved.append(key)
        for card in sorted(touched):
            self._divide(card, None)
        return moved

    def _drain(self) -> list[str]:
        """Empty the card in use with the smallest budget when the other cards in use admit
        all its tenants and their move budgets allow (each moved to the fullest card that
        admits it, largest first): one card fewer for a recreate per tenant. At most one card
        per call."""
        in_use = [c for c, ts in self.cards.items() if ts]
        if len(in_use) < 2:
            return []
        load = {c: self._load(c) for c in in_use}
        for card in sorted(in_use, key=lambda c: (load[c], c)):
            tenants = sorted(self.cards[card], key=lambda k: (-self.forecast(k).need, k))
            if len(tenants) > self.move_rules.drain_most:
                continue
            if not all(self.may_move(k) for k in tenants):
                continue
            plan: dict[str, str] = {}
            for key in tenants:
                target = self._best_card(key, card, plan)
                if target is None:
                    break
                plan[key] = target
            else:
                for key, target in plan.items():
                    self._move(key, target, "drain")
                for target in sorted(set(plan.values())):
                    self._divide(target, None)
                return list(plan)
        return []

    def cards_in_use(self) -> int:
        return sum(1 for tenants in self.cards.values() if tenants)
