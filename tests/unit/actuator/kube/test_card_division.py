"""The pure card division: one card shared by a deciding pod and its co-tenants."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from fracpilot_actuator.kube.card_division import (
    LIVE_RULES,
    POOLED_RULES,
    CardDivision,
    Tenant,
    divide_card,
    tenant_forecast,
)
from fracpilot_libs.contracts import CardForecast, PeakProfile
from fracpilot_libs.placement.card_budget import pooled_headroom

EPS = 1e-9

hundredths = st.integers(1, 60).map(lambda n: n / 100)
forecasts = st.builds(
    CardForecast,
    memory_peak=st.floats(0.0, 0.6),
    memory_jump=st.floats(0.0, 0.3),
    compute=st.floats(0.0, 0.6),
    burst=st.floats(0.0, 0.3),
)


@st.composite
def co_tenants(draw: st.DrawFn) -> list[Tenant]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        forecast = draw(st.none() | forecasts)
        kept = draw(st.sampled_from(["", "", "opted out"]))
        out.append(Tenant(f"ns/t{i}", draw(hundredths), forecast, kept))
    return out


@settings(max_examples=400, deadline=None)
@given(forecast=forecasts, tenants=co_tenants())
def test_a_division_never_sums_above_one_and_covers_the_deciding_need(
    forecast: CardForecast, tenants: list[Tenant]
) -> None:
    got = divide_card("ns/me", forecast, tenants)
    if isinstance(got, str):
        assert "does not hold" in got
        return
    after = {t.pod: t.fraction for t in tenants} | {s.pod: s.after for s in got.shares}
    assert got.target + sum(after.values()) <= 1.0 + EPS
    assert got.target + EPS >= tenant_forecast(forecast).need  # its predicted need
    assert got.target > 0
    for t in tenants:
        if not t.redivided:  # no forecast, or not to be changed: keeps its share
            assert after[t.pod] == t.fraction
        else:
            need = tenant_forecast(t.forecast).need if t.forecast else 0.0
            assert after[t.pod] + EPS >= need
    assert all(abs(s.after - s.before) >= 0.01 - EPS for s in got.shares)


@settings(max_examples=200, deadline=None)
@given(forecast=forecasts, tenants=co_tenants())
def test_a_card_that_does_not_hold_its_tenants_is_not_divided(
    forecast: CardForecast, tenants: list[Tenant]
) -> None:
    got = divide_card("ns/me", forecast, tenants)
    fixed = sum(t.fraction for t in tenants if not t.redivided)
    needs = tenant_forecast(forecast).need + sum(
        tenant_forecast(t.forecast).need for t in tenants if t.redivided and t.forecast
    )
    if fixed + needs + LIVE_RULES.headroom_floor > 1.0 + 1e-6:  # the floor alone: too much
        assert isinstance(got, str)


def test_two_tenants_share_one_pooled_headroom() -> None:
    me = CardForecast(memory_peak=0.3, memory_jump=0.1, compute=0.1)
    other = CardForecast(memory_peak=0.2, memory_jump=0.3, compute=0.1)
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.6, other)])
    assert isinstance(got, CardDivision)
    # needs 0.3 + 0.2; pooled headroom 0.5 x 0.3 = 0.15, shared in proportion to the jumps
    assert got.target == 0.33
    [share] = got.shares
    assert (share.pod, share.before, share.after) == ("ns/other", 0.6, 0.31)
    assert abs(got.budget - 0.65) < 1e-9
    assert "ns/other 0.6 -> 0.31" in got.text


def test_a_co_tenant_without_forecast_keeps_its_fraction_and_its_room() -> None:
    me = CardForecast(memory_peak=0.3, memory_jump=0.1, compute=0.1)
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.5)])
    assert isinstance(got, CardDivision)
    assert got.shares == ()
    assert got.target == 0.35  # 0.3 + the floor 0.05 of pooled headroom
    assert "ns/other keeps 0.5 (no forecast)" in got.text
    too_big = CardForecast(memory_peak=0.5, memory_jump=0.1, compute=0.1)
    assert isinstance(divide_card("ns/me", too_big, [Tenant("ns/other", 0.5)]), str)


# --- peaks pooled over the tenants' peak profiles ----------------------------------------------

HOUR = 3600.0
BASE = 490_000  # a period index of 2025 on the hourly clock


@st.composite
def profiled(draw: st.DrawFn) -> CardForecast:
    """A forecast with a profile over a day's window ending within a day of BASE + 24."""
    last = BASE + 24 + draw(st.integers(-24, 0))
    first = last - 24
    periods = sorted(draw(st.sets(st.integers(first, last), max_size=25)))
    peaks = tuple((k, draw(st.floats(0.0, 0.6))) for k in periods)
    forecast = draw(forecasts)
    memory_peak = max([forecast.memory_peak, *(v for _, v in peaks)])
    if draw(st.booleans()):  # a peak above the forecast's (it is cut to the need)
        memory_peak = forecast.memory_peak
    profile = PeakProfile(period_s=HOUR, first=first, last=last, peaks=peaks)
    return forecast.model_copy(update={"memory_peak": memory_peak, "profile": profile})


@st.composite
def profiled_co_tenants(draw: st.DrawFn) -> list[Tenant]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        forecast = draw(st.none() | profiled())
        kept = draw(st.sampled_from(["", "", "", "opted out"]))
        out.append(Tenant(f"ns/t{i}", draw(hundredths), forecast, kept))
    return out


