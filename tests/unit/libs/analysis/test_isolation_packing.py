"""Isolation modes of the packed replay: card-level collisions and contention exact on hand-made
traces, shared cards that divide themselves within 1.0, and the resize budget (never exceeded,
memory upsizes never withheld)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.packing_bound import pack_bound
from fracpilot_libs.analysis.packing_replay import ReplayCluster, replay_packed
from fracpilot_libs.analysis.replay import replay_workload
from fracpilot_libs.analysis.shared_packing import TenantSizer, shared_policy
from fracpilot_libs.analysis.trace import TraceError, TracePoint, group_by_workload, read_trace
from fracpilot_libs.contracts import ComputeSizing, PlanKind, Policy, UsageSample, WorkloadRef
from fracpilot_libs.placement.card_budget import Isolation
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState

T0 = datetime(2026, 3, 2, tzinfo=UTC)
CARD = 1000
DAY_S = 24 * 3600.0
DATA = Path("/work/shared/data/genai_public.csv.gz")


def series(
    name: str, usage: list[tuple[float, int]], requested: float = 1.0, start: int = 0
) -> list[TracePoint]:
    ref = WorkloadRef(cluster="replay", namespace="ns", owner_name=name)
    return [
        TracePoint(
            UsageSample(
                sample_id=f"{name}-{m}",
                workload=ref,
                pod=f"{name}-0",
                timestamp=T0 + timedelta(minutes=start + m),
                compute=util,
                memory_used_bytes=mem,
                memory_total_bytes=CARD,
                source="test",
            ),
            requested,
        )
        for m, (util, mem) in enumerate(usage)
    ]


@dataclass(frozen=True)
class Hold:
    """Holds the requested fraction and never resizes."""

    name: str = "hold"
    script: dict[str, float] = field(default_factory=dict)

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> None:
        return None

    def step(self, state: None, sample: UsageSample) -> tuple[None, float | None]:
        return None, None


def test_memory_collisions_and_contention_are_counted_per_card_sample_exactly() -> None:
    # a and b hold 0.5 each, on one card. Minute 1: a uses 600 and b 500 of the card's 1000
    # (a collision: two tenant samples, one card-sample) and they ask 0.7 + 0.6 of its compute.
    a = series("a", [(0.2, 400), (0.7, 600), (0.2, 300)], 0.5)
    b = series("b", [(0.3, 500), (0.6, 500), (0.3, 500)], 0.5)
    groups = {s[0].sample.workload.key: s for s in (a, b)}
    packed = replay_packed(groups, Hold(), isolation=Isolation.ENFORCED).packed
    assert packed.peak_cards == 1
    assert packed.card_samples == 3
    assert packed.memory_collision_card_samples == 1
    assert packed.memory_collision_samples == 2
    assert packed.memory_collision_pct == pytest.approx(100 / 3)
    # work: (0.5 + 1.3 + 0.5) GPU-minutes; delayed: 0.3 of minute 1
    assert packed.work_gpu_hours == pytest.approx(2.3 / 60)
    assert packed.delayed_gpu_hours == pytest.approx(0.3 / 60)
    assert packed.contention_pct == pytest.approx(100 * 0.3 / 2.3)
    doc = packed.as_dict()
    assert doc["isolation"] == "enforced"
    assert doc["memory_collision_pct"] == pytest.approx(33.3333)


def test_without_a_mode_the_packed_account_says_none() -> None:
    a = series("a", [(0.2, 400)] * 3, 0.5)
    packed = replay_packed({a[0].sample.workload.key: a}, Hold()).packed
    assert packed.as_dict()["isolation"] is None


def _steady(name: str, minutes: int, memory: int, start: int = 0) -> list[TracePoint]:
    return series(name, [(0.05, memory)] * minutes, 1.0, start)


def test_shared_cards_hold_tenants_whose_fractions_sum_within_one() -> None:
    # Four small steady workloads, each asking a whole card at first: under shared isolation
    # they end on one card, divided within 1.0, and their memory never collides.
    groups = {}
    for i in range(4):
        s = _steady(f"w{i}", 6 * 60, 150 + 10 * i)
        groups[s[0].sample.workload.key] = s
    report = replay_packed(groups, EngineSizer(Policy()), isolation=Isolation.SHARED)
    packed = report.packed
    assert packed.isolation == "shared"
    assert packed.memory_collision_card_samples == 0
    assert packed.peak_card_fraction <= 1.0 + 1e-9
    assert min(cards for _, cards in packed.cards_in_use if cards) == 1
    assert packed.card_hours_saved_pct > 50
    assert report.replay.totals.memory_overrun_samples == 0


def _decisions(policy: Policy, usage: list[tuple[float, float]]) -> list[tuple[float, bool]]:
    """(time, memory first) of each resize of one workload replayed through the engine, each
    applied at once. Memory first: an upsize because the memory need (peak + headroom) exceeds
    the fraction; memory in use above the fraction always brings one."""
    state, held, out = WorkloadState(), 1.0, []
    ref = WorkloadRef(cluster="t", namespace="ns", owner_name="w")
    for m, (compute, memory) in enumerate(usage):
        at = T0 + timedelta(minutes=m)
        s = UsageSample(
            sample_id=str(m),
            workload=ref,
            pod="w-0",
            timestamp=at,
            compute=compute,
            memory_used_bytes=int(memory * CARD),
            memory_total_bytes=CARD,
            allocated_fraction=held,
            source="test",
        )
        memory_over = memory > held + 1e-9
        state, decision = decide(state, s, policy)
        if memory_over:  # memory first: never withheld by the budget
            assert decision is not None
            assert decision.new_fraction >= memory - 1e-9
        if decision is not None:
            first = decision.explanation.startswith("upsize at once: memory")
            out.append((at.timestamp(), first))
            held = decision.new_fraction
    return out


usage_walks = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1.0),
        st.floats(min_value=0.0, max_value=0.04),
        st.integers(min_value=5, max_value=400),
    ),
    min_size=3,
    max_size=20,
).map(
    lambda legs: [
        (compute, min(1.0, 0.1 + step * i)) for compute, step, length in legs for i in range(length)
    ]
)


@settings(max_examples=40, deadline=None)
@given(
    usage=usage_walks,
    budget=st.sampled_from([1.0, 2.0, 3.0]),
    mode=st.sampled_from(list(ComputeSizing)),
)
def test_the_resize_budget_is_never_exceeded_and_memory_upsizes_never_withheld(
    usage: list[tuple[float, float]], budget: float, mode: ComputeSizing
) -> None:
    policy = Policy(resize_budget_per_day=budget, compute_sizing=mode, cooldown_s=600.0)
    resizes = _decisions(policy, usage)
    for at, memory_first in resizes:
        if memory_first:
            continue  # counted, never withheld
        within_day = sum(1 for t, _ in resizes if at - DAY_S < t <= at)
        assert within_day <= budget


def stationary(
    seed: int,
    days: int = 3,
    spikes_every_h: float = 3.0,
    height: float = 0.5,
    memory: int = 200,
    min_gap: int = 1,
) -> list[TracePoint]:
    """Steady low compute (0.05 +- 0.02) and rare one-minute spikes to ``height`` (half a card),
    ``min_gap`` minutes apart at least (1: two may touch, a two-minute burst)."""
    rng = random.Random(seed)
    spikes, minute = set(), 0
    while minute < days * 1440:
        minute += int(rng.expovariate(1 / (spikes_every_h * 60))) + min_gap
        spikes.add(minute)
    usage = [
        (height if m in spikes else 0.05 + rng.uniform(-0.02, 0.02), memory)
        for m in range(days * 1440)
    ]
    return series(f"steady-{seed}", usage)


@pytest.mark.parametrize("mode", list(ComputeSizing))
def test_a_stationary_workload_does_not_flap(mode: ComputeSizing) -> None:
    policy = Policy(compute_sizing=mode, resize_budget_per_day=4.0)
    for seed in range(5):
        account = replay_workload(stationary(seed, spikes_every_h=3.0), EngineSizer(policy))
        assert account.metrics.resizes_per_workload_day <= 1.0 + 1e-6


@pytest.mark.parametrize("mode", list(ComputeSizing))
@pytest.mark.parametrize(
    ("every_h", "height", "memory"),
    [(1.5, 1.0, 50), (2.0, 0.8, 100), (3.0, 0.3, 50), (6.0, 1.0, 200), (12.0, 0.5, 50)],
)
def test_stationary_workloads_with_other_spikes_do_not_flap(
    mode: ComputeSizing, every_h: float, height: float, memory: int
) -> None:
    # Lone spikes (at least two minutes apart: two in a row are a sustained rise, which the
    # policy upsizes at once), every 1.5-12 h, to 0.3-1.0 of a card, over little or much memory;
    # the default policy (no resize budget to hide behind).
    policy = Policy(compute_sizing=mode)
    for seed in range(10, 13):
        usage = stationary(seed, spikes_every_h=every_h, height=height, memory=memory, min_gap=2)
        account = replay_workload(usage, EngineSizer(policy))
        assert account.metrics.resizes_per_workload_day <= 1.0 + 1e-6, seed


@pytest.mark.parametrize("mode", list(ComputeSizing))
def test_a_sustained_rise_after_rare_spikes_upsizes_at_once(mode: ComputeSizing) -> None:
    # A day of the stationary workload, then compute at 0.6 for good: the second minute of the
    # rise upsizes (compute_upsize_confirmations 2), whatever the spikes before taught.
    before = stationary(1, days=1, min_gap=2)
    rise = [(p.sample.compute, p.sample.memory_used_bytes) for p in before] + [(0.6, 200)] * 60
    decisions = _decisions(Policy(compute_sizing=mode), [(c, m / CARD) for c, m in rise])
    after = [at for at, _ in decisions if at >= (T0 + timedelta(minutes=1440)).timestamp()]
    assert after
    assert after[0] == (T0 + timedelta(minutes=1441)).timestamp()


def test_frequent_bursts_still_size_soft_compute_by_their_work() -> None:
    # Lone bursts to 0.7 on one sample in ten (not rare): the soft level covers them, though
    # no two come in a row.
    usage = [(0.7 if m % 10 == 5 else 0.05, 0.1) for m in range(12 * 60)]
    policy = Policy(compute_sizing=ComputeSizing.SOFT)
    state, held = WorkloadState(), 1.0
    ref = WorkloadRef(cluster="t", namespace="ns", owner_name="w")
    for m, (compute, memory) in enumerate(usage):
        s = UsageSample(
            sample_id=str(m),
            workload=ref,
            pod="w-0",
            timestamp=T0 + timedelta(minutes=m),
            compute=compute,
            memory_used_bytes=int(memory * CARD),
            memory_total_bytes=CARD,
            allocated_fraction=held,
            source="test",
        )
        state, decision = decide(state, s, policy)
        if decision is not None:
            held = decision.new_fraction
    assert held >= 0.6


def test_under_enforced_isolation_consolidation_keeps_the_move_budget() -> None:
    # c holds half of card 0; a alternates between 0.6 (fits card 0 nowhere: a card of its
    # own) and 0.4 (alone there, the consolidation planner moves it onto card 0), every 20
    # minutes. Without a budget each swing is a move of a. With 2 a day, a workload that has
    # spent its budget may not be evicted: after a's consolidation and the resize move it
    # forced, the planner moves c instead (onto a's card, when a holds 0.4), and a's next 0.6
    # fits beside c nowhere: a move a resize needs, counted, never withheld. Once c has spent
    # its budget too, nothing is consolidated and a resizes in place.
    def moves(budget: float | None) -> list[tuple[int, str, str]]:
        cluster = ReplayCluster(CARD, None)
        cluster.move_budget = budget
        a, c = (WorkloadRef(cluster="t", namespace="ns", owner_name=n) for n in "ac")
        cluster.place(c, "c-0", 0.5)
        cluster.place(a, "a-0", 0.6)
        out = []
        for i in range(1, 31):
            cluster.now = i * 1200.0
            if cluster.resize(a, 0.4 if i % 2 else 0.6) is PlanKind.RECREATE_ELSEWHERE:
                out.append((i, "a", "resize"))
            planned = cluster.consolidate()
            out.extend((i, s.placement.workload.owner_name, "planner") for s in planned)
            assert not cluster.overcommitted()
        assert cluster.neighbour_moves == sum(cause == "planner" for _, _, cause in out)
        return out

    free = moves(None)
    assert free == [(i, "a", "planner" if i % 2 else "resize") for i in range(1, 31)]
    assert moves(2.0) == [
        (1, "a", "planner"),
        (2, "a", "resize"),
        (3, "c", "planner"),
        (4, "a", "resize"),
        (5, "c", "planner"),
        (6, "a", "resize"),
    ]


def test_the_shared_bound_counts_card_level_collisions_exactly() -> None:
    # Past peaks (no headroom of their own): a 1.0, 0.4, 0.4 (uses 0.4, 0.4, 0.6); b 1.0, 0.5,
    # 0.5 (uses 0.5). Without pooled headroom they share a card from minute 1, and at minute 2
    # use 1.1 of it; with 0.2 kept free on every card they never share.
    a = series("a", [(0.1, 400), (0.1, 400), (0.1, 600)])
    b = series("b", [(0.1, 500), (0.1, 500), (0.1, 500)])
    groups = {s[0].sample.workload.key: s for s in (a, b)}
    bound = pack_bound(
        groups, warmup_s=0.0, shared_windows_s=(3600.0,), shared_headrooms=(0.0, 0.2)
    )
    none, pooled = bound.shared[(3600.0, 0.0)], bound.shared[(3600.0, 0.2)]
    assert (none.card_samples, none.collision_card_samples) == (4, 1)
    assert none.card_hours == pytest.approx(4 / 60)
    assert (pooled.card_samples, pooled.collision_card_samples) == (6, 0)
    assert bound.saved_pct(none.card_hours) == pytest.approx(100 / 3)
    assert bound.shared_chosen() == {3600.0: pooled}
    lines = bound.as_dict()["shared_window_pooled"]
    assert [line["chosen"] for line in lines] == [False, True]


def test_a_trace_column_sets_the_isolation_per_pod(tmp_path: Path) -> None:
    rows = ["timestamp,namespace,workload,pod,gpu_util,gpu_mem_used_bytes,gpu_mem_total_bytes,"
            "isolation"]  # fmt: skip
    for m in range(120):
        at = (T0 + timedelta(minutes=m)).isoformat()
        rows.append(f"{at},ns,a,a-0,0.05,200,1000,shared")
        rows.append(f"{at},ns,b,b-0,0.05,300,1000,enforced")
        rows.append(f"{at},ns,c,c-0,0.05,250,1000,")
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(rows) + "\n")
    groups = group_by_workload(read_trace(trace))
    modes = {k.split("/")[-1]: s[0].isolation for k, s in groups.items()}
    assert modes == {"a": Isolation.SHARED, "b": Isolation.ENFORCED, "c": None}
    one = replay_packed(groups, EngineSizer(Policy()))  # no mode given: c packed as today's
    mixed = replay_packed(groups, EngineSizer(Policy()), isolation=Isolation.SHARED)
    assert one.packed.isolation == mixed.packed.isolation == "mixed"
    assert mixed.packed.whole_card_hours == pytest.approx(one.packed.whole_card_hours)
    assert mixed.packed.samples == 360
    assert [w.workload.owner_name for w in mixed.replay.workloads] == ["a", "b", "c"]
    # a and c end on one card; b has one of its own
    assert min(n for _, n in mixed.packed.cards_in_use if n) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text(rows[0] + "\n" + rows[1].replace("shared", "capped") + "\n")
    with pytest.raises(TraceError, match="isolation 'capped' is not shared or enforced"):
        list(read_trace(bad))


def test_a_tenants_peak_profile_is_exact_on_the_shared_clock() -> None:
    # Samples at 00:50 (0.3), 01:10 (0.5) and 01:20 (0.4) of the day: the profile's hours are
    # the clock's, each holding its own peak only (the engine's slot, started at 00:50, spans
    # both hours).
    sizer = TenantSizer(shared_policy(Policy()))
    state = sizer.start()
    ref = WorkloadRef(cluster="t", namespace="ns", owner_name="w")
    for minute, memory in ((50, 300), (70, 500), (80, 400)):
        sample = UsageSample(
            sample_id=str(minute),
            workload=ref,
            pod="w-0",
            timestamp=T0 + timedelta(minutes=minute),
            compute=0.1,
            memory_used_bytes=memory,
            memory_total_bytes=CARD,
            source="test",
        )
        state, _ = sizer.step(state, sample)
    hour = int(T0.timestamp() // 3600)
    assert state.peak_profile(T0.timestamp() + 90 * 60, sizer.policy) == (
        (hour, 0.3),
        (hour + 1, 0.5),
    )
    # a day later the first hour has left the window (the second ends after its start)
    later = T0.timestamp() + DAY_S + 3600
    assert state.peak_profile(later, sizer.policy) == ((hour + 1, 0.5),)
    assert state.peak_profile(later + 3600, sizer.policy) == ()


@pytest.mark.skipif(not DATA.exists(), reason=f"the GenAI trace is not at {DATA}")
def test_shared_isolation_meets_the_issues_figures_on_the_genai_trace() -> None:
    """Issue 25's `shared` row, default policy, consolidated by the actuator's planner (one
    planner, issue 27; docs/sizing.md, "Measured"): 40.58% of card-hours saved, 5 collisions
    (0.0039% of card-samples), 0.006% contention, 1.37 moves and 3.63 resizes per
    workload-day, 45.07% saved unpacked."""
    groups = group_by_workload(read_trace(DATA))
    report = replay_packed(groups, EngineSizer(Policy()), isolation=Isolation.SHARED)
    totals, packed = report.replay.totals, report.packed
    assert packed.card_hours_saved_pct >= 40.0
    assert packed.memory_collision_pct <= 0.01
    assert packed.contention_pct <= 1.0
    assert packed.moves_per_workload_day <= 2.0
    assert totals.resizes_per_workload_day <= 4.0
    assert totals.savings_pct >= 35.0
    # the move budget: memory moves beyond it are the only moves beyond it, and are counted
    assert packed.moves == sum(packed.moves_by_cause.values())
    assert set(packed.moves_by_cause) <= {"planned", "overflow", "grew"}  # no replay-only rule
    assert packed.moves_over_budget <= packed.moves_by_cause.get("overflow", 0) + (
        packed.moves_by_cause.get("grew", 0)
    )


@pytest.mark.skipif(not DATA.exists(), reason=f"the GenAI trace is not at {DATA}")
def test_enforced_isolation_gives_the_figures_measured_on_the_genai_trace() -> None:
    """Issue 25's `enforced` row, default policy, consolidated by the consolidation planner
    (one planner, issue 27; docs/sizing.md, "enforced"): 15.41% of card-hours saved (14.99%
    with the replay's own lone-card moves; the issue asks 20%: missed, the fractions pair
    badly), 8 memory overruns (0.0091%), 0.43% compute overruns, 1.72 moves and 3.77 resizes
    per workload-day, 35.65% saved unpacked."""
    groups = group_by_workload(read_trace(DATA))
    report = replay_packed(groups, EngineSizer(Policy()), isolation=Isolation.ENFORCED)
    totals, packed = report.replay.totals, report.packed
    assert packed.card_hours_saved_pct == pytest.approx(15.41, abs=0.01)
    assert totals.memory_overrun_samples == 8
    assert totals.memory_overrun_pct <= 0.01
    assert totals.compute_overrun_pct <= 0.5
    assert packed.memory_collision_samples == 0
    assert packed.contention_pct <= 1.0
    assert packed.moves_per_workload_day <= 2.0
    assert totals.resizes_per_workload_day <= 4.0
    assert totals.savings_pct >= 35.0
    # every move not asked for by a resize is the consolidation planner's
    assert packed.neighbour_moves <= packed.moves
