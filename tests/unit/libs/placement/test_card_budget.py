"""The card planner of shared isolation (placement/card_budget.py): one pooled headroom per card,
fractions that never sum above 1.0, and a budget that covers the tenants' predicted peaks; the
shared cluster of the packed replay that runs it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.analysis.shared_packing import MoveRules, SharedCluster
from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.placement.card_budget import (
    CardRules,
    TenantForecast,
    budget,
    divide,
    fits,
    holds,
    holds_memory,
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
    # b's need grew: 0.95 + 0.1 > 1, the card no longer keeps them. Either leaving
    # restores it and neither fits a card in use: the smaller, a, moves; b stays in place.
    forecasts[KB] = TenantForecast(0.55, 0.05, 0.1)
    assert cluster.resize(b, 0.55) is PlanKind.IN_PLACE
    assert cluster.card_of[KA] != cluster.card_of[KB]
    assert cluster.cards_in_use() == 2
    assert cluster.move_causes == {"grew": 1}
    assert cluster.fraction_of == {KA: 0.5, KB: 0.65}  # alone: all the headroom
    forecasts[KB] = TenantForecast(0.3, 0.05, 0.1)  # b shrank: in place, both cards alone
    assert cluster.resize(b, 0.3) is PlanKind.IN_PLACE
    assert cluster.cards_in_use() == 2  # a consolidation waits for the tidy
    # the tidy's consolidation planner (the actuator's) empties the card of the lighter
    # tenant, b, onto a's card: one card
    assert cluster.tidy() == [KB]
    assert cluster.cards_in_use() == 1
    assert cluster.move_causes == {"grew": 1, "planned": 1}
    assert sum(cluster.fraction_of.values()) <= 1.0
    cluster.release(a)
    assert cluster.fraction_of == {KB: 0.4}
    assert cluster.redivisions >= 1


def test_memory_moves_are_never_withheld_by_the_move_budget_but_counted() -> None:
    forecasts = {KA: TenantForecast(0.4, 0.05, 0.1), KB: TenantForecast(0.4, 0.05, 0.1)}
    rules = CardRules(headroom_factor=1.0, headroom_floor=0.1, pooled_peaks=False)
    no_moves = MoveRules(budget_per_day=0.0)
    cluster = SharedCluster(1000, None, rules, lambda key: forecasts[key], moves=no_moves)
    a, b = _ref("a"), _ref("b")
    assert cluster.place(a, "a-0", 1.0)
    assert cluster.place(b, "b-0", 1.0)
    forecasts[KB] = TenantForecast(0.55, 0.05, 0.1)  # short of memory: someone moves
    assert cluster.resize(b, 0.55) is PlanKind.IN_PLACE  # a, the smaller, moved
    assert (cluster.moves, cluster.moves_over_budget) == (1, 1)
    forecasts[KB] = TenantForecast(0.3, 0.05, 0.1)
    cluster.resize(b, 0.3)
    assert cluster.tidy() == []  # a consolidation only within the budget: none here
    assert cluster.cards_in_use() == 2

    # short of compute only: nobody moves unless the rules say so (work waits, nothing fails;
    # profiles keep memory apart from a need that is compute's)
    memory = ((0, 0.2),)
    forecasts = {
        KA: TenantForecast(0.6, 0.05, 0.6, burst=0.2, profile=memory),
        KB: TenantForecast(0.1, 0.05, 0.1, profile=memory),
    }
    cluster = SharedCluster(1000, None, CardRules(), lambda key: forecasts[key], moves=no_moves)
    assert cluster.place(a, "a-0", 1.0)
    assert cluster.place(b, "b-0", 1.0)
    assert cluster.cards_in_use() == 1
    forecasts[KB] = TenantForecast(0.5, 0.05, 0.5, burst=0.2, profile=memory)
    assert cluster.resize(b, 0.5) is PlanKind.IN_PLACE
    assert not holds(list(forecasts.values()), CardRules())
    assert cluster.tidy() == []
    assert cluster.moves == 0


def test_a_card_keeps_its_tenants_into_its_headroom_and_admits_only_with_all_of_it() -> None:
    # joint peak 0.8, pooled headroom 0.2: a card keeps them (0.8 + 0.75 x 0.2 <= 1) and
    # would admit them (0.8 + 0.2); at 0.84 it keeps but no longer admits; at 0.86 neither.
    rules = CardRules(headroom_factor=1.0, headroom_floor=0.0, keep_share=0.75)
    for peak, admits, keeps in ((0.8, True, True), (0.84, False, True), (0.86, False, False)):
        ts = [TenantForecast(peak / 2, 0.2, 0.1), TenantForecast(peak / 2, 0.1, 0.1)]
        assert (fits(ts, rules), holds(ts, rules)) == (admits, keeps)
    # a young tenant's spare: admitted only with it free, kept into it
    young = TenantForecast(0.3, 0.1, 0.1, spare=0.1)
    other = TenantForecast(0.55, 0.1, 0.1)
    assert memory_budget([young, other], rules) == pytest.approx(0.3 + 0.55 + 0.1 + 0.1)
    assert not fits([young, other], rules)
    assert holds([young, other], rules)  # 0.85 + 0.75 x 0.1
    with pytest.raises(ValueError, match="keep_share"):
        CardRules(keep_share=1.5)


@PROPERTY
@given(ts=st.lists(tenants, min_size=1, max_size=6), rules=card_rules)
def test_a_card_that_admits_its_tenants_keeps_them(
    ts: list[TenantForecast], rules: CardRules
) -> None:
    if fits(ts, rules):
        assert holds(ts, rules)
    whole = CardRules(
        headroom_factor=rules.headroom_factor,
        headroom_floor=rules.headroom_floor,
        pooled_peaks=rules.pooled_peaks,
        keep_share=1.0,
    )
    assert holds(ts, whole) == fits(ts, whole)  # no hysteresis: keep as admitted


class LoggedCluster(SharedCluster):
    """The shared cluster, each move logged with its cause and the moves made before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, str, int]] = []

    def _move(self, key: str, target: str, cause: str) -> str:
        self.log.append((key, cause, self.recent_moves(key)))
        return super()._move(key, target, cause)


