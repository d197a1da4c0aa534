"""Observability for every service: JSON logs, Prometheus metrics with health endpoints, traces.

The HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``) is served by aiohttp.web; readiness
is a flag the service sets once it is connected.

Tracing uses the OpenTelemetry SDK, configured by the standard environment variables
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (and the exporter's
headers, timeout, certificate variables, read by the OTLP/HTTP exporter itself),
``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SDK_DISABLED``; ``FRACPILOT_OTLP_ENDPOINT`` still works as
the OTLP base URL. With no endpoint and no ``OTEL_TRACES_EXPORTER`` nothing is exported (rather
than the SDK's default of a collector on localhost). The first provider a process makes is set
as the global one; tests may pass their own span processor. Logs carry the current span's
``trace_id`` and ``span_id`` (:class:`TraceContextFilter`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra=`` fields become top-level keys."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TraceContextFilter(logging.Filter):
    """Adds the current span's ``trace_id`` and ``span_id`` (lower-case hex, as W3C trace
    context and OTLP spell them) to each record logged inside a span, so that a log line leads
    to its trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            record.trace_id = trace.format_trace_id(span.trace_id)
            record.span_id = trace.format_span_id(span.span_id)
        return True


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.WARNING)


@dataclass(frozen=True)
class TraceExport:
    """Where spans go: ``otlp`` (to ``endpoint``, or where the OTEL_* variables say when it is
    None), ``console`` (stdout), or nowhere."""

    exporter: Literal["otlp", "console", "none"]
    endpoint: str | None = None


_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def trace_export(env: Mapping[str, str], fracpilot_endpoint: str | None = None) -> TraceExport:
    """The exporter the environment asks for (pure). Raises ValueError for what cannot be
    served: an exporter other than otlp/console/none, an OTLP protocol other than
    http/protobuf (the exporter installed)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return TraceExport("none")
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    endpoint_set = bool(fracpilot_endpoint) or any(env.get(v) for v in _ENDPOINT_VARIABLES)
    if not names:
        names = ["otlp"] if endpoint_set else ["none"]
    unknown = set(names) - {"otlp", "console", "none"}
    if unknown or len(names) > 1:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER')!r}: fracpilot exports to "
            "one of otlp, console, none"
        )
    if names[0] != "otlp":
        return TraceExport(names[0])  # type: ignore[arg-type]
    protocol = next((env[v] for v in _PROTOCOL_VARIABLES if env.get(v)), "http/protobuf")
    if protocol.strip() != "http/protobuf":
        raise ValueError(
            f"OTLP protocol {protocol!r}: fracpilot exports OTLP over http/protobuf only "
            "(point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port, 4318)"
        )
    if fracpilot_endpoint:  # FRACPILOT_OTLP_ENDPOINT: a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
        return TraceExport("otlp", f"{fracpilot_endpoint.rstrip('/')}/v1/traces")
    return TraceExport("otlp")  # the exporter reads the OTEL_EXPORTER_OTLP_* variables itself


def service_resource(service: str) -> Resource:
    """The SDK's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) named ``service``
    unless those name it already."""
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service}))
    return resource


def setup_tracing(
    service: str,
    otlp_endpoint: str | None = None,
    extra_processor: SpanProcessor | None = None,
    env: Mapping[str, str] | None = None,
) -> TracerProvider:
    """A tracer provider for the service, exporting where :func:`trace_export` says; the first
    one made in a process becomes the global provider (later ones, e.g. several services in
    one test process, stay private: OpenTelemetry sets the global provider only once)."""
    export = trace_export(os.environ if env is None else env, otlp_endpoint)
    provider = TracerProvider(resource=service_resource(service))
    if export.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=export.endpoint)))
    elif export.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return provider


def inject_trace(headers: dict[str, str]) -> dict[str, str]:
    """Write the current span's context into NATS headers (W3C traceparent)."""
    propagate.inject(headers)
    return headers


def extract_trace(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def build_version(service: str) -> str:
    """The installed version of the service's distribution (``fracpilot-<service>``), else
    of the libs', else ``unknown`` (run from a source tree)."""
    for distribution in (f"fracpilot-{service}", "fracpilot-libs"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return "unknown"


def service_registry(service: str) -> CollectorRegistry:
    """A service's registry: prometheus_client's default collectors (``process_*``,
    ``python_gc_*``, ``python_info``, as the global registry has them; each service keeps its
    own registry so several can share a test process) and ``fracpilot_build_info``."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    build = Gauge(
        "fracpilot_build_info",
        "Always 1; the version label says which fracpilot build runs",
        ["version"],
        registry=registry,
    )
    build.labels(build_version(service)).set(1)
    return registry


def service_ready_gauge(registry: CollectorRegistry, service: str) -> Gauge:
    """``fracpilot_service_ready{component=<service>}``, 1 while the service is ready (not
    ``fracpilot_up``: Prometheus' own ``up`` says whether the scrape worked). The component
    label lets an alert find a service gone missing (``absent()``) whatever the scrape's
    job and target labels are."""
    gauge = Gauge(
        "fracpilot_service_ready",
        "1 while the service is ready (connected to NATS, its checks passing)",
        ["component"],
        registry=registry,
    )
    return gauge.labels(service)


class HealthState:
    """Liveness is the process answering; readiness is set by the service's runtime, and a
    service may add checks (:meth:`add_check`): while one names a problem, it is not ready."""

    def __init__(self) -> None:
        self._ready = False
        self._reason = "starting"
        self._checks: list[Callable[[], str | None]] = []

    @property
    def ready(self) -> bool:
        return self._ready and self._problem() is None

    @property
    def reason(self) -> str:
        problem = self._problem() if self._ready else None
        return problem if problem is not None else self._reason

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self._ready = ready
        self._reason = reason or ("ok" if ready else "not ready")

    def add_check(self, check: Callable[[], str | None]) -> None:
        """``check()``: why the service is not ready (None: no objection)."""
        self._checks.append(check)

    def _problem(self) -> str | None:
        return next((p for check in self._checks if (p := check()) is not None), None)


class TelemetryServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on one port (0 picks a free one),
    with aiohttp.web."""

    def __init__(self, registry: CollectorRegistry, health: HealthState) -> None:
        self._registry = registry
        self._health = health
        self._runner: web.AppRunner | None = None
        self.port = 0

    def application(self) -> web.Application:
        app = web.Application()  # any method: a probe or a scrape only reads
        app.router.add_route("*", "/metrics", self._metrics)
        app.router.add_route("*", "/healthz", self._live)
        app.router.add_route("*", "/readyz", self._readiness)
        app.router.add_route("*", "/{path:.*}", self._unknown)
        return app

    async def start(self, host: str, port: int) -> None:
        # Prometheus keeps its scrape connections open between scrapes: a minute and more.
        runner = web.AppRunner(
            self.application(), access_log=None, keepalive_timeout=75.0, shutdown_timeout=5.0
        )
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner, self.port = runner, site.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        # the text format, whatever the Accept header asks for, as before
        return web.Response(
            body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readiness(self, request: web.Request) -> web.Response:
        return web.Response(
            status=200 if self._health.ready else 503, text=f"{self._health.reason}\n"
        )

    async def _unknown(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="not found\n")
