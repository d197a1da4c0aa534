"""OpenTelemetry spans for NATS messages, after the messaging semantic conventions.

Upstream: open-telemetry/semantic-conventions docs/messaging/messaging-spans.md (span name
``{messaging.operation.name} {destination}``; operation types ``send`` -> PRODUCER, ``process``
-> CONSUMER; the consumer span links to the message's creation context and, for a single
message, may be its child) and docs/messaging/nats.md (``messaging.system`` is ``nats``;
``messaging.destination.name`` the subject; ``messaging.client.id`` the JetStream consumer's
name). Attribute names as opentelemetry-semantic-conventions spells them
(``opentelemetry.semconv._incubating.attributes.messaging_attributes``).

A publish is a PRODUCER span whose context travels in the message's headers (W3C
``traceparent``): it is the message's creation context. Handling a delivered message is a
CONSUMER span, a child of that context (one trace from sample to action) with a link to it.
Span names use a low-cardinality template of the subject (``fracpilot.usage.v1.>``), the
attributes the full subject.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from fracpilot_libs.nats.bus_metrics import subject_prefix
from fracpilot_libs.telemetry import extract_trace, inject_trace

SYSTEM = "nats"
MSG_ID_HEADER = "Nats-Msg-Id"

# opentelemetry.semconv._incubating.attributes.messaging_attributes (incubating: not imported)
MESSAGING_SYSTEM = "messaging.system"
DESTINATION_NAME = "messaging.destination.name"
DESTINATION_TEMPLATE = "messaging.destination.template"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"
CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"


def destination_template(subject: str) -> str:
    """The subject's low-cardinality form: its prefix, with ``.>`` for the tokens after it
    (workload names, partitions)."""
    prefix = subject_prefix(subject)
    return subject if prefix == subject else f"{prefix}.>"


def _attributes(
    operation_type: str, operation_name: str, subject: str, body: bytes, msg_id: str | None
) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: operation_type,
        OPERATION_NAME: operation_name,
        DESTINATION_NAME: subject,
        DESTINATION_TEMPLATE: destination_template(subject),
        BODY_SIZE: len(body),
    }
    if msg_id:
        attributes[MESSAGE_ID] = msg_id
    return attributes


@contextlib.contextmanager
def send_span(
    tracer: trace.Tracer, subject: str, body: bytes, msg_id: str | None = None
) -> Iterator[dict[str, str]]:
    """A PRODUCER span around one publish; yields the headers to send, carrying the span's
    context (and ``Nats-Msg-Id`` when given)."""
    with tracer.start_as_current_span(
        f"publish {destination_template(subject)}",
        kind=SpanKind.PRODUCER,
        attributes=_attributes("send", "publish", subject, body, msg_id),
    ):
        headers = inject_trace({})
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        yield headers


def _consumer_name(msg: Msg) -> str | None:
    try:
        return msg.metadata.consumer  # a JetStream delivery names its consumer in its reply
    except Exception:  # a core-NATS message: no JetStream metadata
        return None


@contextlib.contextmanager
def process_span(tracer: trace.Tracer, msg: Msg, consumer: str | None = None) -> Iterator[Span]:
    """A CONSUMER span around handling one delivered message: a child of the context its
    headers carry, linked to it. ``consumer`` defaults to the JetStream consumer's name."""
    headers: Mapping[str, str] = msg.headers or {}
    parent = extract_trace(headers)
    created = trace.get_current_span(parent).get_span_context()
    attributes = _attributes(
        "process", "process", msg.subject, msg.data, headers.get(MSG_ID_HEADER)
    )
    if name := consumer or _consumer_name(msg):
        attributes[CLIENT_ID] = name
    with tracer.start_as_current_span(
        f"process {destination_template(msg.subject)}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=[Link(created)] if created.is_valid else None,
    ) as span:
        yield span


def mark_failed(span: Span, error_type: str, description: str = "") -> None:
    """Record that the operation failed (``error.type`` low-cardinality, status ERROR)."""
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, description[:500] or error_type))
