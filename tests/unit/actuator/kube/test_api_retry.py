"""Which Kubernetes API failures are retried, and how long the actuator waits between tries."""

from __future__ import annotations

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException
from tenacity import RetryCallState, Retrying

from fracpilot_actuator.kube.api_retry import (
    ApiRetry,
    retry_after_s,
    transient,
    unanswered,
    wrapped,
)
from fracpilot_actuator.kube.errors import KubeError, PermanentKubeError, TransientKubeError


def failed(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="test")
    exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (failed(429), True),
        (failed(500), True),
        (failed(503), True),
        (failed(504), True),
        (failed(409), False),  # a conflict is retried only by calls that read again first
        (failed(404), False),
        (failed(403), False),
        (failed(422), False),
        (ApiException(status=0, reason="SSLError"), True),  # the client's "no answer"
        (urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"), True),
        (urllib3.exceptions.ProtocolError("Connection aborted."), True),
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (ValueError("a bug"), False),
    ],
)
def test_transient_failures_are_told_apart(exc: BaseException, expected: bool) -> None:
    assert transient(exc) is expected


def test_only_failures_without_an_answer_leave_the_outcome_unknown() -> None:
    assert unanswered(urllib3.exceptions.ReadTimeoutError(None, "/api", "timed out"))
    assert not unanswered(failed(500))
    assert not unanswered(failed(429))


@pytest.mark.parametrize(
    ("exc", "kind", "status"),
    [
        (failed(429), TransientKubeError, 429),
        (failed(503), TransientKubeError, 503),
        (failed(409), PermanentKubeError, 409),
        (failed(404), PermanentKubeError, 404),
        (ApiException(status=0, reason="SSLError"), TransientKubeError, None),
        (urllib3.exceptions.ReadTimeoutError(None, "/api", "timed out"), TransientKubeError, None),
        (ConnectionRefusedError(), TransientKubeError, None),
    ],
)
def test_client_failures_enter_as_transient_or_permanent_errors(
    exc: BaseException, kind: type[KubeError], status: int | None
) -> None:
    error = wrapped(exc)
    assert type(error) is kind
    assert isinstance(error, KubeError)
    assert error.status == status
    assert error.unanswered is (status is None)
    assert error.server_failed is (status is None or status >= 500)
    assert str(error) == str(exc)


def test_the_server_message_is_read_from_the_body_and_a_bug_is_not_wrapped() -> None:
    refused = failed(429)
    refused.body = '{"kind": "Status", "message": "Cannot evict pod as it would violate the PDB"}'
    error = wrapped(refused)
    assert isinstance(error, KubeError)
    assert error.message == "Cannot evict pod as it would violate the PDB"
    bug = ValueError("a bug")
    assert wrapped(bug) is bug


def state_after(attempt: int, exc: BaseException) -> RetryCallState:
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


@given(attempt=st.integers(1, 30), base=st.floats(0.01, 2), cap=st.floats(0.05, 10))
def test_waits_double_with_jitter_up_to_the_cap(attempt: int, base: float, cap: float) -> None:
    policy = ApiRetry(attempts=5, backoff_s=base, backoff_max_s=cap)
    ceiling = min(cap, base * 2 ** (attempt - 1))
    wait = policy.wait(state_after(attempt, failed(500)))
    assert ceiling / 2 <= wait <= ceiling


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    policy = ApiRetry(attempts=5, backoff_s=0.1, backoff_max_s=5.0)
    assert policy.wait(state_after(1, failed(429, "3"))) == 3.0
    assert policy.wait(state_after(1, failed(429, "60"))) == 5.0  # bounded
    assert retry_after_s(failed(429, "soon")) == 0.0
    assert retry_after_s(ValueError()) == 0.0
