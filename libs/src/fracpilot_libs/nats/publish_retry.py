"""When a JetStream publish that was not acknowledged is tried again, and when it is given up.

On a cluster a publish goes unanswered while the stream's leader is being elected: the
server answers "no responders" (no leader has the subject yet) or nothing at all (the
request times out). The same message is sent again, with the same ``Nats-Msg-Id``, so that a
first attempt stored before its ack was lost is recognised by the new leader as a duplicate
(the stream's duplicate window is 120 s, :mod:`fracpilot_libs.nats.streams`): a retry never stores
a sample twice. A retry that reaches the new leader while the first attempt is still being
replicated is refused with 409 "duplicate message id is in process" (err_code 10158,
``JSStreamDuplicateMessageConflict`` in nats-server's ``server/jetstream_errors_generated.go``):
it is tried again too, until the first attempt's fate is known (stored: the retry is
acknowledged as a duplicate). Backoff doubles from ``first_delay_s`` up to ``max_delay_s``;
after ``deadline_s`` since the first attempt the publish is given up. Pure: the time is an
argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.errors
import nats.js.errors

from fracpilot_libs.nats.errors import TRANSIENT_CLIENT_ERRORS

DUPLICATE_IN_PROCESS = 10158  # JSStreamDuplicateMessageConflictErr


@dataclass(frozen=True)
class PublishRetryPolicy:
    deadline_s: float = 30.0  # from the first attempt; then the publish fails
    first_delay_s: float = 0.05
    max_delay_s: float = 2.0
    attempt_timeout_s: float = 5.0  # how long one attempt waits for its ack
    min_attempt_timeout_s: float = 0.5

    def attempt_timeout(self, elapsed_s: float) -> float:
        """How long the attempt started ``elapsed_s`` after the first waits for its ack: no
        longer than the time left, but long enough for a loaded server to answer."""
        left = self.deadline_s - elapsed_s
        return max(self.min_attempt_timeout_s, min(self.attempt_timeout_s, left))

    def delay(self, failed_attempts: int, elapsed_s: float) -> float | None:
        """Seconds to wait before the next attempt, after ``failed_attempts`` (>= 1) failures
        and ``elapsed_s`` since the first attempt began; None: give up (the deadline passed)."""
        left = self.deadline_s - elapsed_s
        if left <= 0:
            return None
        backoff = self.first_delay_s * 2.0 ** min(max(failed_attempts - 1, 0), 30)
        return min(backoff, self.max_delay_s, left)


def retry_reason(exc: BaseException) -> str | None:
    """The metric label of a failure worth retrying (None: not one; it is raised as it is)."""
    if isinstance(exc, nats.js.errors.APIError) and exc.err_code == DUPLICATE_IN_PROCESS:
        return "in_process"
    if not isinstance(exc, TRANSIENT_CLIENT_ERRORS):
        return None
    if isinstance(exc, (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)):
        return "no_responders"
    if isinstance(exc, nats.errors.TimeoutError):
        return "timeout"
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return "unavailable"
    return "reconnecting"
