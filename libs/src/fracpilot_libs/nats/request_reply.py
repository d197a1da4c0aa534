"""Core-NATS request/reply: how a served request is answered, traced and counted.

A request is a call (the requester waits for the reply): its span is a SERVER span, joined to
the requester's trace, with the messaging attributes of the subject it came on."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from fracpilot_libs.nats.bus_metrics import BusMetrics
from fracpilot_libs.nats.spans import (
    BODY_SIZE,
    DESTINATION_NAME,
    MESSAGING_SYSTEM,
    OPERATION_NAME,
    OPERATION_TYPE,
    SYSTEM,
    mark_failed,
)
from fracpilot_libs.telemetry import extract_trace

log = logging.getLogger(__name__)

RequestHandler = Callable[[bytes, Mapping[str, str]], Awaitable[bytes]]
"""Serves one request: the raw payload and headers in, the raw reply out."""


def error_reply(reason: str) -> bytes:
    """The reply to a request whose handler failed: ``{"ok": false, "error": reason}``."""
    return json.dumps({"ok": False, "error": reason}).encode()


def request_callback(
    tracer: trace.Tracer,
    metrics: BusMetrics,
    subject: str,
    handler: RequestHandler,
    on_error: Callable[[str], bytes],
) -> Callable[[Msg], Awaitable[None]]:
    """The subscription callback serving ``subject``: each request in a server span joined to
    the caller's trace; a handler that raises is logged and answered ``on_error(reason)``."""

    async def on_request(msg: Msg) -> None:
        headers = dict(msg.headers or {})
        with tracer.start_as_current_span(
            f"serve {subject}",
            context=extract_trace(headers),
            kind=SpanKind.SERVER,
            attributes={
                MESSAGING_SYSTEM: SYSTEM,
                DESTINATION_NAME: subject,
                OPERATION_TYPE: "process",
                OPERATION_NAME: "process",
                BODY_SIZE: len(msg.data),
            },
        ) as span:
            try:
                reply = await handler(msg.data, headers)
                outcome = "replied"
            except Exception as exc:
                log.exception("request handler failed", extra={"subject": subject})
                span.record_exception(exc)
                mark_failed(span, type(exc).__qualname__, "handler failed")
                reply = on_error(f"internal error: {exc!r}"[:2000])
                outcome = "failed"
            metrics.requests.labels(subject, outcome).inc()
            if not msg.reply:
                return
            try:
                await msg.respond(reply)
            except Exception as exc:  # the requester is gone, or the connection is
                log.warning("could not reply", extra={"subject": subject, "error": str(exc)})

    return on_request
