"""The packed replay's account (card-hours, contention, memory collisions, moves), exact on a
hand-made trace, and its invariants on generated ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.analysis.baselines import EngineSizer, Sizer, StaticSizer, VpaSizer
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.analysis.packing_replay import (
    MAX_MOVES_PER_CHECK,
    ReplayCluster,
    replay_packed,
)
from fracpilot_libs.analysis.replay import replay
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import Policy, UsageSample, WorkloadRef
from fracpilot_libs.placement.consolidation import SAFE_TO_EVICT, consolidation_plan
from fracpilot_libs.placement.consolidation_steps import apply_consolidation

T0 = datetime(2026, 3, 2, tzinfo=UTC)
CARD = 1000  # bytes of device memory: shares are easy to read
DAY = 24 * 3600.0


def series(
    name: str, minutes: list[int], usage: list[tuple[float, int]], requested: float = 1.0
) -> list[TracePoint]:
    ref = WorkloadRef(cluster="replay", namespace="ns", owner_name=name)
    return [
        TracePoint(
            UsageSample(
                sample_id=f"{name}-{m}",
                workload=ref,
                pod=f"{name}-0",
                timestamp=T0 + timedelta(minutes=m),
                compute=util,
                memory_used_bytes=mem,
                memory_total_bytes=CARD,
                source="test",
            ),
            requested,
        )
        for m, (util, mem) in zip(minutes, usage, strict=True)
    ]


def groups(*all_series: list[TracePoint]) -> dict[str, list[TracePoint]]:
    return {s[0].sample.workload.key: s for s in all_series}


@dataclass(frozen=True)
class ScriptSizer:
    """Holds the requested fraction, and decides ``script[(name, minute)]`` on that sample."""

    script: dict[tuple[str, int], float] = field(default_factory=dict)
    name: str = "script"

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> None:
        return None

    def step(self, state: None, sample: UsageSample) -> tuple[None, float | None]:
        minute = round((sample.timestamp - T0).total_seconds() / 60)
        return None, self.script.get((sample.workload.owner_name, minute))


def hand_trace() -> dict[str, list[TracePoint]]:
    # a and b report at minutes 0..3, c at minutes 1 and 2; (gpu_util, memory bytes)
    a = series("a", [0, 1, 2, 3], [(0.4, 300), (0.6, 300), (0.3, 300), (0.3, 300)], 0.5)
    b = series("b", [0, 1, 2, 3], [(0.5, 400), (0.7, 400), (0.2, 400), (0.2, 400)], 0.5)
    c = series("c", [1, 2], [(0.5, 500), (0.5, 500)], 1.0)
    return groups(a, b, c)


# a and b go to 0.25, c to 0.5, all decided on their minute-1 samples: in force from minute 2.
HAND_SCRIPT = {("a", 1): 0.25, ("b", 1): 0.25, ("c", 1): 0.5}


def test_the_packed_account_is_exact_on_a_hand_made_trace() -> None:
    report = replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT))
    p = report.packed
    # Placement, by the planner's best fit:
    #   minute 0: a (0.5) scales up card 0; b (0.5) fits beside it -> card 0 full.
    #   minute 1: c (1.0) fits nowhere -> card 1.
    #   minute 2: downsizes, in key order, each in place: a 0.5->0.25 and b 0.5->0.25 on
    #   card 0, c 1.0->0.5 on card 1 (3 in-place). Then the consolidation planner: card 1 (one
    #   pod, 0.5) is emptied first; the scheduler's best fit for c is card 0 (0.5 free): c
    #   moves there (1 move) and card 1 is empty.
    #   minute 3: c's last interval ended at minute 3 (a one-minute median step): it leaves.
    assert (p.placements, p.in_place, p.moves, p.decisions_refused) == (3, 3, 1, 0)
    assert p.neighbour_moves == 1
    # Cards in use: minute 0: 1, minute 1: 2, minute 2: 1, minute 3: 1, minute 4: none.
    assert [n for _, n in p.cards_in_use] == [1, 2, 1, 0]
    assert p.peak_cards == 2
    # card-seconds: 60 (m0) + 120 (m1) + 60 (m2) + 60 (m3) = 300 s
    assert p.card_hours == pytest.approx(300 / 3600)
    # workload-seconds: 2*60 + 3*60 + 3*60 + 2*60 = 600 s, saved 1 - 300/600 = 50%
    assert p.whole_card_hours == pytest.approx(600 / 3600)
    assert p.card_hours_saved_pct == pytest.approx(50.0)
    # compute work, util-seconds: m0 (0.4+0.5)*60 = 54; m1 (0.6+0.7)*60 + 0.5*60 = 108;
    # m2 (0.3+0.2+0.5)*60 = 60; m3 (0.3+0.2)*60 = 30 -> 252. Only card 0 at m1 is over 1.0:
    # delayed (1.3 - 1.0)*60 = 18 -> contention 18/252 = 7.142857%.
    assert p.work_gpu_hours == pytest.approx(252 / 3600)
    assert p.delayed_gpu_hours == pytest.approx(18 / 3600)
    assert p.contention_pct == pytest.approx(100 * 18 / 252)
    # The 18 s are charged by demand: b 0.7/1.3*18, a 0.6/1.3*18; c (alone at m1) nothing.
    worst = p.most_contended(5)
    assert [c.workload for c in worst] == ["ns/b", "ns/a"]
    assert worst[0].delayed_gpu_hours == pytest.approx(0.7 / 1.3 * 18 / 3600)
    assert worst[1].delayed_gpu_hours == pytest.approx(0.6 / 1.3 * 18 / 3600)
    # b's own work: (0.5+0.7+0.2+0.2)*60 = 96 util-seconds
    assert worst[0].contention_pct == pytest.approx(100 * (0.7 / 1.3 * 18) / 96)
    # Memory: at m2 card 0 holds 300+400+500 = 1200 > 1000 bytes: the three samples of m2
    # collide. a (300 > 250) and b (400 > 250) overrun their 0.25 at m2 and m3: 4 overruns.
    assert p.memory_collision_samples == 3
    assert p.memory_overrun_samples == 4
    assert p.samples == 10
    # Fractions on card 0 at m2: 0.25 + 0.25 + 0.5 = 1.0, never more.
    assert p.peak_card_fraction == pytest.approx(1.0)
    # per workload-day: 600 s is 1/144 of a day
    assert p.moves_per_workload_day == pytest.approx(144.0)
    assert p.in_place_per_workload_day == pytest.approx(432.0)


def test_without_consolidation_the_lone_workload_keeps_its_card() -> None:
    p = replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT), consolidate=False).packed
    # c stays on card 1 at minute 2: three in place, no move;
    # card-seconds 60 + 120 + 120 (m2, still two cards) + 60 = 360.
    assert (p.in_place, p.moves) == (3, 0)
    assert p.card_hours == pytest.approx(360 / 3600)
    assert p.memory_collision_samples == 0  # a and b overrun, but 700 bytes fit on card 0


def test_a_neighbour_left_alone_by_a_move_is_consolidated() -> None:
    a = series("a", [0, 1, 2], [(0.1, 100)] * 3, 0.5)
    b = series("b", [0, 1, 2], [(0.1, 100)] * 3, 0.5)
    c = series("c", [0, 1, 2], [(0.1, 100)] * 3, 1.0)
    script = {("b", 1): 0.8, ("c", 1): 0.3}
    # minute 0: a and b share card 0, c holds card 1. Minute 2: c 1.0 -> 0.3 in place (no
    # card in use has room for it); b 0.5 -> 0.8 fits nowhere (card 1 has 0.7 free): a card
    # is added for it. That leaves a alone on card 0, and card 1 holds it: a moves there.
    p = replay_packed(groups(a, b, c), ScriptSizer(script)).packed
    assert (p.in_place, p.moves) == (1, 2)  # b's move and a's, as recreates
    assert [n for _, n in p.cards_in_use] == [2, 0]  # minute 2: cards 1 and 2, not three
    # card-seconds 2*60 + 2*60 + 2*60 = 360 of 540 workload-seconds
    assert p.card_hours == pytest.approx(360 / 3600)
    # Without consolidation a keeps card 0: three cards at minute 2.
    q = replay_packed(groups(a, b, c), ScriptSizer(script), consolidate=False).packed
    assert (q.in_place, q.moves) == (1, 1)
    assert q.card_hours == pytest.approx(420 / 3600)


def test_pinned_cards_refuse_what_fits_nowhere_and_leave_arrivals_unplaced() -> None:
    script = {**HAND_SCRIPT, ("a", 2): 1.0}
    report = replay_packed(hand_trace(), ScriptSizer(script), gpus=1)
    p = report.packed
    # One card: a and b fill it at minute 0; c (1.0) arrives at minutes 1 and 2 to no room
    # (at 2, a and b hold 0.25 each: 0.5 free < 1.0), so it is never placed or sized.
    assert p.unplaced_samples == 2
    assert p.unplaced == {"ns/c"}
    # a's upsize to 1.0 (decided at minute 2) meets b's 0.25 at minute 3: refused.
    assert p.decisions_refused == 1
    final = {w.workload.owner_name: w.final_fraction for w in report.replay.workloads}
    assert final == {"a": 0.25, "b": 0.25, "c": 1.0}
    assert p.gpus == 1
    assert p.peak_cards == 1
    assert p.card_hours == pytest.approx(240 / 3600)  # card 0 from minute 0 to 4
    assert p.whole_card_hours == pytest.approx(480 / 3600)  # a and b only


def test_a_gap_releases_the_card_and_the_return_is_a_placement() -> None:
    # a reports at 0, 1, 2, then 20, 21: the gap of 18 minutes is capped at 5 median steps
    # (5 min), so a is off its card from minute 7 to 20 and placed again at 20.
    a = series("a", [0, 1, 2, 20, 21], [(0.2, 100)] * 5, 0.5)
    p = replay_packed(groups(a), StaticSizer(0.5)).packed
    assert p.placements == 2
    assert p.moves == 0
    assert [n for _, n in p.cards_in_use] == [1, 0, 1, 0]
    # on a card: 0-1, 1-2, 2-7 (capped), 20-21, 21-22 minutes = 9 minutes
    assert p.card_hours == pytest.approx(9 / 60)
    assert p.whole_card_hours == pytest.approx(9 / 60)


def test_a_repeated_timestamp_is_two_samples_and_the_first_decision_applies_to_the_second() -> None:
    a = series("a", [0, 1, 1, 2], [(0.2, 100)] * 4, 1.0)
    script = ScriptSizer({("a", 1): 0.5})
    report = replay_packed(groups(a), script)
    assert report.packed.samples == 4
    # the unpacked replay: the decision on the first minute-1 sample holds from the second
    assert report.replay.totals.as_dict() == replay(groups(a), lambda: script).totals.as_dict()
    assert report.packed.in_place == 1
    assert report.packed.card_hours == pytest.approx(3 / 60)


def test_nodes_of_two_cards_are_counted_and_freed_cards_split_by_whole_nodes() -> None:
    report = replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT), gpus_per_node=2)
    p = report.packed
    # The same placements as on single cards: node 0 holds cards 0 and 1; c goes to the empty
    # card 1 at minute 1 (no new node) and moves onto card 0 at minute 2 (card 1 freed, the
    # node stays). Cards: 300 card-seconds as before.
    assert (p.placements, p.in_place, p.moves) == (3, 3, 1)
    assert p.card_hours == pytest.approx(300 / 3600)
    # Node 0 in use from minute 0 to 4: 240 node-seconds. The whole-GPU baseline's nodes:
    # 2 workloads -> 1 node (m0), 3 -> 2 (m1, m2), 2 -> 1 (m3): 360 node-seconds.
    assert p.node_hours == pytest.approx(240 / 3600)
    assert p.whole_node_hours == pytest.approx(360 / 3600)
    assert p.node_hours_saved_pct == pytest.approx(100 * (1 - 240 / 360))
    assert p.peak_nodes == 1
    # Freed: 600 - 300 = 300 card-seconds, of which (360 - 240) x 2 = 240 as whole nodes.
    assert p.freed_card_hours == pytest.approx(300 / 3600)
    assert p.freed_on_whole_nodes_card_hours == pytest.approx(240 / 3600)
    assert p.freed_on_whole_nodes_pct == pytest.approx(80.0)
    assert p.as_dict()["nodes"]["freed_on_whole_nodes_pct"] == pytest.approx(80.0)


def test_with_one_card_a_node_every_card_freed_is_a_whole_node() -> None:
    p = replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT)).packed
    assert p.node_hours == pytest.approx(p.card_hours)
    assert p.whole_node_hours == pytest.approx(p.whole_card_hours)
    assert p.freed_on_whole_nodes_pct == pytest.approx(100.0)


def test_pinned_cards_must_be_whole_nodes() -> None:
    with pytest.raises(ValueError, match="divide the pinned gpus"):
        replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT), gpus=3, gpus_per_node=2)


def test_account_hold_charges_only_cards_in_use() -> None:
    account = PackedAccount(card_memory_bytes=CARD)
    account.hold(3600, [{"x": 0.8, "y": 0.6}, {}, {"z": 0.1}])
    assert account.card_hours == pytest.approx(2.0)
    assert account.whole_card_hours == pytest.approx(3.0)
    assert account.work_gpu_hours == pytest.approx(1.5)
    assert account.delayed_gpu_hours == pytest.approx(0.4)
    assert account.delayed == pytest.approx({"x": 0.4 * 0.8 / 1.4, "y": 0.4 * 0.6 / 1.4})


def test_json_has_the_documented_keys() -> None:
    d = replay_packed(hand_trace(), ScriptSizer(HAND_SCRIPT)).packed.as_dict()
    assert {
        "card_hours",
        "whole_card_hours",
        "card_hours_saved_pct",
        "contention_pct",
        "memory_collision_samples",
        "moves_per_workload_day",
    } <= d.keys()
    assert d["most_contended"][0]["workload"] == "ns/b"


def test_pinning_zero_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        replay_packed(hand_trace(), ScriptSizer(), gpus=0)


# --- properties on generated traces ------------------------------------------------------------


@st.composite
def traces(draw: st.DrawFn) -> dict[str, list[TracePoint]]:
    """2-6 workloads, each reporting every minute over its own span, sometimes with a gap or a
    repeated timestamp."""
    out = []
    for w in range(draw(st.integers(2, 5))):
        start = draw(st.integers(0, 20))
        length = draw(st.integers(1, 25))
        minutes = list(range(start, start + length))
        if length > 4 and draw(st.booleans()):
            cut = draw(st.integers(1, length - 1))
            gap = draw(st.integers(6, 30))
            minutes = minutes[:cut] + [m + gap for m in minutes[cut:]]
        if len(minutes) > 2 and draw(st.booleans()):
            minutes.insert(1, minutes[1])  # a repeated timestamp
        usage = [(draw(st.floats(0, 1)), draw(st.integers(0, CARD))) for _ in minutes]
        requested = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
        out.append(series(f"w{w}", minutes, usage, requested))
    return groups(*out)


SIZERS: list[Sizer] = [
    EngineSizer(Policy(min_history_s=60, cooldown_s=60, downsize_hold_s=60)),
    VpaSizer(),
]


@settings(max_examples=50, deadline=None)
@given(trace=traces(), which=st.integers(0, 1), consolidate=st.booleans())
def test_packing_invariants(
    trace: dict[str, list[TracePoint]], which: int, consolidate: bool
) -> None:
    sizer = SIZERS[which]
    report = replay_packed(trace, sizer, consolidate=consolidate)
    p, totals = report.packed, report.replay.totals
    # Cards never hold more than themselves, and cost between the fractions and whole GPUs.
    assert p.peak_card_fraction <= 1.0 + 1e-9
    assert totals.fraction_hours <= p.card_hours + 1e-9
    assert p.card_hours <= p.whole_card_hours + 1e-9
    # Unpinned, packing changes no fraction: the per-workload account is the unpacked one.
    assert totals.as_dict() == replay(trace, lambda: sizer).totals.as_dict()
    assert p.whole_card_hours == pytest.approx(totals.whole_gpu_hours)
    assert p.samples == totals.samples
    assert not p.unplaced
    assert 0.0 <= p.contention_pct <= 100.0
    # A change decided on a workload's last sample (or before a gap) needs no plan; a
    # neighbour left alone on its card moves with no decision of its own.
    assert p.neighbour_moves <= p.moves
    assert p.moves - p.neighbour_moves + p.in_place <= totals.resizes


@settings(max_examples=60, deadline=None)
@given(trace=traces(), fraction=st.sampled_from([0.25, 0.5, 1.0]))
def test_no_memory_collision_when_fractions_cover_memory(
    trace: dict[str, list[TracePoint]], fraction: float
) -> None:
    cap = int(fraction * CARD)
    covered = {
        key: [
            TracePoint(
                p.sample.model_copy(
                    update={"memory_used_bytes": min(p.sample.memory_used_bytes, cap)}
                ),
                p.requested_fraction,
            )
            for p in points
        ]
        for key, points in trace.items()
    }
    p = replay_packed(covered, StaticSizer(fraction)).packed
    assert p.memory_overrun_samples == 0
    assert p.memory_collision_samples == 0


@settings(max_examples=40, deadline=None)
@given(trace=traces(), gpus=st.integers(1, 3))
def test_pinned_cards_are_never_exceeded(trace: dict[str, list[TracePoint]], gpus: int) -> None:
    p = replay_packed(trace, SIZERS[0], gpus=gpus).packed
    assert p.peak_cards <= gpus
    assert p.peak_card_fraction <= 1.0 + 1e-9
    assert p.card_hours <= p.whole_card_hours + 1e-9


# --- one planner: the replay's consolidation is the product's ----------------------------------


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(
        st.tuples(
            st.sampled_from(["place", "resize", "release"]),
            st.integers(0, 7),
            st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0]),
        ),
        min_size=1,
        max_size=40,
    ),
    budget=st.sampled_from([None, 1.0, 2.0]),
)
def test_the_replays_consolidation_is_the_planners_plan(
    script: list[tuple[str, int, float]], budget: float | None
) -> None:
    # Workloads arrive, resize and leave; at each check the replay carries out exactly the
    # plan of consolidation_plan on the cluster as it stood (at most MAX_MOVES_PER_CHECK moves,
    # pods over their move budget annotated safe-to-evict "false"), and counts its moves.
    cluster = ReplayCluster(CARD, None)
    cluster.move_budget = budget
    refs = [WorkloadRef(cluster="t", namespace="ns", owner_name=f"w{n}") for n in range(8)]
    moves = 0
    for n, (action, w, fraction) in enumerate(script):
        cluster.now = 600.0 * n
        ref = refs[w]
        placed = ref.key in cluster.card_of
        if action == "place" and not placed:
            assert cluster.place(ref, f"w{w}-0", fraction)
        elif action == "resize" and placed:
            cluster.resize(ref, fraction)
        elif action == "release" and placed:
            cluster.release(ref)
        before = cluster.state
        protected = {
            p.pod_key: {SAFE_TO_EVICT: "false"}
            for p in before.placements
            if budget is not None
            and sum(1 for t in cluster.move_times.get(p.workload.key, ()) if cluster.now - t < DAY)
            >= budget
        }
        changed = cluster.changed
        steps = cluster.consolidate()
        if not changed:
            assert steps == ()
            continue
        plan = consolidation_plan(before, max_moves=MAX_MOVES_PER_CHECK, pod_annotations=protected)
        assert steps == plan.steps
        assert cluster.state == apply_consolidation(before, plan)
        moves += len(plan.moves)
        assert cluster.neighbour_moves == moves
        assert cluster.card_of == {p.workload.key: p.gpu_uuid for p in cluster.state.placements}
        assert not cluster.overcommitted()
