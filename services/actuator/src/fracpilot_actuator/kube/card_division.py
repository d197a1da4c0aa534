"""One card divided among its tenants where memory is shared (``shared`` isolation). Pure.

Under KAI's GPU sharing without HAMi-core a pod's ``gpu-fraction`` is scheduler accounting:
the container may use more memory than it, and what fails is the card (docs/sizing.md). So a
decision for such a pod sizes its *card*: the deciding workload's forecast (what its engine
predicts, :class:`~fracpilot_libs.contracts.CardForecast`) and its co-tenants' go to the card
planner (:mod:`fracpilot_libs.placement.card_budget`, the code ``fracpilot replay --pack
--isolation shared`` runs), which says whether the card holds them with one pooled memory
headroom and one burst budget (:func:`~fracpilot_libs.placement.card_budget.fits`) and what
each one's accounted fraction is (:func:`~fracpilot_libs.placement.card_budget.divide`).

- A co-tenant with a forecast that may be changed (:attr:`Tenant.kept` empty) is re-divided:
  its new share is its budgeted share, never more.
- Any other co-tenant (no forecast, another namespace, opted out, enforced, ...) keeps its
  fraction: it counts as a fixed need of that size (memory and compute alike).
- The fractions on the card never sum above 1.0: the re-divided shares are rounded down to
  hundredths and the fixed ones are left out of the division (their room is set aside).

The live wire carries no peak profile, so the card's peaks are summed (``pooled_peaks`` off:
:data:`LIVE_RULES`), which gives each tenant at least its own predicted need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fracpilot_libs.contracts import CardForecast
from fracpilot_libs.placement.card_budget import (
    EPS,
    CardRules,
    TenantForecast,
    budget,
    divide,
    fits,
)

# No peak profiles on the wire: the peaks are summed and each tenant keeps its own need.
LIVE_RULES = CardRules(pooled_peaks=False)
STEP = 0.01  # KAI's gpu-fraction on hundredths (kai.py)


@dataclass(frozen=True)
class Tenant:
    """One co-tenant of the deciding pod on its GPU."""

    pod: str  # namespace/name
    fraction: float  # its accounted fraction now
    forecast: CardForecast | None = None  # its workload's latest; None: unknown
    kept: str = ""  # why its fraction may not change ("": it may be re-divided)

    @property
    def redivided(self) -> bool:
        return self.forecast is not None and not self.kept


@dataclass(frozen=True)
class NewShare:
    """A co-tenant's fraction re-divided."""

    pod: str
    before: float
    after: float


@dataclass(frozen=True)
class CardDivision:
    """What the card planner gives the deciding pod and its co-tenants."""

    target: float  # the deciding pod's accounted fraction
    shares: tuple[NewShare, ...]  # the co-tenants whose fraction changes
    budget: float  # what the card reserves for its tenants (<= 1.0)
    fixed: float  # the fractions of the co-tenants that keep theirs
    text: str  # how the card was divided, for the result and the Events


def tenant_forecast(forecast: CardForecast) -> TenantForecast:
    """The planner's forecast; a need of at least one hundredth (a KAI fraction is > 0)."""
    return TenantForecast(
        max(forecast.memory_peak, STEP), forecast.memory_jump, forecast.compute, forecast.burst
    )


def fixed_need(fraction: float) -> TenantForecast:
    """A co-tenant whose fraction stays: all of it is its need (memory and compute)."""
    return TenantForecast(fraction, 0.0, fraction, 0.0)


def _g(value: float) -> str:
    return f"{round(value, 4):g}"


def divide_card(
    pod: str,
    forecast: CardForecast,
    co_tenants: Sequence[Tenant],
    rules: CardRules = LIVE_RULES,
) -> CardDivision | str:
    """The card divided among the deciding ``pod`` (its workload's ``forecast``) and its
    ``co_tenants``; a text saying why not when the card does not hold them."""
    moving = {t.pod: tenant_forecast(t.forecast) for t in co_tenants if t.forecast and not t.kept}
    moving[pod] = tenant_forecast(forecast)
    kept = [t for t in co_tenants if t.pod not in moving]
    fixed = sum(t.fraction for t in kept)
    everyone = [*moving.values(), *(fixed_need(t.fraction) for t in kept)]
    need = budget(everyone, rules)
    if not fits(everyone, rules):
        return (
            f"the card does not hold its tenants: their predicted needs with the pooled "
            f"headroom come to {_g(need)} of it ({len(moving)} re-divisible, {len(kept)} "
            f"keeping {_g(fixed)})"
        )
    shares = divide(moving, rules)
    if sum(shares.values()) + fixed > 1.0 + EPS:  # never: fits() holds; kept as a guard
        return f"the division would sum to {_g(sum(shares.values()) + fixed)} of the card"
    target = shares.pop(pod)
    before = {t.pod: t.fraction for t in co_tenants}
    changed = tuple(
        NewShare(k, before[k], v)
        for k, v in sorted(shares.items())
        if abs(v - before[k]) >= STEP - EPS
    )
    keeping = "; ".join(f"{t.pod} keeps {_g(t.fraction)} ({t.kept or 'no forecast'})" for t in kept)
    text = (
        f"card budget {_g(need)} (predicted needs + one pooled headroom of "
        f"{_g(rules.headroom_factor)} x the largest jump, at least {_g(rules.headroom_floor)}): "
        f"{pod} gets {_g(target)}"
        + "".join(f"; {s.pod} {_g(s.before)} -> {_g(s.after)}" for s in changed)
        + (f"; {keeping}" if keeping else "")
    )
    return CardDivision(target, changed, need, fixed, text)
