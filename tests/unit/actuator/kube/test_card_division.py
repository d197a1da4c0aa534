"""The pure card division: one card shared by a deciding pod and its co-tenants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_actuator.kube.card_division import (
    LIVE_RULES,
    CardDivision,
    Tenant,
    divide_card,
    tenant_forecast,
)
from fracpilot_libs.contracts import CardForecast

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
