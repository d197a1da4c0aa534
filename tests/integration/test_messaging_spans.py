"""OpenTelemetry for the NATS adapters against a real nats-server, and the standard OTel setup.

- a publish is a PRODUCER span with the messaging semantic conventions (messaging.system=nats,
  destination, operation type send, the Nats-Msg-Id as message id), whose context travels in
  the message's headers;
- handling the delivered message is a CONSUMER span (operation type process) in the same
  trace, the publish span its parent and its link; a failing handler marks it failed;
- a log line written inside the handler carries that span's trace_id and span_id;
- OTEL_EXPORTER_OTLP_ENDPOINT sends the spans, over OTLP/HTTP, to a receiver listening there
  (a real HTTP server on loopback, decoding the protobuf request), named by OTEL_SERVICE_NAME.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.telemetry import JsonFormatter, TraceContextFilter, setup_tracing
from helpers import reset_nats, usage_stream_of, wait_for

pytestmark = pytest.mark.integration
log = logging.getLogger("test.messaging_spans")


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def provider_with(exporter: InMemorySpanExporter, service: str = "test") -> TracerProvider:
    return setup_tracing(service, None, SimpleSpanProcessor(exporter), env={})


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """What the services' log handler (the filter and the JSON formatter) writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter("test"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        log.removeHandler(handler)


async def bus_with(url: str, provider: TracerProvider) -> Bus:
    bus = Bus("test", ServiceSettings(nats={"url": url}), CollectorRegistry(), provider)
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    return bus


def only(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in spans if s.kind is kind]


async def test_a_publish_is_a_producer_span_and_its_handling_a_consumer_span_in_its_trace(
    nats_url: str, spans: InMemorySpanExporter, log_lines: io.StringIO
) -> None:
    await reset_nats(nats_url)
    bus = await bus_with(nats_url, provider_with(spans))
    handled: list[tuple[str, str]] = []

    async def handler(s: UsageSample, _msg: Msg) -> None:
        context = trace.get_current_span().get_span_context()
        handled.append((f"{context.trace_id:032x}", f"{context.span_id:016x}"))
        log.info("handled a sample", extra={"sample": s.sample_id})

    s = sample()
    subject = subjects.usage_subject(s.workload)
    await bus.consume(
        stream=usage_stream_of(s.workload),
        durable="spans",
        model=UsageSample,
        filter_subject=f"{subjects.USAGE_PREFIX}.>",
        handler=handler,
    )
    try:
        assert await bus.publish(subject, s, s.sample_id)
        await wait_for(lambda: len(only(spans.get_finished_spans(), SpanKind.CONSUMER)) == 1)
    finally:
        await bus.close()

    (producer,) = only(spans.get_finished_spans(), SpanKind.PRODUCER)
    (consumer,) = only(spans.get_finished_spans(), SpanKind.CONSUMER)
    assert producer.name == "publish fracpilot.usage.v1.>"
    assert dict(producer.attributes or {}) == {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": subject,
        "messaging.destination.template": "fracpilot.usage.v1.>",
        "messaging.message.id": s.sample_id,
        "messaging.message.body.size": len(s.model_dump_json().encode()),
    }
    assert consumer.name == "process fracpilot.usage.v1.>"
    attributes = dict(consumer.attributes or {})
    assert attributes["messaging.system"] == "nats"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == subject
    assert attributes["messaging.message.id"] == s.sample_id
    assert attributes["messaging.client.id"] == "spans"
    assert "messaging.destination" not in attributes  # the old, deprecated attribute
    # One trace: the consumer span is the producer's child (the context came in the headers),
    # and links to it (the message's creation context).
    assert producer.context is not None
    assert consumer.context is not None
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None
    assert consumer.parent.span_id == producer.context.span_id
    assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]
    # The handler ran inside the consumer span; its log line names it.
    assert handled == [(f"{consumer.context.trace_id:032x}", f"{consumer.context.span_id:016x}")]
    (line,) = [json.loads(x) for x in log_lines.getvalue().splitlines()]
    assert line["msg"] == "handled a sample"
    assert line["trace_id"] == f"{consumer.context.trace_id:032x}"
    assert line["span_id"] == f"{consumer.context.span_id:016x}"


async def test_a_failing_handler_marks_its_consumer_span_failed(
    nats_url: str, spans: InMemorySpanExporter
) -> None:
    await reset_nats(nats_url)
    bus = await bus_with(nats_url, provider_with(spans))

    async def handler(_s: UsageSample, _msg: Msg) -> None:
        raise RuntimeError("broken")

    s = sample()
    await bus.consume(
        stream=usage_stream_of(s.workload),
        durable="failing",
        model=UsageSample,
        filter_subject=f"{subjects.USAGE_PREFIX}.>",
        handler=handler,
        retry_delay_s=30,  # one delivery is enough here
    )
    try:
        await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
        await wait_for(lambda: bool(only(spans.get_finished_spans(), SpanKind.CONSUMER)))
    finally:
        await bus.close()
    consumer = only(spans.get_finished_spans(), SpanKind.CONSUMER)[0]
    assert consumer.status.status_code is StatusCode.ERROR
    assert (consumer.attributes or {})["error.type"] == "RuntimeError"


def test_a_log_line_outside_any_span_has_no_ids(log_lines: io.StringIO) -> None:
    log.info("no span here")
    line = json.loads(log_lines.getvalue())
    assert "trace_id" not in line
    assert "span_id" not in line


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each decoded export request."""

    received: list[tuple[str, ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append((self.path, request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[tuple[str, ExportTraceServiceRequest]]]]:
    received: list[tuple[str, ExportTraceServiceRequest]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()


def test_otel_exporter_otlp_endpoint_sends_the_spans_there(
    otlp_receiver: tuple[str, list[tuple[str, ExportTraceServiceRequest]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, received = otlp_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ingest-eu-1")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    provider = setup_tracing("ingest")
    with provider.get_tracer("t").start_as_current_span("exported", kind=SpanKind.PRODUCER):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    ((path, request),) = received
    assert path == "/v1/traces"
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get(
        "service.name"
    )
    assert service == "ingest-eu-1"  # OTEL_SERVICE_NAME wins over the service's own name
    names = [s.name for scope in resource_spans.scope_spans for s in scope.spans]
    assert names == ["exported"]


def test_fracpilot_otlp_endpoint_still_works_and_the_service_names_itself(
    otlp_receiver: tuple[str, list[tuple[str, ExportTraceServiceRequest]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, received = otlp_receiver
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(variable, raising=False)
    provider = setup_tracing("decision", otlp_endpoint=url)
    with provider.get_tracer("t").start_as_current_span("exported"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    ((path, request),) = received
    assert path == "/v1/traces"
    attributes = {
        a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes
    }
    assert attributes["service.name"] == "decision"


def test_the_first_provider_is_the_global_one_and_later_ones_stay_private() -> None:
    first = setup_tracing("a", env={})
    second = setup_tracing("b", env={})
    current = trace.get_tracer_provider()
    assert current is not second
    if current is first:  # this process had no global provider before (run alone)
        assert isinstance(current, TracerProvider)
    assert not isinstance(current, trace.ProxyTracerProvider)
