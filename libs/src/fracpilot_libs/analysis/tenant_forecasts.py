"""Each tenant's forecast for the card planner in the packed replay under shared isolation.

:class:`TenantForecasts` is the ``forecast`` a
:class:`~fracpilot_libs.analysis.shared_packing.SharedCluster` reads: a workload's need is the
fraction its engine decided, a young workload's what it has shown plus :data:`YOUNG_MARGIN`,
with at least the population's prior as its jump. Pure: the replay sets the instant.
"""

from __future__ import annotations

from fracpilot_libs.analysis.packed_workload import PackedWorkload
from fracpilot_libs.analysis.tenant_sizing import TenantState
from fracpilot_libs.contracts import Policy
from fracpilot_libs.placement.card_budget import TenantForecast
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.forecast import forecast_of, population_prior

# A young workload's need under shared isolation: the most memory it has shown plus this (its
# engine still holds what the workload asked for, often a whole card). Pods that start late in
# the GenAI trace load their model in their first minutes: 0.2-0.3 of the card. A card admits
# it only with YOUNG_SPARE more free, which it may then use before anyone moves (hysteresis:
# a young workload's memory still climbs). Chosen on half the GenAI trace's pods
# (docs/sizing.md): margin 0.3 and no spare saved 0.6 points fewer card-hours there, at 0.4
# more moves per workload-day.
YOUNG_MARGIN = 0.2
YOUNG_SPARE = 0.1


class TenantForecasts:
    """Each workload's forecast for the card planner, as it stands at the instant set by
    :meth:`at` (cached for that instant): its need is the fraction its engine decided; a
    workload with less than the policy's ``memory_headroom.warmup`` of history takes at least
    the population prior as its jump."""

    def __init__(self, workloads: list[PackedWorkload], policy: Policy) -> None:
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
