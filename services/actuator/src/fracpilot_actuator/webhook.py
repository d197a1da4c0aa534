"""The mutating admission webhook's HTTPS server: new pods get their workload's target.

As the VPA admission controller does, the actuator keeps each workload's current target
(:class:`WorkloadTarget`, NATS KV bucket ``subjects.TARGET_BUCKET``, held in memory by
:class:`~fracpilot_actuator.stores.targets.TargetCache`) and writes it into each pod of that
workload when the pod is created. Resizing then means recreating pods: whatever recreates them (a
rollout, an eviction, a crash) gets the current target.

:class:`WebhookServer` is an asyncio HTTPS server (stdlib ``ssl`` + streams, HTTP/1.1 with
keep-alive) serving ``POST /mutate``, ``GET /healthz`` and ``GET /readyz``; each admission is
answered from memory by the pure :func:`~fracpilot_actuator.admission.admit`, which says what
is written and how. A body that is not an AdmissionReview gets 400 with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from fracpilot_actuator.admission import (
    MUTATE_PATH,
    AdmissionOutcome,
    MalformedReviewError,
    admit,
    parse_review,
    pod_name,
)
from fracpilot_actuator.metrics import WebhookMetrics
from fracpilot_actuator.settings import OptInSettings, WebhookSettings
from fracpilot_actuator.stores.targets import TargetCache
from fracpilot_libs.contracts import WorkloadTarget
from fracpilot_libs.nats.bus import Bus

log = logging.getLogger(__name__)

# --- the HTTPS server -----------------------------------------------------------------------------


class _BadRequestError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class _Response:
    status: str
    content_type: str
    body: bytes


class WebhookServer:
    """HTTPS: ``POST /mutate`` (AdmissionReview), ``GET /healthz``, ``GET /readyz``.

    ``targets`` is read on every admission (a
    :class:`~fracpilot_actuator.stores.targets.TargetCache` or any mapping from KV key to target);
    ``ready`` says whether it is loaded (``/readyz``).
    The certificate and key are read from files, and re-read when they change on disk
    (a Secret volume is updated in place), checked every ``tls_reload_interval_s``.
    Connections are kept alive, as the kube-apiserver reuses them.
    ``opt_in``, ``namespace_labels`` (None: not known): the opt-in rule, checked again by admit.
    """

    def __init__(
        self,
        targets: Mapping[str, WorkloadTarget],
        registry: CollectorRegistry,
        *,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        cluster: str = "default",
        ready: Callable[[], bool] | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        idle_timeout_s: float = 90.0,
        header_timeout_s: float = 10.0,
        tls_reload_interval_s: float = 30.0,
        opt_in: OptInSettings | None = None,
        namespace_labels: Callable[[str], Mapping[str, Any] | None] | None = None,
        hami_memory_factor: int = 1,
    ) -> None:
        self.targets = targets
        self.opt_in = opt_in
        self.hami_memory_factor = hami_memory_factor  # HAMi reads gpumem in these units
        self._namespace_labels = namespace_labels
        self.cluster = cluster
        self.metrics = WebhookMetrics(registry)
        self.metrics.targets.set_function(lambda: len(self.targets))
        self._ready = ready or (lambda: True)
        self._cert_file, self._key_file = os.fspath(cert_file), os.fspath(key_file)
        self._max_body = max_body_bytes
        self._idle_timeout = idle_timeout_s
        self._header_timeout = header_timeout_s
        self._reload_interval = tls_reload_interval_s
        self._tls_stamp: tuple[float, float, int, int] | None = None
        self._ssl = self._new_context()
        self._server: asyncio.Server | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.host = ""
        self.port = 0

    # --- TLS

    def _stamp(self) -> tuple[float, float, int, int]:
        cert, key = os.stat(self._cert_file), os.stat(self._key_file)
        return cert.st_mtime, key.st_mtime, cert.st_size, key.st_size

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        self._tls_stamp = self._stamp()
        context.load_cert_chain(self._cert_file, self._key_file)
        return context

    def reload_tls(self) -> bool:
        """Load the certificate and key again if either file changed; True when reloaded.

        New connections use the new pair; a pair that does not load (a half-written update)
        keeps the old one until the next check.
        """
        try:
            stamp = self._stamp()
            if stamp == self._tls_stamp:
                return False
            self._ssl.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("could not reload the serving certificate", extra={"error": str(exc)})
            self.metrics.tls_reloads.labels("failed").inc()
            return False
        self._tls_stamp = stamp
        self.metrics.tls_reloads.labels("reloaded").inc()
        log.info("reloaded the serving certificate", extra={"cert_file": self._cert_file})
        return True

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self._reload_interval)
            self.reload_tls()

    # --- lifecycle

    async def start(self, host: str = "0.0.0.0", port: int = 8443) -> None:
        """Listen (port 0 picks a free one; :attr:`port` says which)."""
        self._server = await asyncio.start_server(
            self._on_connection, host, port, ssl=self._ssl, ssl_handshake_timeout=10
        )
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = str(sock[0]), int(sock[1])
        if self._reload_interval > 0:
            self._reloader = asyncio.create_task(self._reload_loop(), name="webhook-tls-reload")
        log.info("admission webhook listening", extra={"host": self.host, "port": self.port})

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}{MUTATE_PATH}"

    async def stop(self) -> None:
        """Stop listening and close the open (kept-alive) connections."""
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
            self._reloader = None
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections.values()):
                writer.transport.abort()  # an idle kept-alive connection ends its handler
            if self._connections:
                _, pending = await asyncio.wait(list(self._connections), timeout=2)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=2)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    # --- HTTP/1.1

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections[task] = writer
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, ssl.SSLError, TimeoutError, ValueError, EOFError):
            pass  # the peer went away or sent garbage (IncompleteReadError is an EOFError)
        except asyncio.CancelledError:
            # Only stop() cancels a handler; asyncio's streams would log a cancelled one.
            pass
        finally:
            if task is not None:
                self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            line = await asyncio.wait_for(reader.readline(), self._idle_timeout)
        except TimeoutError:
            return False
        if not line:
            return False
        started = time.perf_counter()
        try:
            method, path, version, headers = await asyncio.wait_for(
                self._read_head(line, reader), self._header_timeout
            )
        except (_BadRequestError, ValueError, asyncio.LimitOverrunError) as exc:
            message = exc.message if isinstance(exc, _BadRequestError) else "malformed request head"
            await self._write(
                writer, _Response("400 Bad Request", "text/plain", f"{message}\n".encode()), False
            )
            return False
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        try:
            body = await self._read_body(reader, writer, headers)
        except _BadRequestError as exc:
            response = _Response(exc.status, "text/plain", f"{exc.message}\n".encode())
            if path == MUTATE_PATH:
                self._count_malformed(exc.message)
            await self._write(writer, response, False)
            return False
        response = self._route(method, path, body)
        await self._write(writer, response, keep_alive)
        if path == MUTATE_PATH and method == "POST":
            self.metrics.seconds.observe(time.perf_counter() - started)
        return keep_alive

    async def _read_head(
        self, line: bytes, reader: asyncio.StreamReader
    ) -> tuple[str, str, str, dict[str, str]]:
        parts = line.decode("latin-1").strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequestError("400 Bad Request", "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for _ in range(200):
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequestError("400 Bad Request", "malformed header line")
            headers[name.strip().lower()] = value.strip()
        else:
            raise _BadRequestError("400 Bad Request", "too many headers")
        return method, target.split("?", 1)[0], version, headers

    async def _read_body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> bytes:
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunked(reader)
        length_text = headers.get("content-length", "0")
        if not (length_text.isascii() and length_text.isdigit()):
            raise _BadRequestError("400 Bad Request", f"bad Content-Length {length_text!r}")
        length = int(length_text)
        if length > self._max_body:
            raise _BadRequestError("413 Content Too Large", f"body over {self._max_body} bytes")
        return await reader.readexactly(length) if length else b""

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while True:
            size_line = (await reader.readline()).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError as exc:
                raise _BadRequestError("400 Bad Request", "malformed chunk size") from exc
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(body)
            if len(body) + size > self._max_body:
                raise _BadRequestError("413 Content Too Large", f"body over {self._max_body} bytes")
            body += await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF

    async def _write(
        self, writer: asyncio.StreamWriter, response: _Response, keep_alive: bool
    ) -> None:
        head = (
            f"HTTP/1.1 {response.status}\r\nContent-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + response.body)
        await writer.drain()

    def _route(self, method: str, path: str, body: bytes) -> _Response:
        if path == MUTATE_PATH:
            if method != "POST":
                return _Response(
                    "405 Method Not Allowed", "text/plain", b"POST an AdmissionReview\n"
                )
            return self._mutate(body)
        if path in ("/healthz", "/livez"):
            if method != "GET":
                return _Response("405 Method Not Allowed", "text/plain", b"GET only\n")
            return _Response("200 OK", "text/plain", b"ok\n")
        if path == "/readyz":
            if self._ready():
                return _Response("200 OK", "text/plain", b"ok\n")
            return _Response("503 Service Unavailable", "text/plain", b"targets not loaded yet\n")
        return _Response("404 Not Found", "text/plain", b"not found\n")

    def _count_malformed(self, message: str) -> None:
        self.metrics.malformed.inc()
        self.metrics.admissions.labels(AdmissionOutcome.ERROR.value).inc()
        log.warning("malformed AdmissionReview", extra={"error": message[:500]})

    def _mutate(self, body: bytes) -> _Response:
        try:
            review = parse_review(body)
        except MalformedReviewError as exc:
            self._count_malformed(str(exc))
            return _Response(
                "400 Bad Request", "text/plain", f"malformed AdmissionReview: {exc}\n".encode()
            )
        request: dict[str, Any] = review["request"]  # parse_review checked it is an object
        namespace = request.get("namespace")
        labels = _labels_of(self._namespace_labels, namespace)
        admission = admit(
            review,
            self.targets,
            self.cluster,
            opt_in=self.opt_in,
            namespace_labels=labels,
            hami_memory_factor=self.hami_memory_factor,
        )
        self.metrics.admissions.labels(admission.outcome.value).inc()
        pod = request.get("object")
        extra = {
            "outcome": admission.outcome.value,
            "reason": admission.reason,
            "namespace": namespace,
            "pod": pod_name(pod) if isinstance(pod, dict) else None,
            "workload": admission.workload.key if admission.workload else None,
            "decision_id": admission.target.decision_id if admission.target else None,
        }
        if admission.outcome is AdmissionOutcome.PATCHED:
            log.info("pod given its workload's target", extra=extra)
        elif admission.outcome is AdmissionOutcome.ERROR:
            log.warning(
                "pod admitted unpatched after an error", extra=extra, exc_info=admission.error
            )
        else:
            log.debug("pod admitted", extra=extra)
        return _Response("200 OK", "application/json", json.dumps(admission.review).encode())


def _labels_of(
    lookup: Callable[[str], Mapping[str, Any] | None] | None, namespace: Any
) -> Mapping[str, Any] | None:
    """A namespace's labels from the lookup; None when there is none or it does not know."""
    return lookup(namespace) if lookup is not None and isinstance(namespace, str) else None


async def start_webhook(
    bus: Bus,
    registry: CollectorRegistry,
    settings: WebhookSettings,
    *,
    cluster: str,
    opt_in: OptInSettings | None = None,
    namespace_labels: Callable[[str], Mapping[str, Any] | None] | None = None,
    hami_memory_factor: int = 1,
) -> tuple[WebhookServer, TargetCache]:
    """Follow the targets bucket and serve the webhook: what the actuator's start runs.

    Every replica serves it (the targets are read-only here), leader or not. ``/readyz`` is
    503 until the targets present at start are loaded; admissions before that find no target
    and admit pods unchanged. Stop with ``await server.stop()``; the bucket watch ends with
    the bus's consumers.
    """
    cache = TargetCache()
    await cache.start(bus)
    server = WebhookServer(
        cache,
        registry,
        cert_file=settings.cert_file,
        key_file=settings.key_file,
        cluster=cluster,
        ready=lambda: cache.synced,
        opt_in=opt_in,
        namespace_labels=namespace_labels,
        hami_memory_factor=hami_memory_factor,
    )
    await server.start(settings.host, settings.port)
    return server, cache
