"""NATS failures as two kinds of error: transient (retrying may help) and permanent (it cannot).

nats-py's own exceptions are turned into these where they enter fracpilot (connecting in
:mod:`fracpilot_libs.nats.connect`, publishing in :mod:`fracpilot_libs.nats.bus`, feeds in
:mod:`fracpilot_libs.nats.pull_feed`, snapshots in :mod:`fracpilot_libs.nats.kv_snapshot`),
so callers decide by type instead of inspecting client exceptions.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors


class NatsError(RuntimeError):
    """A NATS operation failed; see the two kinds below."""


class TransientNatsError(NatsError):
    """The server is unreachable, restarting or slow: the same call may succeed later."""


class PermanentNatsError(NatsError):
    """Retrying the same call cannot help (refused identity, bad settings, a consumer gone)."""


class NatsUnreachableError(TransientNatsError):
    """No connection could be made, or a publish was not acknowledged however long retried."""


# nats-py's errors that mean "try again": the server is restarting or JetStream is not up yet
# (nats-py turns "no responders" into NoStreamResponse). Only the entry points read this.
TRANSIENT_CLIENT_ERRORS: tuple[type[Exception], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
