"""Declaring streams and KV buckets through a JetStream election: retried, not fatal.

A JetStream API request can go unanswered while a replicated stream is placed or its leader
elected (a loaded 3-node cluster at start-up, a node restarting), or be refused with "no
suitable peers for placement" (JetStream error 10005) while a peer is not yet current in the
meta group: seen at a 3-node cluster's start-up, all three servers up and answering, when a
replicated stream was declared a moment too early. Creating and updating a
stream or bucket to the same config is idempotent, so the whole declaration is sent again
with a doubling pause until ``deadline_s``; only then does the error reach the service (which
exits, and Kubernetes restarts it). Errors that retrying cannot mend are raised at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.js.errors
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from fracpilot_libs.nats.errors import TRANSIENT_CLIENT_ERRORS, TransientNatsError

log = logging.getLogger(__name__)

T = TypeVar("T")

DECLARE_DEADLINE_S = 120.0
RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT_CLIENT_ERRORS, TransientNatsError)
# JSClusterNoPeersErrF in nats-server's errors.json: "no suitable peers for placement", with
# the reason after it (a peer offline, resources, tags). Retried until the deadline: a peer
# coming back mends it; a cluster too small for the replicas asked for does not, and the error
# is raised once the deadline has passed (each attempt logged with it).
NO_PEERS_FOR_PLACEMENT = 10005


def retried(error: BaseException) -> bool:
    """Whether a declaration that failed with ``error`` is sent again."""
    if isinstance(error, RETRIED):
        return True
    return isinstance(error, nats.js.errors.APIError) and error.err_code == NO_PEERS_FOR_PLACEMENT


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
            # str: nats-py's API errors say their code and description there, not in repr
            extra={
                "what": what,
                "attempt": state.attempt_number,
                "error": str(error) or repr(error),
            },
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(retried),
        stop=stop_after_delay(deadline_s),
        wait=wait_exponential(multiplier=first_delay_s, max=max_delay_s),
        before_sleep=note,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await declare()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
