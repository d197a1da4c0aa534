"""The card planner of shared isolation (placement/card_budget.py): one pooled headroom per card,
fractions that never sum above 1.0, and a budget that covers the tenants' predicted peaks; the
shared cluster of the packed replay that runs it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.analysis.shared_packing import SharedCluster
from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.placement.card_budget import (
    CardRules,
    TenantForecast,
    budget,
    divide,
    fits,
    joint_peak,
    memory_budget,
    pooled_headroom,
)

PROPERTY = settings(max_examples=300, deadline=None)
EPS = 1e-9

share = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
small = st.floats(min_value=0.0, max_value=0.3, allow_nan=False)
profiles = st.lists(st.tuples(st.integers(0, 30), small), max_size=8).map(
    lambda ps: tuple(sorted(dict(ps).items()))
)
tenants = st.builds(
    TenantForecast,
    memory_peak=st.floats(min_value=0.0, max_value=0.7),
    memory_jump=small,
    compute=st.floats(min_value=0.0, max_value=0.5),
    burst=small,
    profile=profiles,
)
card_rules = st.builds(
    CardRules,
    headroom_factor=st.floats(min_value=0.0, max_value=2.0),
    headroom_floor=st.floats(min_value=0.0, max_value=0.2),
    pooled_peaks=st.booleans(),
)


def peaks_of(ts: list[TenantForecast], rules: CardRules) -> float:
    """The tenants' predicted peaks as the rules read them."""
    return joint_peak(ts) if rules.pooled_peaks else sum(t.need for t in ts)


@PROPERTY
@given(ts=st.lists(tenants, min_size=1, max_size=6), rules=card_rules)
def test_fractions_on_a_card_never_sum_above_one(
    ts: list[TenantForecast], rules: CardRules
) -> None:
    fractions = divide({f"w{i}": t for i, t in enumerate(ts)}, rules)
    assert set(fractions) == {f"w{i}" for i in range(len(ts))}
    if fits(ts, rules) or rules.pooled_peaks:
        assert sum(fractions.values()) <= 1.0 + EPS
    assert all(f >= 0.0 for f in fractions.values())


@PROPERTY
@given(ts=st.lists(tenants, min_size=1, max_size=6), rules=card_rules)
def test_a_card_that_holds_its_tenants_budgets_their_peaks_and_the_pooled_headroom(
    ts: list[TenantForecast], rules: CardRules
) -> None:
    if not fits(ts, rules):
        return
    headroom = pooled_headroom(ts, rules)
    assert headroom >= rules.headroom_factor * max(t.memory_jump for t in ts) - EPS
    assert headroom >= rules.headroom_floor - EPS
    assert memory_budget(ts, rules) >= peaks_of(ts, rules) + headroom - EPS
    assert budget(ts, rules) <= 1.0 + EPS
    # the memory the card leaves free of its tenants' peaks covers the pooled headroom
    assert 1.0 - peaks_of(ts, rules) >= headroom - EPS
    # compute: the levels and the one burst budget fit too
    assert sum(t.compute for t in ts) + max(t.burst for t in ts) <= 1.0 + EPS
    fractions = divide({f"w{i}": t for i, t in enumerate(ts)}, rules)
    if not rules.pooled_peaks:  # each holds at least its own need on the grid
        for i, t in enumerate(ts):
            assert fractions[f"w{i}"] >= rules.up(t.need) - EPS
    else:  # the fractions hand out the whole budget, but for the grid's rounding
        assert sum(fractions.values()) >= budget(ts, rules) - len(ts) * rules.step - EPS


@PROPERTY
@given(ts=st.lists(tenants, min_size=1, max_size=6))
def test_the_joint_peak_lies_between_the_largest_and_the_sum_of_the_peaks(
    ts: list[TenantForecast],
) -> None:
    own = [max((p for _, p in t.profile), default=0.0) if t.profile else t.need for t in ts]
    assert max(own) - EPS <= joint_peak(ts) <= sum(own) + EPS


