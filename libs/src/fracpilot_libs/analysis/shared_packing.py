"""Packed replay where memory is shared (``--isolation shared``): cards sized by their tenants.

The replay loop is :func:`fracpilot_libs.analysis.packing_replay.replay_packed`; with
``shared`` isolation it places workloads through :class:`SharedCluster` instead of the
actuator's fraction planner. Each workload's engine sizes its own *need* (the policy's fraction
without per-pod memory headroom: the :data:`SHARED_HEADROOM` fields) and keeps its jump
statistic (:class:`TenantSizer`); the card planner
(:mod:`fracpilot_libs.placement.card_budget`) decides which cards hold which tenants (their
needs plus the card's one pooled headroom and burst budget fit in 1.0) and divides each card
into accounted fractions that sum to at most 1.0.

- A workload's need changes only when its engine decides (its hysteresis and resize budget);
  it then stays on its card when the card still holds its tenants (in place), else moves to the
  best-fitting card that does (one recreate), else to a new card.
- Re-dividing a card among its tenants (a tenant came, left or changed) is an annotation patch
  in place, no restart: counted as *re-divisions*, apart from the workload's own resizes.
- A workload left alone on its card moves to the best-fitting card in use that holds it, as
  the fraction planner's consolidation does.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fracpilot_libs.contracts import PlanKind, Policy, UsageSample, WorkloadRef
from fracpilot_libs.placement.card_budget import CardRules, TenantForecast, budget, divide, fits
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.forecast import jump_after
from fracpilot_libs.sizing.state import WorkloadState

# The policy fields a shared-isolation engine sizes with: no per-pod memory headroom (the
# card's pooled headroom replaces it).
SHARED_HEADROOM = {"memory_margin": 0.0, "memory_min_headroom": 0.0}


# The resize budget a mode applies when the policy sets none (resizes per workload in 24 h).
MODE_RESIZE_BUDGET = 4.0


def with_resize_budget(policy: Policy) -> Policy:
    """``policy`` with the modes' resize budget, unless it sets its own."""
    if "resize_budget_per_day" in policy.model_fields_set:
        return policy
    return policy.model_copy(update={"resize_budget_per_day": MODE_RESIZE_BUDGET})


def shared_policy(policy: Policy) -> Policy:
    """``policy`` as a tenant's engine uses it under shared isolation: no per-pod headroom,
    and the modes' resize budget unless it sets one."""
    return with_resize_budget(policy.model_copy(update=SHARED_HEADROOM))


@dataclass
class TenantState:
    """A workload's engine state and its jump statistic (updated in place, for speed)."""

    engine: WorkloadState = field(default_factory=WorkloadState)
    jump: float = 0.0
    first_seen: float | None = None


@dataclass(frozen=True)
class TenantSizer:
    """The engine under ``policy`` (as :func:`shared_policy` makes it), keeping each workload's
    jump statistic beside its state (:func:`fracpilot_libs.sizing.forecast.jump_after`)."""

    policy: Policy
    name: str = "fracpilot"

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> TenantState:
        return TenantState()

    def step(self, state: TenantState, sample: UsageSample) -> tuple[TenantState, float | None]:
        now = sample.timestamp.timestamp()
        state.jump = jump_after(state.jump, state.engine, sample.memory_share, now, self.policy)
        if state.first_seen is None:
            state.first_seen = now
        state.engine, decision = decide(state.engine, sample, self.policy)
        return state, decision.new_fraction if decision else None


Forecasts = Callable[[str], TenantForecast]


