"""The engine's rules that ``describe`` reads too: which way a need moves the fraction, the
request pending within the cooldown, and what holds a downsize back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import sample, v1_policy
from fracpilot_libs.contracts import Direction
from fracpilot_libs.sizing.engine import decide, need_of
from fracpilot_libs.sizing.hysteresis import downsize_wait, pending_request, sizing_direction
from fracpilot_libs.sizing.observation import observe
from fracpilot_libs.sizing.state import WorkloadState, evolve

POLICY = v1_policy()  # grid of 8: one step is 0.125


def test_up_at_once_down_only_a_full_step_below() -> None:
    assert sizing_direction(0.625, 0.5, POLICY) is Direction.UP
    assert sizing_direction(0.5, 0.5, POLICY) is None
    assert sizing_direction(0.4, 0.5, POLICY) is None  # within a step
    assert sizing_direction(0.375, 0.5, POLICY) is Direction.DOWN


def test_a_request_is_pending_within_the_cooldown_only() -> None:
    state = evolve(WorkloadState(), decided_fraction=0.5, decided_at=1000.0)
    assert pending_request(state, 1000.0 + POLICY.cooldown_s - 1, POLICY) == 0.5
    assert pending_request(state, 1000.0 + POLICY.cooldown_s, POLICY) is None
    assert pending_request(WorkloadState(), 1000.0, POLICY) is None


def test_the_longest_wait_holds_a_downsize() -> None:
    now = 100_000.0
    state = evolve(WorkloadState(), first_seen=now - 7200, samples=10)
    assert downsize_wait(state, POLICY, now, below_since=now - 600) == (
        "downsize hold",
        POLICY.downsize_hold_s - 600,
    )
    young = evolve(state, first_seen=now - 60)
    assert downsize_wait(young, POLICY, now, now - 3600)[0] == "history"
    held = evolve(state, hold_until=now + 5 * 3600)
    assert downsize_wait(held, POLICY, now, now - 3600) == ("signal hold", 5 * 3600)
    cooling = evolve(state, last_change_at=now - 10)
    assert downsize_wait(cooling, POLICY, now, now - 3600) == ("cooldown", POLICY.cooldown_s - 10)
    assert downsize_wait(state, POLICY, now, now - 3600)[1] <= 0


@settings(max_examples=40, deadline=None)
@given(
    low=st.floats(0.01, 0.2),
    minutes=st.integers(30, 240),
    hold_min=st.integers(10, 120),
)
def test_decide_downsizes_exactly_when_no_wait_is_left(
    low: float, minutes: int, hold_min: int
) -> None:
    policy = v1_policy(downsize_hold_s=hold_min * 60, min_history_s=30 * 60, cooldown_s=20 * 60)
    state = WorkloadState()
    for minute in range(minutes):
        s = sample(low, 0.05, minute=minute, allocated=1.0)
        now = s.timestamp.timestamp()
        seen = observe(state, s, policy, now)  # what decide sees before it judges
        need = need_of(seen, policy)
        below = state.below_since if state.below_since is not None else now
        state, decision = decide(state, s, policy)
        if sizing_direction(need.fraction, 1.0, policy) is not Direction.DOWN:
            assert decision is None or decision.direction is Direction.UP
            continue
        due = downsize_wait(seen, policy, now, below)[1] <= 0
        assert (decision is not None) == due
        if decision is not None:
            assert decision.direction is Direction.DOWN
            break
