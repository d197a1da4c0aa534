"""The peak profile the replay and the decision service keep (sizing/peak_profile.py): exact
per period of the shared clock, bounded, and no copy when a sample changes nothing."""

from __future__ import annotations

import math
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.peak_profile import (
    NO_PROFILE,
    in_window,
    profile_period,
    window_first,
    with_peak,
)
from fracpilot_libs.sizing.state import MEMORY_SLOTS

POLICY = Policy()
PERIOD = profile_period(POLICY)
T0 = 1_750_000_000.0


def brute_force(samples: list[tuple[float, float]], now: float) -> tuple[tuple[int, float], ...]:
    """The peak of every period of the window before ``now`` that holds a sample."""
    first = window_first(now, POLICY)
    peaks: dict[int, float] = {}
    for at, share in samples:
        k = math.floor(at / PERIOD)
        if k >= first:
            peaks[k] = max(peaks.get(k, -1.0), share)
    return tuple(sorted(peaks.items()))


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(-3 * 3600, 2 * 3600), st.floats(0.0, 1.0)), min_size=1, max_size=80
    ),
    late=st.floats(0.0, 3 * 24 * 3600),
)
def test_the_profile_is_the_peak_of_every_period_in_the_window(
    steps: list[tuple[float, float]], late: float
) -> None:
    # mostly forward in time, sometimes a sample delivered late (a negative step)
    profile, at, seen = NO_PROFILE, T0, []
    newest = T0
    for step, share in steps:
        at = max(T0, at + step)
        old, copy = profile, array("d", profile)
        profile = with_peak(profile, share, at, PERIOD)
        assert old == copy  # never mutated in place (states share it)
        seen.append((at, share))
        newest = max(newest, at)
        assert len(profile) <= 2 * (MEMORY_SLOTS + 2)
        periods = profile[0::2]
        assert list(periods) == sorted(set(periods))
        for now in (newest, newest + late):
            assert in_window(profile, now, POLICY) == brute_force(seen, now)


def test_a_sample_at_or_below_its_periods_peak_returns_the_same_profile() -> None:
    profile = with_peak(NO_PROFILE, 0.4, T0, PERIOD)
    assert with_peak(profile, 0.4, T0 + 60, PERIOD) is profile
    assert with_peak(profile, 0.1, T0 + 120, PERIOD) is profile
    higher = with_peak(profile, 0.5, T0 + 180, PERIOD)
    assert higher is not profile
    assert list(profile) == [math.floor(T0 / PERIOD), 0.4]  # the old one unchanged
    assert list(higher) == [math.floor(T0 / PERIOD), 0.5]
    assert len(NO_PROFILE) == 0


def test_a_sample_too_old_for_any_window_is_dropped() -> None:
    profile = with_peak(NO_PROFILE, 0.2, T0, PERIOD)
    old = T0 - (MEMORY_SLOTS + 3) * PERIOD
    assert with_peak(profile, 0.9, old, PERIOD) is profile
