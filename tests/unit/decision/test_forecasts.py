"""The decision's card forecast: the jump statistic and the peak profile the live engine keeps
beside its state are the replay's (shared_packing.TenantSizer), and the forecast reads from the
state as the replay's does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import sample
from fracpilot_decision.forecasts import card_forecast, keep_jump, prior_of
from fracpilot_libs.analysis.shared_packing import TenantSizer
from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.forecast import DEFAULT_PRIOR, jump_after
from fracpilot_libs.sizing.peak_profile import profile_period
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state, state_json

POLICY = Policy()


@settings(max_examples=200, deadline=None)
@given(
    memory=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    minutes=st.lists(st.integers(1, 240), min_size=60, max_size=60),
)
def test_the_kept_jump_is_the_replays_jump_statistic(
    memory: list[float], minutes: list[int]
) -> None:
    state, replay_jump, minute = WorkloadState(), 0.0, 0
    for share, step in zip(memory, minutes, strict=False):
        minute += step
        s = sample(memory_share=share, minute=minute)
        now = s.timestamp.timestamp()
        replay_jump = jump_after(replay_jump, state, s.memory_share, now, POLICY)  # TenantSizer
        new, _ = decide(state, s, POLICY)
        state = keep_jump(state, new, s.memory_share, now, POLICY)
        assert state.memory_jump == replay_jump
    assert load_state(dump_state(state)).memory_jump == state.memory_jump  # checkpointed


def test_a_jump_above_the_trailing_peak_is_kept_and_a_sample_below_changes_nothing() -> None:
    state = WorkloadState()
    for minute, share in enumerate([0.2, 0.2, 0.15, 0.5, 0.3]):
        s = sample(memory_share=share, minute=minute)
        new, _ = decide(state, s, POLICY)
        kept = keep_jump(state, new, s.memory_share, s.timestamp.timestamp(), POLICY)
        if share != 0.5:
            assert kept is new  # nothing to update: no copy on the hot path
        state = kept
    assert abs(state.memory_jump - 0.3) < 1e-6  # 0.5 above the trailing peak 0.2


def test_a_young_workload_forecasts_at_least_the_population_prior() -> None:
    state = WorkloadState()
    for minute in range(10):
        s = sample(compute=0.3, memory_share=0.2, minute=minute)
        state, _ = decide(state, s, POLICY)
    now = sample(minute=10).timestamp.timestamp()
    f = card_forecast(state, POLICY, now, prior=0.17)
    assert f.memory_jump == 0.17  # it has jumped by nothing yet
    assert abs(f.memory_peak - 0.2) < 1e-6
    assert 0.0 < f.compute <= 1.0
    old = card_forecast(state, POLICY, now + POLICY.memory_headroom.warmup, prior=0.17)
    assert old.memory_jump == 0.0  # past the warm-up: its own statistic


def test_the_prior_is_taken_from_workloads_with_history_only() -> None:
    now = 10 * POLICY.memory_headroom.warmup
    seasoned = [WorkloadState(first_seen=0.0, memory_jump=j / 10) for j in range(10)]
    newcomer = WorkloadState(first_seen=now, memory_jump=0.95)
    assert prior_of([*seasoned, newcomer], now, POLICY) == 0.9
    assert prior_of([newcomer], now, POLICY) == DEFAULT_PRIOR


@settings(max_examples=100, deadline=None)
@given(
    memory=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    minutes=st.lists(st.integers(1, 180), min_size=60, max_size=60),
)
def test_the_kept_profile_is_the_replays_and_survives_a_checkpoint(
    memory: list[float], minutes: list[int]
) -> None:
    sizer = TenantSizer(POLICY)
    replay = sizer.start()
    state, minute = WorkloadState(), 0
    for share, step in zip(memory, minutes, strict=False):
        minute += step
        s = sample(memory_share=share, minute=minute)
        now = s.timestamp.timestamp()
        replay, _ = sizer.step(replay, s)
        state, _ = decide(state, s, POLICY)
        assert list(state.memory_profile) == list(replay.profile)
    restored = load_state(dump_state(state))
    assert list(restored.memory_profile) == list(state.memory_profile)
    assert dump_state(restored) == dump_state(state)
    later = now + POLICY.memory_headroom.warmup  # past the warm-up, so it carries its profile
    f = card_forecast(restored, POLICY, later)
    assert f.profile is not None
    assert f.profile.peaks == replay.peak_profile(later, POLICY)
    assert f.profile.period_s == profile_period(POLICY)
    assert f.profile.first <= min((k for k, _ in f.profile.peaks), default=f.profile.first)
    assert f.profile.last == int(later // profile_period(POLICY))


def test_a_young_workload_carries_no_profile_and_a_seasoned_one_its_peaks() -> None:
    state = WorkloadState()
    for minute, share in enumerate([0.2, 0.3, 0.25]):
        s = sample(memory_share=share, minute=minute * 50)  # periods 0, 0 and 1 of T0's hour
        state, _ = decide(state, s, POLICY)
    now = sample(minute=101).timestamp.timestamp()
    assert card_forecast(state, POLICY, now).profile is None  # has not shown its peaks
    f = card_forecast(state, POLICY, now + POLICY.memory_headroom.warmup)
    assert f.profile is not None
    assert [round(v, 6) for _, v in f.profile.peaks] == [0.3, 0.25]
    short = POLICY.model_copy(update={"memory_window_s": 10.0})  # a period the wire refuses
    assert card_forecast(state, short, now + POLICY.memory_headroom.warmup).profile is None


def test_a_sample_below_its_periods_peak_copies_no_profile() -> None:
    state = WorkloadState()
    for minute, share in enumerate([0.2, 0.2, 0.1]):
        s = sample(memory_share=share, minute=minute)
        new, _ = decide(state, s, POLICY)
        if minute:
            assert new.memory_profile is state.memory_profile  # the same profile
        state = new
    higher, _ = decide(state, sample(memory_share=0.9, minute=3), POLICY)
    assert higher.memory_profile[-1] == 0.9
    assert state.memory_profile[-1] == 0.2  # the state before is never changed in place


def test_a_checkpoint_with_a_profile_out_of_shape_does_not_load() -> None:
    state = WorkloadState()
    for minute in (0, 70, 140):
        s = sample(memory_share=0.2, minute=minute)
        state, _ = decide(state, s, POLICY)
    body = json.loads(state_json(state))
    assert len(body["memory_profile"]) == 3
    older = {k: v for k, v in body.items() if k != "memory_profile"}  # written before profiles
    assert len(load_state(json.dumps(older).encode()).memory_profile) == 0
    for bad in (
        body["memory_profile"][::-1],  # periods not increasing
        [[1, 1.5]],  # above the card
        [[k, 0.1] for k in range(30)],  # more periods than are kept
    ):
        with pytest.raises(ValueError, match="checkpoint"):
            load_state(json.dumps({**body, "memory_profile": bad}).encode())
