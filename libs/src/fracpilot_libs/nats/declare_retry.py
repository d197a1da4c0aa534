"""Declaring streams and KV buckets through a JetStream election: retried, not fatal.

A JetStream API request can go unanswered while a replicated stream is placed or its leader
elected (a loaded 3-node cluster at start-up, a node restarting). Creating and updating a
stream or bucket to the same config is idempotent, so the whole declaration is sent again
with a doubling pause until ``deadline_s``; only then does the error reach the service (which
exits, and Kubernetes restarts it). Errors that retrying cannot mend are raised at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from fracpilot_libs.nats.errors import TRANSIENT_CLIENT_ERRORS, TransientNatsError

log = logging.getLogger(__name__)

T = TypeVar("T")

DECLARE_DEADLINE_S = 120.0
RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT_CLIENT_ERRORS, TransientNatsError)


async def declare_patiently(
    declare: Callable[[], Awaitable[T]],
    what: str,
    *,
    deadline_s: float = DECLARE_DEADLINE_S,
    first_delay_s: float = 0.5,
    max_delay_s: float = 8.0,
) -> T:
    """``declare()``'s result, called again after a transient NATS error until it succeeds or
    ``deadline_s`` has passed (then the last error is raised)."""

    def note(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "declaring on jetstream failed, trying again",
            extra={"what": what, "attempt": state.attempt_number, "error": repr(error)},
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(RETRIED),
        stop=stop_after_delay(deadline_s),
        wait=wait_exponential(multiplier=first_delay_s, max=max_delay_s),
        before_sleep=note,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await declare()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
