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

- **Peaks pooled, as in the replay**, when every re-divided tenant's forecast (the deciding
  pod's included) carries its peak profile (:class:`~fracpilot_libs.contracts.PeakProfile`),
  all on one period: the card reserves its tenants' *joint* peak, the most they held together
  in one period (:data:`POOLED_RULES`), and each one's share is the budget in proportion to its
  need (it may hold less than its own peak: under shared isolation a fraction is accounting).
  The forecasts come from decisions made at different times (:mod:`~fracpilot_actuator.stores.
  forecasts`), so their windows differ: a tenant counts its need in every period of the card
  outside its own window (unknown there), and a profile's peak above its forecast's need is cut
  to it (:func:`card_profiles`), so the pooled budget is never above the summed one. A fixed
  co-tenant counts its fraction in every period.
- Else (a tenant young or from a decision service without profiles, periods that differ, or
  windows too far apart) the card's peaks are summed (:data:`LIVE_RULES`): each tenant gets at
  least its own predicted need. The division's text says which, and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fracpilot_libs.contracts import PROFILE_MAX_PERIODS, CardForecast
from fracpilot_libs.placement.card_budget import (
    EPS,
    CardRules,
    TenantForecast,
    budget,
    divide,
    fits,
    joint_peak,
)

# With every re-divided tenant's peak profile on one period: the card's joint peak (the
# replay's rules).
POOLED_RULES = CardRules()
# Without them: the peaks are summed and each tenant keeps its own need.
LIVE_RULES = CardRules(pooled_peaks=False)
STEP = 0.01  # KAI's gpu-fraction on hundredths (kai.py)
# The most periods a card's profiles may span together (forecasts up to a day apart, each
# over a day's window); wider, the peaks are summed.
CARD_MAX_PERIODS = 2 * PROFILE_MAX_PERIODS

Profile = tuple[tuple[int, float], ...]


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


def card_profiles(forecasts: Mapping[str, CardForecast]) -> dict[str, Profile] | str:
    """Each tenant's peak profile on the periods of the card (all its tenants' windows): its
    peak in each period of its own window (0 in one without samples: it held nothing then),
    cut to its need, and its need in every period outside it (unknown: it may peak there).
    A text saying why the peaks cannot be pooled: a tenant without a profile, periods that
    differ, windows too far apart."""
    bare = sorted(pod for pod, f in forecasts.items() if f.profile is None)
    if bare:
        return f"no peak profile in the forecast of {', '.join(bare)}"
    profiles = {pod: f.profile for pod, f in forecasts.items() if f.profile is not None}
    periods = sorted({p.period_s for p in profiles.values()})
    if len(periods) > 1:
        return f"peak profiles on different periods ({', '.join(f'{s:g}s' for s in periods)})"
    first = min(p.first for p in profiles.values())
    last = max(p.last for p in profiles.values())
    if last - first >= CARD_MAX_PERIODS:
        return f"peak profiles {last - first + 1} periods apart (at most {CARD_MAX_PERIODS})"
    out = {}
    for pod, p in profiles.items():
        need = tenant_forecast(forecasts[pod]).need
        own = {k: min(v, need) for k, v in p.peaks}
        out[pod] = tuple(
            (k, own.get(k, 0.0) if p.first <= k <= p.last else need) for k in range(first, last + 1)
        )
    return out


def fixed_need(fraction: float) -> TenantForecast:
    """A co-tenant whose fraction stays: all of it is its need (memory and compute)."""
    return TenantForecast(fraction, 0.0, fraction, 0.0)


def _g(value: float) -> str:
    return f"{round(value, 4):g}"


def divide_card(
    pod: str,
    forecast: CardForecast,
    co_tenants: Sequence[Tenant],
    rules: CardRules = POOLED_RULES,
) -> CardDivision | str:
    """The card divided among the deciding ``pod`` (its workload's ``forecast``) and its
    ``co_tenants``; a text saying why not when the card does not hold them. The peaks are
    pooled when ``rules`` say so and the profiles allow it (:func:`card_profiles`), else
    summed."""
    forecasts = {t.pod: t.forecast for t in co_tenants if t.forecast and not t.kept}
    forecasts[pod] = forecast
    moving = {k: tenant_forecast(f) for k, f in forecasts.items()}
    profiles = card_profiles(forecasts) if rules.pooled_peaks else "summed by the caller"
    if isinstance(profiles, str):
        rules = replace(rules, pooled_peaks=False)
        peaks = f"peaks summed: {profiles}"
    else:
        moving = {k: replace(t, profile=profiles[k]) for k, t in moving.items()}
        summed = sum(rules.up(t.need) for t in moving.values())
        peaks = (
            f"peaks pooled over {len(moving)} peak profiles: joint peak "
            f"{_g(rules.up(joint_peak(moving.values())))} where summed {_g(summed)}"
        )
    kept = [t for t in co_tenants if t.pod not in moving]
    fixed = sum(t.fraction for t in kept)
    everyone = [*moving.values(), *(fixed_need(t.fraction) for t in kept)]
    need = budget(everyone, rules)
    if not fits(everyone, rules):
        return (
            f"the card does not hold its tenants: their predicted needs with the pooled "
            f"headroom come to {_g(need)} of it ({len(moving)} re-divisible, {len(kept)} "
            f"keeping {_g(fixed)}; {peaks})"
        )
    # A share of the budget in proportion to the needs is 0 for a workload that needs nothing
    # yet: every pod holds at least one step of the grid (a fraction is never 0).
    shares = {k: max(v, STEP) for k, v in divide(moving, rules).items()}
    if sum(shares.values()) + fixed > 1.0 + EPS:
        return (
            f"the card does not hold its tenants at one step each at least: the division "
            f"would sum to {_g(sum(shares.values()) + fixed)} of it ({peaks})"
        )
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
        f"{_g(rules.headroom_factor)} x the largest jump, at least {_g(rules.headroom_floor)}; "
        f"{peaks}): {pod} gets {_g(target)}"
        + "".join(f"; {s.pod} {_g(s.before)} -> {_g(s.after)}" for s in changed)
        + (f"; {keeping}" if keeping else "")
    )
    return CardDivision(target, changed, need, fixed, text)