def brute_joint_peak(forecasts: list[CardForecast]) -> float:
    """The most the tenants may hold together in one period of the card: a tenant holds its
    profile's peak in its window (cut to its need) and its need outside it."""
    profiles = [f.profile for f in forecasts if f.profile is not None]
    first, last = min(p.first for p in profiles), max(p.last for p in profiles)
    most = 0.0
    for k in range(first, last + 1):
        held = 0.0
        for f in forecasts:
            assert f.profile is not None
            need = tenant_forecast(f).need
            if f.profile.first <= k <= f.profile.last:
                held += min(need, dict(f.profile.peaks).get(k, 0.0))
            else:
                held += need
        most = max(most, held)
    return most


_IDLE = PeakProfile(period_s=3600.0, first=490000, last=490024, peaks=())


@settings(max_examples=400, deadline=None)
@given(forecast=profiled(), tenants=profiled_co_tenants())
@example(  # found by CI: a workload that needs nothing yet got 0 of the card
    forecast=CardForecast(memory_peak=0.0, memory_jump=0.0, compute=0.0, profile=_IDLE),
    tenants=[
        Tenant(
            pod="ns/t0",
            fraction=0.01,
            forecast=CardForecast(memory_peak=0.0, memory_jump=0.0, compute=0.5, profile=_IDLE),
        )
    ],
)
def test_pooled_peaks_never_sum_above_one_and_cover_the_joint_peak(
    forecast: CardForecast, tenants: list[Tenant]
) -> None:
    got = divide_card("ns/me", forecast, tenants)
    summed = divide_card("ns/me", forecast, tenants, LIVE_RULES)
    if isinstance(got, str):
        assert "does not hold" in got
        assert isinstance(summed, str)  # what holds with summed peaks holds pooled
        return
    assert "peaks pooled" in got.text
    after = {t.pod: t.fraction for t in tenants} | {s.pod: s.after for s in got.shares}
    assert got.target + sum(after.values()) <= 1.0 + EPS
    assert got.target > 0
    redivided = [forecast, *(t.forecast for t in tenants if t.redivided and t.forecast)]
    headroom = pooled_headroom([tenant_forecast(f) for f in redivided], POOLED_RULES)
    fixed = sum(t.fraction for t in tenants if not t.redivided)
    # the card's budget: the joint peak of the profiles (and the fixed shares) + the headroom
    assert got.budget + EPS >= brute_joint_peak(redivided) + fixed + headroom
    if not isinstance(summed, str):
        assert got.budget <= summed.budget + EPS  # never above the summed peaks' budget
    for t in tenants:
        if not t.redivided:
            assert after[t.pod] == t.fraction


def test_peaks_that_never_coincided_are_reserved_once() -> None:
    # a night batch and a day service: 0.5 each, never in the same hour
    night = PeakProfile(
        period_s=HOUR, first=BASE, last=BASE + 24, peaks=((BASE + 2, 0.5), (BASE + 14, 0.1))
    )
    day = PeakProfile(
        period_s=HOUR, first=BASE, last=BASE + 24, peaks=((BASE + 2, 0.1), (BASE + 14, 0.5))
    )
    me = CardForecast(memory_peak=0.5, memory_jump=0.1, compute=0.1, profile=night)
    other = CardForecast(memory_peak=0.5, memory_jump=0.1, compute=0.1, profile=day)
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.5, other)])
    assert isinstance(got, CardDivision)
    # joint peak 0.6 + one pooled headroom 0.05: 0.65 of the card, shared by need
    assert abs(got.budget - 0.65) < 1e-9
    assert got.target == 0.32
    assert [(s.pod, s.after) for s in got.shares] == [("ns/other", 0.32)]
    assert "peaks pooled over 2 peak profiles: joint peak 0.6 where summed 1" in got.text
    # summed, the same two do not fit on one card
    assert isinstance(divide_card("ns/me", me, [Tenant("ns/other", 0.5, other)], LIVE_RULES), str)


def test_a_tenant_outside_its_window_counts_its_need() -> None:
    # the co-tenant's forecast is 12 h old: in the last 12 h of the card it may have peaked
    night = PeakProfile(period_s=HOUR, first=BASE + 12, last=BASE + 36, peaks=((BASE + 30, 0.5),))
    stale = PeakProfile(period_s=HOUR, first=BASE, last=BASE + 24, peaks=((BASE + 2, 0.5),))
    me = CardForecast(memory_peak=0.5, memory_jump=0.1, compute=0.1, profile=night)
    other = CardForecast(memory_peak=0.5, memory_jump=0.1, compute=0.1, profile=stale)
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.5, other)])
    assert isinstance(got, str)  # period BASE + 30: 0.5 + its need 0.5, and the headroom
    assert "joint peak 1 where summed 1" in got


def test_without_every_profile_on_one_period_the_peaks_are_summed() -> None:
    hourly = PeakProfile(period_s=HOUR, first=BASE, last=BASE + 24, peaks=((BASE, 0.3),))
    me = CardForecast(memory_peak=0.3, memory_jump=0.1, compute=0.1, profile=hourly)
    young = CardForecast(memory_peak=0.2, memory_jump=0.3, compute=0.1)
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.6, young)])
    assert isinstance(got, CardDivision)
    assert "peaks summed: no peak profile in the forecast of ns/other" in got.text
    assert got.target == 0.33  # as test_two_tenants_share_one_pooled_headroom
    half = hourly.model_copy(update={"period_s": HOUR / 2})
    other = young.model_copy(update={"profile": half})
    got = divide_card("ns/me", me, [Tenant("ns/other", 0.6, other)])
    assert isinstance(got, CardDivision)
    assert "peaks summed: peak profiles on different periods (1800s, 3600s)" in got.text
    far = hourly.model_copy(update={"first": BASE + 200, "last": BASE + 224, "peaks": ()})
    got = divide_card(
        "ns/me", me, [Tenant("ns/other", 0.6, young.model_copy(update={"profile": far}))]
    )
    assert isinstance(got, CardDivision)
    assert "periods apart" in got.text
