"""Observability for every service: JSON logs, Prometheus metrics with health endpoints, traces.

The HTTP endpoint is a tiny asyncio server (``/metrics``, ``/healthz``, ``/readyz``) so that a
service needs no web framework; readiness is a flag the service sets once it is connected.
Tracing uses the OpenTelemetry SDK with an OTLP/HTTP exporter when an endpoint is configured and
no exporter otherwise; tests may pass their own span processor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

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
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = f"{span.trace_id:032x}"
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.WARNING)


def setup_tracing(
    service: str,
    otlp_endpoint: str | None = None,
    extra_processor: SpanProcessor | None = None,
) -> TracerProvider:
    """A tracer provider for the service; the global one the first time, a private one after."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint}/v1/traces"))
        )
    if extra_processor is not None:
        provider.add_span_processor(extra_processor)
    return provider


def inject_trace(headers: dict[str, str]) -> dict[str, str]:
    """Write the current span's context into NATS headers (W3C traceparent)."""
    propagate.inject(headers)
    return headers


def extract_trace(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


class HealthState:
    """Liveness is the process answering; readiness is set by the service."""

    def __init__(self) -> None:
        self.ready = False
        self.reason = "starting"

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self.ready = ready
        self.reason = reason or ("ok" if ready else "not ready")


class TelemetryServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on one port (0 picks a free one)."""

    def __init__(self, registry: CollectorRegistry, health: HealthState) -> None:
        self._registry = registry
        self._health = health
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) > 1 else "/"
            status, ctype, body = self._respond(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _respond(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ok = self._health.ready
            return (
                "200 OK" if ok else "503 Service Unavailable",
                "text/plain",
                f"{self._health.reason}\n".encode(),
            )
        return "404 Not Found", "text/plain", b"not found\n"