def test_peaks_that_never_coincide_are_reserved_once() -> None:
    # a peaks in period 1, b in period 2: together they never hold more than 0.5
    a = TenantForecast(0.45, 0.05, 0.05, profile=((1, 0.45), (2, 0.05)))
    b = TenantForecast(0.45, 0.05, 0.05, profile=((1, 0.05), (2, 0.45)))
    pooled = CardRules(headroom_factor=1.0, headroom_floor=0.1, pooled_peaks=True)
    summed = CardRules(headroom_factor=1.0, headroom_floor=0.1, pooled_peaks=False)
    assert joint_peak([a, b]) == pytest.approx(0.5)
    assert memory_budget([a, b], pooled) == pytest.approx(0.6)
    assert memory_budget([a, b], summed) == pytest.approx(1.0)
    assert fits([a, b], pooled)
    assert fits([a, b], summed)
    c = TenantForecast(0.5, 0.05, 0.05, profile=((1, 0.05), (2, 0.5)))
    assert not fits([a, c], summed)  # 0.95 + 0.1
    assert fits([a, c], pooled)  # 0.55 + 0.1
    d = TenantForecast(0.5, 0.05, 0.05, profile=((1, 0.5), (2, 0.5)))
    assert not fits([a, d], pooled)  # 0.95 + 0.1: their peaks coincide in period 1
    assert divide({"a": a, "b": b}, pooled) == {"a": 0.3, "b": 0.3}
    assert divide({"a": a, "b": b}, summed) == {"a": 0.5, "b": 0.5}


def _ref(name: str) -> WorkloadRef:
    return WorkloadRef(cluster="t", namespace="ns", owner_name=name)


KA, KB = _ref("a").key, _ref("b").key


def test_the_shared_cluster_places_moves_and_re_divides_by_the_planner() -> None:
    forecasts = {
        KA: TenantForecast(0.4, 0.05, 0.1),
        KB: TenantForecast(0.4, 0.05, 0.1),
    }
    rules = CardRules(headroom_factor=1.0, headroom_floor=0.1, pooled_peaks=False)
    cluster = SharedCluster(1000, None, rules, lambda key: forecasts[key])
    a, b = _ref("a"), _ref("b")
    assert cluster.place(a, "a-0", 1.0)
    assert cluster.place(b, "b-0", 1.0)
    assert cluster.card_of[KA] == cluster.card_of[KB]  # 0.4 + 0.4 + 0.1 fits
    assert cluster.fraction_of == {KA: 0.45, KB: 0.45}  # headroom split by jump
    forecasts[KB] = TenantForecast(0.55, 0.05, 0.1)  # b's need grew: 0.95 + 0.1 > 1
    assert cluster.resize(b, 0.55) is PlanKind.RECREATE_ELSEWHERE
    assert cluster.card_of[KA] != cluster.card_of[KB]
    assert cluster.cards_in_use() == 2
    assert cluster.fraction_of == {KA: 0.5, KB: 0.65}  # alone: all the headroom
    forecasts[KB] = TenantForecast(0.3, 0.05, 0.1)  # shrank: b joins a's card again
    assert cluster.resize(b, 0.3) is PlanKind.RECREATE_ELSEWHERE
    assert cluster.cards_in_use() == 1
    assert sum(cluster.fraction_of.values()) <= 1.0
    cluster.release(a)
    assert cluster.fraction_of == {KB: 0.4}
    assert cluster.redivisions >= 1


def test_pinned_shared_cards_refuse_what_fits_nowhere() -> None:
    forecasts = {KA: TenantForecast(0.6, 0.05, 0.1), KB: TenantForecast(0.6, 0.05, 0.1)}
    rules = CardRules(pooled_peaks=False)
    cluster = SharedCluster(1000, 1, rules, lambda key: forecasts[key])
    assert cluster.place(_ref("a"), "a-0", 0.6)
    assert not cluster.place(_ref("b"), "b-0", 0.6)
