"""What a failed Kubernetes API call is, and how :class:`~fracpilot_actuator.kube.api.KubeApi`
tries it again.

A client failure is transient (no HTTP answer, 429, 5xx: :func:`transient`) or not, and
leaves the actuator's API layer as a :class:`~fracpilot_actuator.kube.errors.KubeError` of that
kind (:func:`wrapped`). :class:`ApiRetry` is the retry policy: a bounded number of tries,
jittered doubling waits, the server's ``Retry-After`` honoured. Kept apart from the calls
themselves (:mod:`fracpilot_actuator.kube.api`): which calls the actuator makes changes with
its RBAC, this with the client's and the server's failure modes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

import urllib3
from kubernetes.client.exceptions import ApiException
from tenacity import RetryCallState

from fracpilot_actuator.kube.errors import KubeError, PermanentKubeError, TransientKubeError

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def status_of(exc: BaseException | None) -> int | None:
    return int(exc.status) if isinstance(exc, ApiException) and exc.status else None


def unanswered(exc: BaseException) -> bool:
    """The call got no HTTP answer (timeout, refused, reset): it may or may not have happened."""
    if isinstance(exc, ApiException):
        return not exc.status
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError))


def transient(exc: BaseException) -> bool:
    """Worth trying again: no answer, overloaded (429) or a server error (5xx)."""
    return unanswered(exc) or status_of(exc) in TRANSIENT_STATUSES


def api_message(exc: BaseException) -> str:
    """The server's message from an error's JSON body; the exception's text without one."""
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body).get("message", "")) if body else str(exc)
    except (ValueError, AttributeError):
        return str(body)[:300]


def wrapped(exc: BaseException) -> BaseException:
    """A client failure as a :class:`KubeError` (transient or permanent); others unchanged."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException) or unanswered(exc):
        kind = TransientKubeError if transient(exc) else PermanentKubeError
        return kind(str(exc), status=status_of(exc), message=api_message(exc))
    return exc


def retry_after_s(exc: BaseException | None) -> float:
    """The server's ``Retry-After`` (seconds) on a 429 or 503; 0 when it gave none."""
    headers = getattr(exc, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After", 0)))
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class ApiRetry:
    """How often and how patiently a failed call is tried again (see the module docstring)."""

    attempts: int = 5
    """Tries in all, the first included."""
    backoff_s: float = 0.2
    """The wait after the first failure, doubling after each further one..."""
    backoff_max_s: float = 5.0
    """...up to this; each wait is drawn between half of it and all of it (jitter), and is
    at least the server's Retry-After when that is not longer than this."""

    def wait(self, state: RetryCallState) -> float:
        ceiling = min(self.backoff_max_s, self.backoff_s * 2 ** (state.attempt_number - 1))
        jittered = random.uniform(ceiling / 2, ceiling)
        failure = state.outcome.exception() if state.outcome else None
        return max(jittered, min(retry_after_s(failure), self.backoff_max_s))


OnRetry = Callable[[str, str], None]
"""Told (call, reason) before each retry: for a metric."""
