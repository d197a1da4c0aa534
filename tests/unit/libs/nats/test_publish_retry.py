"""The publish retry policy (pure): backoff, deadline, per-attempt timeout, retryable errors."""

from __future__ import annotations

import nats.errors
import nats.js.errors
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_libs.nats.publish_retry import PublishRetryPolicy, retry_reason

POLICY = PublishRetryPolicy(deadline_s=30.0, first_delay_s=0.05, max_delay_s=2.0)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    delays = [POLICY.delay(n, elapsed_s=0.0) for n in range(1, 9)]
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_the_publish_is_given_up_at_the_deadline() -> None:
    assert POLICY.delay(3, elapsed_s=29.0) == 0.2
    assert POLICY.delay(10, elapsed_s=29.5) == 0.5  # never sleeps past the deadline
    assert POLICY.delay(1, elapsed_s=30.0) is None
    assert POLICY.delay(1, elapsed_s=31.0) is None


def test_an_attempt_waits_no_longer_than_the_time_left_but_not_too_little() -> None:
    assert POLICY.attempt_timeout(0.0) == 5.0
    assert POLICY.attempt_timeout(27.0) == 3.0
    assert POLICY.attempt_timeout(29.9) == 0.5
    assert POLICY.attempt_timeout(40.0) == 0.5


@given(
    failed=st.integers(min_value=1, max_value=10_000),
    elapsed=st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
)
def test_a_delay_is_bounded_and_never_crosses_the_deadline(failed: int, elapsed: float) -> None:
    delay = POLICY.delay(failed, elapsed)
    if elapsed >= POLICY.deadline_s:
        assert delay is None
    else:
        assert delay is not None
        assert 0.0 < delay <= POLICY.max_delay_s
        assert elapsed + delay <= POLICY.deadline_s + 1e-9


@given(st.lists(st.floats(min_value=0.0, max_value=3.0, allow_nan=False), max_size=200))
def test_retries_end_within_the_deadline_whatever_each_attempt_costs(costs: list[float]) -> None:
    """Attempts that each fail after ``cost`` seconds: the publish ends (gives up) no later
    than the deadline plus one attempt's timeout."""
    elapsed = 0.0
    for failures, cost in enumerate(costs, start=1):
        elapsed += min(cost, POLICY.attempt_timeout(elapsed))
        delay = POLICY.delay(failures, elapsed)
        if delay is None:
            break
        elapsed += delay
    assert elapsed <= POLICY.deadline_s + POLICY.attempt_timeout_s


def test_leader_election_failures_are_retried_others_are_not() -> None:
    assert retry_reason(nats.errors.NoRespondersError()) == "no_responders"
    assert retry_reason(nats.js.errors.NoStreamResponseError()) == "no_responders"
    assert retry_reason(nats.errors.TimeoutError()) == "timeout"
    assert retry_reason(nats.js.errors.ServiceUnavailableError()) == "unavailable"
    assert retry_reason(nats.errors.ConnectionReconnectingError()) == "reconnecting"
    in_process = nats.js.errors.APIError(
        code=409, err_code=10158, description="duplicate message id is in process"
    )
    assert retry_reason(in_process) == "in_process"
    assert retry_reason(nats.js.errors.APIError(code=409, err_code=10071)) is None
    assert retry_reason(nats.js.errors.BadRequestError()) is None
    assert retry_reason(ValueError("bad")) is None