class SharedCluster:
    """Identical cards, each holding the tenants the card planner admits, divided by it.

    ``forecast(key)`` is the workload's forecast as it stands (its need is the fraction its
    engine decided). The interface is the fraction cluster's
    (:class:`fracpilot_libs.analysis.packing_replay.ReplayCluster`) that the replay loop uses;
    :attr:`fraction_of` holds each tenant's accounted fraction after every change.
    """

    def __init__(
        self,
        memory_bytes: int,
        gpus: int | None,
        rules: CardRules,
        forecast: Forecasts,
        consolidate: bool = True,
    ) -> None:
        self.memory_bytes = memory_bytes
        self.rules = rules
        self.forecast = forecast
        self.consolidate = consolidate
        self.pinned = gpus is not None
        self.cards: dict[str, set[str]] = {}
        for _ in range(gpus or 0):
            self._add_card()
        self.card_of: dict[str, str] = {}
        self.fraction_of: dict[str, float] = {}
        self.neighbour_moves = 0
        self.redivisions = 0  # a tenant's accounted fraction changed by a neighbour's change
        self.tidy_lone = False  # tidy() consolidates lone workloads too (measured: no gain)
        self.drain = True  # tidy() empties a card whose tenants the others hold
        self.drain_most = 2  # ... of at most this many tenants (each one recreate)

    def _add_card(self) -> str:
        card = f"card-{len(self.cards):05d}"
        self.cards[card] = set()
        return card

    def _with(self, card: str, key: str) -> list[TenantForecast]:
        return [self.forecast(k) for k in self.cards[card] if k != key] + [self.forecast(key)]

    def _best_card(self, key: str, exclude: str | None, in_use_only: bool) -> str | None:
        """The fullest card (by budget) in use that holds ``key`` too, else (unless
        ``in_use_only``) an empty card; None when none does."""
        best, best_budget = None, -1.0
        empty = None
        for card, tenants in self.cards.items():
            if card == exclude:
                continue
            if not tenants:
                if empty is None:
                    empty = card
                continue
            candidate = self._with(card, key)
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

    def place(self, workload: WorkloadRef, pod: str, fraction: float) -> bool:
        """Put an arriving workload on the fullest card that holds it; False when none does
        on pinned cards."""
        key = workload.key
        card = self._best_card(key, None, in_use_only=False)
        if card is None:
            if self.pinned:
                return False
            card = self._add_card()
        self._put(key, card)
        self._divide(card, key)
        return True

    def resize(self, workload: WorkloadRef, fraction: float) -> PlanKind:
        """The workload's need changed (its forecast says so): in place when its card still
        holds its tenants, else a recreate on the fullest card that does (a new one when none
        does and cards may be added), else ``scale_up`` (refused). A workload then left alone
        moves to a card in use that holds it."""
        key = workload.key
        card = self.card_of[key]
        if fits([self.forecast(k) for k in self.cards[card]], self.rules):
            self._divide(card, key)
            kind = PlanKind.IN_PLACE
        else:
            target = self._best_card(key, card, in_use_only=False)
            if target is None:
                if self.pinned:
                    return PlanKind.SCALE_UP
                target = self._add_card()
            self._take(key)
            self._put(key, target)
            self._divide(card, None)
            self._divide(target, key)
            self._consolidate_lone(card)
            kind = PlanKind.RECREATE_ELSEWHERE
        lone = self.consolidate and len(self.cards[self.card_of[key]]) == 1
        if lone and self._consolidate(key):
            kind = PlanKind.RECREATE_ELSEWHERE
        return kind

    def release(self, workload: WorkloadRef) -> None:
        card = self._take(workload.key)
        self.fraction_of.pop(workload.key, None)
        self._divide(card, None)
        self._consolidate_lone(card)

    def _consolidate(self, key: str) -> bool:
        """Move ``key`` (alone on its card) to the fullest card in use that holds it."""
        card = self.card_of[key]
        target = self._best_card(key, card, in_use_only=True)
        if target is None:
            return False
        self._take(key)
        self._put(key, target)
        self._divide(target, key)
        return True

    def _consolidate_lone(self, card: str) -> None:
        if self.consolidate and len(self.cards[card]) == 1:
            (lone,) = self.cards[card]
            if self._consolidate(lone):
                self.neighbour_moves += 1

    def tidy(self) -> list[str]:
        """What the forecasts, as they changed since the last change, ask of the cards: a card
        whose tenants no longer fit moves its largest tenant to the fullest card that holds it
        (a new one when none does and cards may be added: memory first), and a workload alone
        on its card moves to the fullest card in use that holds it. Returns the workloads
        moved."""
        moved = []
        for card in list(self.cards):
            tenants = self.cards[card]
            if len(tenants) < 2 or fits([self.forecast(k) for k in tenants], self.rules):
                continue
            largest = max(sorted(tenants), key=lambda k: self.forecast(k).need)
            target = self._best_card(largest, card, in_use_only=False)
            if target is None:
                if self.pinned:
                    continue
                target = self._add_card()
            self._take(largest)
            self._put(largest, target)
            self._divide(card, None)
            self._divide(target, largest)
            moved.append(largest)
        if self.consolidate and self.drain:
            moved += self._drain()
        if self.consolidate and self.tidy_lone:
            for card in list(self.cards):
                if len(self.cards[card]) == 1:
                    (lone,) = self.cards[card]
                    if self._consolidate(lone):
                        moved.append(lone)
        return moved

    def _drain(self) -> list[str]:
        """Empty the card in use with the smallest budget when the other cards in use hold
        all its tenants (each moved to the fullest card that holds it, largest first): one
        card fewer for a recreate per tenant. At most one card per call."""
        in_use = [c for c, ts in self.cards.items() if ts]
        if len(in_use) < 2:
            return []
        load = {c: budget([self.forecast(k) for k in self.cards[c]], self.rules) for c in in_use}
        for card in sorted(in_use, key=lambda c: (load[c], c)):
            tenants = sorted(self.cards[card], key=lambda k: (-self.forecast(k).need, k))
            if len(tenants) > self.drain_most:
                continue
            plan: dict[str, str] = {}
            for key in tenants:
                target = self._best_card_with(key, card, plan)
                if target is None:
                    break
                plan[key] = target
            else:
                for key, target in plan.items():
                    self._take(key)
                    self._put(key, target)
                for target in sorted(set(plan.values())):
                    self._divide(target, None)
                return list(plan)
        return []

    def _best_card_with(self, key: str, exclude: str, planned: dict[str, str]) -> str | None:
        """The fullest card in use but ``exclude`` that holds ``key`` besides the tenants
        ``planned`` to move onto it."""
        best, best_budget = None, -1.0
        for card, tenants in self.cards.items():
            if card == exclude or not tenants:
                continue
            keys = [*tenants, *(k for k, c in planned.items() if c == card), key]
            candidate = [self.forecast(k) for k in keys]
            if not fits(candidate, self.rules):
                continue
            b = budget(candidate, self.rules)
            if b > best_budget:
                best, best_budget = card, b
        return best

    def cards_in_use(self) -> int:
        return sum(1 for tenants in self.cards.values() if tenants)
