"""``describe``: what the engine is about to do, read from its state alone, agrees with
``decide``."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import T0, sample, v1_policy
from fracpilot_libs.contracts import AppSignals, Direction
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.outlook import Outlook, describe
from fracpilot_libs.sizing.state import WorkloadState

PROPERTY = settings(max_examples=60, deadline=None)


def _at(minute: int) -> float:
    return (T0 + timedelta(minutes=minute)).timestamp()


def test_no_history() -> None:
    outlook = describe(WorkloadState(), v1_policy(), _at(0))
    assert outlook.outlook is Outlook.NO_HISTORY
    assert outlook.requested is None


def test_underused_waits_the_downsize_hold_then_downsizes() -> None:
    policy = v1_policy()  # hold 1 h, min history 1 h
    state = WorkloadState()
    for minute in range(40):
        state, decision = decide(state, sample(0.1, 0.1, minute=minute, allocated=0.5), policy)
        assert decision is None
    outlook = describe(state, policy, _at(39))
    assert outlook.outlook is Outlook.WAITING_TO_DOWNSIZE
    assert outlook.target == 0.25
    assert outlook.current == 0.5
    assert outlook.wait_s == 3600 - 39 * 60
    assert outlook.held_by == "downsize hold"
    assert describe(state, policy, _at(60)).outlook is Outlook.DOWNSIZING
    assert describe(state, policy, _at(60)).wait_s == 0


def test_an_upsize_asked_for_and_not_applied_is_pending_within_the_cooldown() -> None:
    policy = v1_policy()
    state, first = decide(WorkloadState(), sample(0.1, 0.3, minute=0, allocated=0.25), policy)
    assert first is not None
    assert first.new_fraction == 0.5
    for minute in range(1, 10):  # the actuator has not applied it: samples still say 0.25
        state, again = decide(state, sample(0.1, 0.3, minute=minute, allocated=0.25), policy)
        assert again is None
    outlook = describe(state, policy, _at(9))
    assert outlook.outlook is Outlook.UPSIZING
    assert outlook.requested == 0.5
    assert outlook.current == 0.25
    # The allocations bucket may know better than the last sample: applied, nothing pending.
    assert describe(state, policy, _at(9), current=0.5).outlook is Outlook.STABLE


def test_a_signal_holds_downsizes() -> None:
    policy = v1_policy(cooldown_s=0, min_history_s=0, downsize_hold_s=0)
    state, decision = decide(
        WorkloadState(),
        sample(0.1, 0.1, minute=0, allocated=0.25, signals=AppSignals(oom_event=True)),
        policy,
    )
    assert decision is not None
    state, _ = decide(state, sample(0.1, 0.1, minute=1, allocated=decision.new_fraction), policy)
    outlook = describe(state, policy, _at(1))
    assert outlook.outlook is Outlook.WAITING_TO_DOWNSIZE
    assert outlook.held_by == "signal hold"
    assert outlook.wait_s == policy.signal_hold_s - 60


@PROPERTY
@given(
    compute=st.floats(0.0, 1.0),
    memory=st.floats(0.0, 0.85),
    start=st.integers(1, 8),
    hold_min=st.integers(0, 120),
    cooldown_min=st.integers(0, 120),
    history_min=st.integers(0, 120),
    step_min=st.integers(1, 7),
)
def test_describe_predicts_decide_on_steady_usage(
    compute: float,
    memory: float,
    start: int,
    hold_min: int,
    cooldown_min: int,
    history_min: int,
    step_min: int,
) -> None:
    """With usage that does not change, the outlook before a sample says what the sample does:
    stable or waiting -> nothing; downsizing -> a downsize to the target; upsizing -> an
    upsize to the target. Changes apply at once (the next sample holds the new fraction), and
    the time left while waiting shrinks by the time between samples."""
    policy = v1_policy(
        downsize_hold_s=hold_min * 60.0,
        cooldown_s=cooldown_min * 60.0,
        min_history_s=history_min * 60.0,
    )
    held = start / 8
    state, _ = decide(
        state=WorkloadState(),
        sample=sample(compute, memory, minute=0, allocated=held),
        policy=policy,
    )
    if state.decided_fraction is not None:
        held = state.decided_fraction
    previous_wait: float | None = None
    for minute in range(step_min, 300, step_min):
        outlook = describe(state, policy, _at(minute), current=held)
        state, decision = decide(
            state, sample(compute, memory, minute=minute, allocated=held), policy
        )
        if outlook.outlook in (Outlook.STABLE, Outlook.WAITING_TO_DOWNSIZE):
            assert decision is None, (minute, outlook)
        elif outlook.outlook is Outlook.DOWNSIZING:
            assert decision is not None, (minute, outlook)
            assert decision.direction is Direction.DOWN
            assert decision.new_fraction == outlook.target
        elif outlook.outlook is Outlook.UPSIZING:
            assert decision is not None, (minute, outlook)
            assert decision.direction is Direction.UP
            assert decision.new_fraction == outlook.target
        if outlook.outlook is Outlook.WAITING_TO_DOWNSIZE:
            assert outlook.wait_s > 0
            if previous_wait is not None:
                assert abs(previous_wait - outlook.wait_s - step_min * 60) < 1e-6
            previous_wait = outlook.wait_s
        else:
            previous_wait = None
        if decision is not None:
            held = decision.new_fraction
            previous_wait = None
