"""The latest card forecast of each workload, as its last decision carried it (in memory).

The card division (:mod:`fracpilot_actuator.kube.card_division`) needs the co-tenants'
forecasts, which come only with their own decisions. In memory only: a restarted actuator
(or a new leader) knows none, and co-tenants keep their fractions until they decide again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from fracpilot_libs.contracts import CardForecast, FractionDecision, MemoryIsolation, Mode

MAX_AGE = timedelta(hours=24)  # an older forecast is not trusted to shrink a co-tenant
OwnerKey = tuple[str, str, str]  # namespace, kind, name


@dataclass(frozen=True)
class KnownForecast:
    forecast: CardForecast
    decided_at: datetime
    mode: Mode  # the policy's, as the decision carried it
    isolation: MemoryIsolation = MemoryIsolation.AUTO  # the policy's (consolidation's shrinks)


class ForecastBook:
    """The last decision's forecast per workload."""

    def __init__(self) -> None:
        self._latest: dict[OwnerKey, KnownForecast] = {}

    def record(self, decision: FractionDecision) -> None:
        wl, forecast = decision.workload, decision.forecast
        if forecast is None:
            return
        key = (wl.namespace, wl.owner_kind, wl.owner_name)
        known = self._latest.get(key)
        if known is None or known.decided_at <= decision.decided_at:
            self._latest[key] = KnownForecast(
                forecast, decision.decided_at, decision.mode, decision.isolation
            )

    def __len__(self) -> int:
        return len(self._latest)

    def get(self, key: OwnerKey, now: datetime) -> KnownForecast | None:
        known = self._latest.get(key)
        return known if known is not None and now - known.decided_at <= MAX_AGE else None
