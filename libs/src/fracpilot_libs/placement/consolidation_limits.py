"""What a consolidation plan must respect besides the scheduler, as data: PodDisruptionBudgets
(:class:`DisruptionBudget`), KAI gangs (:class:`Gang`) and shared isolation's card budgets
(:data:`CardBudget`, :func:`pooled_card_budget`). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fracpilot_libs.placement.card_budget import CardRules, TenantForecast, divide, fits


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget as the plan needs it: how many of its pods may be evicted now
    (``status.disruptionsAllowed``) and which pods (``namespace/name``) it selects."""

    name: str
    allowed: int
    pods: frozenset[str]


@dataclass(frozen=True, slots=True)
class Gang:
    """A KAI PodGroup: its ``minMember``, how many of its members run, and which pods they are."""

    name: str
    min_member: int
    running: int
    pods: frozenset[str]

    @property
    def may_lose(self) -> int | None:
        """How many members one plan may move (None: any; a group of one pod is its own)."""
        return None if self.min_member <= 1 else max(0, self.running - self.min_member)


CardBudget = Callable[[str, Mapping[str, float]], Mapping[str, float] | None]
"""Each tenant's budgeted share of a card: ``budget(gpu_uuid, {pod_key: fraction})`` for the
tenants the card would hold, None when the card does not hold them (shared isolation)."""


def pooled_card_budget(
    forecasts: Mapping[str, TenantForecast], rules: CardRules | None = None
) -> CardBudget:
    """The card budget of :mod:`~fracpilot_libs.placement.card_budget` (pooled headroom) from
    each pod's forecast; a pod without one needs exactly its fraction, with no jump."""
    card_rules = rules or CardRules()

    def budget(gpu_uuid: str, tenants: Mapping[str, float]) -> Mapping[str, float] | None:
        del gpu_uuid  # every card is one whole GPU here
        known = {
            k: forecasts.get(k) or TenantForecast(memory_peak=f, memory_jump=0.0, compute=f)
            for k, f in tenants.items()
        }
        if not fits(known.values(), card_rules):
            return None
        return divide(known, card_rules)

    return budget