MEMORY_CAUSES = {"grew", "overflow"}
# tenants of a few tenths of a card, that share cards and outgrow them
small_tenants = st.builds(
    TenantForecast,
    memory_peak=st.floats(min_value=0.05, max_value=0.5),
    memory_jump=st.floats(min_value=0.0, max_value=0.2),
    compute=st.floats(min_value=0.0, max_value=0.6),
    burst=st.floats(min_value=0.0, max_value=0.3),
)
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["place", "resize", "drift", "release", "tidy", "place", "resize", "drift"]
        ),
        st.integers(0, 7),
        small_tenants,
        st.sampled_from([1, 10, 120, 720]),  # minutes passed
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(steps=ops, budget_per_day=st.sampled_from([1.0, 2.0]))
def test_moves_stay_within_the_budget_but_memory_moves_and_cards_stay_within_one(
    steps: list[tuple[str, int, TenantForecast, int]], budget_per_day: float
) -> None:
    forecasts: dict[str, TenantForecast] = {}
    rules = CardRules()
    cluster = LoggedCluster(
        1000,
        None,
        rules,
        lambda key: forecasts[key],
        moves=MoveRules(budget_per_day=budget_per_day, compute_moves=True),
    )
    now = 0.0
    for op, i, forecast, minutes in steps:
        now += 60.0 * minutes
        cluster.at(now)
        ref = _ref(f"w{i}")
        placed = ref.key in cluster.card_of
        if op == "place" and not placed:
            forecasts[ref.key] = forecast
            assert cluster.place(ref, f"w{i}-0", 1.0)
        elif op == "resize" and placed:
            forecasts[ref.key] = forecast
            assert cluster.resize(ref, forecast.need) is not PlanKind.SCALE_UP
        elif op == "drift" and placed:  # its forecast changed with a sample, no resize
            forecasts[ref.key] = forecast
            cluster.relieve_memory([ref.key])  # as the replay does after each sample
        elif op == "release" and placed:
            cluster.release(ref)
        elif op == "tidy":
            cluster.tidy()
        else:
            continue
        for card, keys in cluster.cards.items():
            ts = [forecasts[k] for k in keys]
            assert sum(cluster.fraction_of[k] for k in keys) <= 1.0 + EPS
            if len(ts) >= 2:  # memory first: a card short of memory was relieved at once
                assert holds_memory(ts, rules), card
    for _, cause, before in cluster.log:
        if cause not in MEMORY_CAUSES:  # a consolidation or compute: within the budget
            assert before + 1 <= budget_per_day
    assert cluster.moves == len(cluster.log)
    over = sum(1 for _, c, b in cluster.log if c in MEMORY_CAUSES and b + 1 > budget_per_day)
    assert cluster.moves_over_budget == over


def test_pinned_shared_cards_refuse_what_fits_nowhere() -> None:
    forecasts = {KA: TenantForecast(0.6, 0.05, 0.1), KB: TenantForecast(0.6, 0.05, 0.1)}
    rules = CardRules(pooled_peaks=False)
    cluster = SharedCluster(1000, 1, rules, lambda key: forecasts[key])
    assert cluster.place(_ref("a"), "a-0", 0.6)
    assert not cluster.place(_ref("b"), "b-0", 0.6)


def test_the_shared_tidy_empties_whole_nodes_first_with_the_actuators_planner() -> None:
    rules = CardRules(headroom_factor=1.0, headroom_floor=0.1, pooled_peaks=False)
    big, small_ = TenantForecast(0.6, 0.05, 0.1), TenantForecast(0.2, 0.05, 0.1)
    refs = [_ref(n) for n in "abc"]
    forecasts = {r.key: big for r in refs}
    cluster = SharedCluster(1000, None, rules, lambda key: forecasts[key], gpus_per_node=2)
    for r in refs:  # 0.6 each: a card each, a and b on node 0, c on node 1
        assert cluster.place(r, f"{r.owner_name}-0", 1.0)
    nodes = {r.key: cluster.node_of(cluster.card_of[r.key]) for r in refs}
    assert nodes == {refs[0].key: "node-00000", refs[1].key: "node-00000",
                     refs[2].key: "node-00001"}  # fmt: skip
    for r in refs:  # they shrink in place; consolidation waits for the tidy
        forecasts[r.key] = small_
        assert cluster.resize(r, 0.2) is PlanKind.IN_PLACE
    assert cluster.cards_in_use() == 3
    moved = cluster.tidy()
    # node 1 is emptied first (c, its only pod, moves), then node 0's second card
    assert refs[2].key in moved
    assert {cluster.node_of(cluster.card_of[r.key]) for r in refs} == {"node-00000"}
    assert cluster.cards_in_use() == 1
    assert set(cluster.move_causes) == {"planned"}
    assert sum(cluster.fraction_of.values()) <= 1.0 + EPS
