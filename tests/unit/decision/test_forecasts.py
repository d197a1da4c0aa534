"""The decision's card forecast: the jump statistic the live engine keeps beside its state is
the replay's (shared_packing.TenantSizer), and the forecast reads from the state as the
replay's does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import sample
from fracpilot_decision.forecasts import card_forecast, keep_jump, prior_of
from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.forecast import DEFAULT_PRIOR, jump_after
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state

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
