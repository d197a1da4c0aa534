"""What each decision publishes of the engine's prediction: its card forecast. Pure.

The actuator sizes the tenants of a card together where memory is not held per pod (``shared``
isolation: :mod:`fracpilot_libs.placement.card_budget`); it needs each workload's memory peak,
its jump statistic and a compute summary (:class:`~fracpilot_libs.contracts.CardForecast`).
The engine stays per workload: :func:`keep_jump` keeps the jump statistic in the state's
``memory_jump`` (checkpointed with it), which the engine itself updates only under a learned
headroom; the engine keeps the workload's exact memory peak per period of the shared clock in
the state's ``memory_profile`` (checkpointed too) with the replay's own function
(:func:`fracpilot_libs.sizing.peak_profile.with_peak`); and :func:`card_forecast` reads the
forecast from the state (:mod:`fracpilot_libs.sizing.forecast`, as ``fracpilot replay --pack
--isolation shared`` does), with the profile over the window, so that the actuator budgets a
card's joint peak as the replay does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fracpilot_libs.contracts import (
    PROFILE_PERIOD_S,
    CardForecast,
    MemoryHeadroomMode,
    PeakProfile,
    Policy,
)
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.forecast import (
    DEFAULT_PRIOR,
    forecast_of,
    jump_after,
    population_prior,
)
from fracpilot_libs.sizing.peak_profile import in_window, profile_period, window_first
from fracpilot_libs.sizing.state import WorkloadState, evolve

_LEARNED = MemoryHeadroomMode.LEARNED


def keep_jump(
    before: WorkloadState | None,
    after: WorkloadState,
    share: float,
    now: float,
    policy: Policy,
) -> WorkloadState:
    """``after`` (the engine's state once it observed a sample of ``share`` memory at ``now``)
    with the jump statistic updated from ``before`` (the state it observed the sample on)."""
    if before is None or policy.memory_headroom.mode is _LEARNED:
        return after  # no history to jump above, or the engine keeps it (with OOM signals)
    jump, slots = before.memory_jump, before.memory_slots
    # Cheap on the hot path: the trailing peak is at least the newest slot's (or there is
    # no slot in the window), so a sample within the jump of that slot changes nothing.
    if not slots or share - slots[-1] <= jump:
        return after
    new = jump_after(jump, before, share, now, policy)
    return after if new == after.memory_jump else evolve(after, memory_jump=new)


def _share(value: float) -> float:
    return min(1.0, max(0.0, value))


def young(state: WorkloadState, now: float, policy: Policy) -> bool:
    """Too little history to have shown its jumps (the learned headroom's warm-up)."""
    first = state.first_seen
    return first is None or now - first < policy.memory_headroom.warmup


def prior_of(states: Iterable[WorkloadState], now: float, policy: Policy) -> float:
    """The jump a workload without history is assumed to make: a high quantile of the jump
    statistics of the workloads that have history."""
    return population_prior(s.memory_jump for s in states if not young(s, now, policy))


def card_forecast(
    state: WorkloadState, policy: Policy, now: float, prior: float = DEFAULT_PRIOR
) -> CardForecast:
    """The workload's forecast: its memory peak over the window, its jump statistic (at least
    ``prior`` while it is young), the compute level the policy sizes it by and its burst, and
    its peak profile over the window (none while it is young: it has not shown its peaks, so
    its peak counts in every period, as in the replay)."""
    jump = state.memory_jump
    is_young = young(state, now, policy)
    if is_young:
        jump = max(jump, prior)
    level = need_of(state, policy).compute_need if state.samples else 0.0
    f = forecast_of(state, policy, jump, _share(level))
    return CardForecast(
        memory_peak=_share(f.memory_peak),
        memory_jump=_share(f.memory_jump),
        compute=_share(f.compute),
        burst=_share(f.burst),
        profile=None if is_young else profile_of(state, now, policy),
    )


def profile_of(state: WorkloadState, now: float, policy: Policy) -> PeakProfile | None:
    """The state's peak profile over the memory window before ``now``, as the wire has it
    (None for a memory window whose slots the wire does not take)."""
    period = profile_period(policy)
    if not PROFILE_PERIOD_S[0] <= period <= PROFILE_PERIOD_S[1]:
        return None
    return PeakProfile(
        period_s=period,
        first=window_first(now, policy),
        last=math.floor(now / profile_period(policy)),
        peaks=tuple((k, _share(v)) for k, v in in_window(state.memory_profile, now, policy)),
    )
