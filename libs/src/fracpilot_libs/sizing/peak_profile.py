"""A workload's memory peak profile: its exact peak per period, on the clock all workloads share.

Where memory is shared, the card planner budgets the card's *joint* peak: the most its tenants
held together in any one period (:func:`fracpilot_libs.placement.card_budget.joint_peak`).
That needs each tenant's peak per period on one clock: period ``k`` is ``[k, k + 1)`` periods
since the epoch, a period is the engine's memory slot (:func:`profile_period`: 1 h of a 24 h
window). The engine's own slots start where a workload's samples fell, so they cannot give it
exactly; the profile is kept beside them, sample by sample, by :func:`with_peak`: the engine's
``observe`` keeps it in the state (so the decision service's states carry it), the replay's
``shared_packing.TenantSizer`` beside the state; both read it with :func:`in_window`.

A profile is flat, as the engine's slots are: ``array('d')`` of period, peak, period, peak...,
oldest first, holding the periods a window read now or later may still need (at most
``MEMORY_SLOTS + 2``). Pure; a profile is never mutated: :func:`with_peak` returns the same
array when the sample changes nothing (most samples: one comparison), a new one otherwise.
"""

from __future__ import annotations

import math
from array import array

from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.state import MEMORY_SLOTS

NO_PROFILE: array[float] = array("d")  # shared by every workload without one (never mutated)
# Periods kept before the newest: a window read at or after the newest sample starts at most
# MEMORY_SLOTS periods back; one more for the float rounding of its first period.
_BACK = MEMORY_SLOTS + 1


def profile_period(policy: Policy) -> float:
    """The period of a peak profile: the engine's memory slot (1 h of a 24 h window)."""
    return policy.memory_window_s / MEMORY_SLOTS


def with_peak(profile: array[float], share: float, now: float, period_s: float) -> array[float]:
    """``profile`` after a sample of ``share`` memory at ``now``: its period's peak raised to
    ``share`` (the same array when it is not above it), periods too old for any later window
    dropped."""
    period = math.floor(now / period_s)
    n = len(profile)
    if n and profile[n - 2] == period:  # the newest period: the usual case
        if share <= profile[n - 1]:
            return profile
        out = array("d", profile)
        out[n - 1] = share
        return out
    if not n or profile[n - 2] < period:  # a new period: the old ones out of reach dropped
        horizon = period - _BACK
        start = 0
        while start < n and profile[start] < horizon:
            start += 2
        out = profile[start:]
        out.append(period)
        out.append(share)
        return out
    # A sample delivered late, of an earlier period: kept if a window may still read it.
    if period < profile[n - 2] - _BACK:
        return profile
    i = 0
    while profile[i] < period:
        i += 2
    if profile[i] == period:
        if share <= profile[i + 1]:
            return profile
        out = array("d", profile)
        out[i + 1] = share
        return out
    out = profile[:i]
    out.append(period)
    out.append(share)
    out.extend(profile[i:])
    return out


def window_first(now: float, policy: Policy) -> int:
    """The first period of the memory window before ``now``: the one its start falls in."""
    return math.floor((now - policy.memory_window_s) / profile_period(policy))


def in_window(profile: array[float], now: float, policy: Policy) -> tuple[tuple[int, float], ...]:
    """The profile over the memory window before ``now``, oldest period first: (period, the
    peak of the samples in it), periods without samples left out."""
    first = window_first(now, policy)
    return tuple(
        (int(profile[i]), profile[i + 1]) for i in range(0, len(profile), 2) if profile[i] >= first
    )
