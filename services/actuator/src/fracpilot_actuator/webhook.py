"""The mutating admission webhook's HTTPS server: new pods get their workload's target.

As the VPA admission controller does, the actuator keeps each workload's current target
(:class:`WorkloadTarget`, NATS KV bucket ``subjects.TARGET_BUCKET``, held in memory by
:class:`~fracpilot_actuator.stores.targets.TargetCache`) and writes it into each pod of that
workload when the pod is created. Resizing then means recreating pods: whatever recreates them (a
rollout, an eviction, a crash) gets the current target.

:class:`WebhookServer` serves ``POST /mutate``, ``GET /healthz`` and ``GET /readyz`` over TLS
with aiohttp.web (HTTP/1.1 with keep-alive, its parser and limits); each admission is answered
from memory by the pure :func:`~fracpilot_actuator.admission.admit`, which says what is written
and how. A request to ``/mutate`` that is not an AdmissionReview is refused with a 4xx and the
reason: 400 (not JSON, not a review, not readable in its Content-Encoding), 408 (body too
slow), 413 (body too large, also once inflated), 415 (not ``application/json``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
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
from fracpilot_libs.deadlines import cancel_and_wait
from fracpilot_libs.nats.bus import Bus

log = logging.getLogger(__name__)

# --- the HTTPS server -----------------------------------------------------------------------------


class _RefusedError(Exception):
    """A request to /mutate refused before admission: the status and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _text(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=f"{text}\n", content_type="text/plain", headers=headers)


class WebhookServer:
    """HTTPS: ``POST /mutate`` (AdmissionReview), ``GET /healthz``, ``GET /readyz``.

    ``targets`` is read on every admission (a
    :class:`~fracpilot_actuator.stores.targets.TargetCache` or any mapping from KV key to target);
    ``ready`` says whether it is loaded (``/readyz``).
    The certificate and key are read from files, and re-read when they change on disk
    (a Secret volume is updated in place), checked every ``tls_reload_interval_s``.
    Connections are kept alive, as the kube-apiserver reuses them, for ``idle_timeout_s``
    between requests (also the most a request's head may take: aiohttp's keep-alive timer runs
    until a whole head has arrived); a body gets ``body_timeout_s`` and ``max_body_bytes``.
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
        body_timeout_s: float = 10.0,
        tls_handshake_timeout_s: float = 10.0,
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
        # The apiserver's Go client drops idle connections after 90 s: the server must not
        # drop them first, or a review sent on a connection closing under it is lost.
        self._idle_timeout = idle_timeout_s
        self._body_timeout = body_timeout_s
        self._handshake_timeout = tls_handshake_timeout_s
        self._reload_interval = tls_reload_interval_s
        self._tls_stamp: tuple[float, float, int, int] | None = None
        self._ssl = self._new_context()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._reloader: asyncio.Task[None] | None = None
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

        New connections use the new pair (the listening socket keeps this one context); a
        pair that does not load (a half-written update) keeps the old one until the next check.
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

    def application(self) -> web.Application:
        """The routes; ``client_max_size`` bounds a body read (a chunked one too)."""
        app = web.Application(client_max_size=self._max_body)
        app.router.add_route("*", MUTATE_PATH, self._on_mutate)
        app.router.add_route("*", "/healthz", self._on_live)
        app.router.add_route("*", "/livez", self._on_live)
        app.router.add_route("*", "/readyz", self._on_ready)
        app.router.add_route("*", "/{path:.*}", self._on_unknown)
        return app

    async def start(self, host: str = "0.0.0.0", port: int = 8443) -> None:
        """Listen (port 0 picks a free one; :attr:`port` says which)."""
        runner = web.AppRunner(
            self.application(),
            access_log=None,  # every admission is logged below, with its outcome
            keepalive_timeout=self._idle_timeout,
            lingering_time=2.0,  # after a refusal, what is left of a body is read this long
            shutdown_timeout=5.0,
        )
        await runner.setup()
        assert runner.server is not None  # set by setup()
        # aiohttp's TCPSite has no TLS handshake deadline (asyncio's default is 60 s): the
        # runner's protocol factory on a server made here gets one.
        self._server = await asyncio.get_running_loop().create_server(
            runner.server,
            host,
            port,
            ssl=self._ssl,
            ssl_handshake_timeout=self._handshake_timeout,
        )
        self._runner = runner
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = str(sock[0]), int(sock[1])
        if self._reload_interval > 0:
            self._reloader = asyncio.create_task(self._reload_loop(), name="webhook-tls-reload")
        log.info("admission webhook listening", extra={"host": self.host, "port": self.port})

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}{MUTATE_PATH}"

    async def stop(self) -> None:
        """Stop listening, finish the requests in flight and close the open connections."""
        if self._reloader is not None:
            await cancel_and_wait(self._reloader)
            self._reloader = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()  # idle kept-alive connections are closed here
            self._runner = None

    # --- HTTP

    async def _on_live(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return _text(405, "GET only", Allow="GET")
        return _text(200, "ok")

    async def _on_ready(self, request: web.Request) -> web.Response:
        if self._ready():
            return _text(200, "ok")
        return _text(503, "targets not loaded yet")

    async def _on_unknown(self, request: web.Request) -> web.Response:
        return _text(404, "not found")

    async def _on_mutate(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        if request.method != "POST":
            return _text(405, "POST an AdmissionReview", Allow="POST")
        try:
            body = await self._review_body(request)
        except _RefusedError as refused:
            self._count_malformed(refused.reason)
            response = _text(refused.status, refused.reason)
            response.force_close()  # what is left of the body is not read
            return response
        response = self._mutate(body)
        self.metrics.seconds.observe(time.perf_counter() - started)
        return response

    async def _review_body(self, request: web.Request) -> bytes:
        """The body of a review: JSON, within the size and time limits, or refused."""
        if request.content_type != "application/json":
            given = request.headers.get("Content-Type")
            raise _RefusedError(  # !a: a header's undecodable bytes are escaped, not echoed
                415,
                f"an AdmissionReview is application/json, not {given[:100] if given else None!a}",
            )
        if request.content_length is not None and request.content_length > self._max_body:
            raise _RefusedError(413, f"body over {self._max_body} bytes")
        try:
            async with asyncio.timeout(self._body_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:  # chunked, inflated, or over its length
            raise _RefusedError(413, f"body over {self._max_body} bytes") from exc
        except web.RequestPayloadError as exc:  # a Content-Encoding it is not in, say
            why = " ".join(str(exc).split("message:", 1)[-1].split())  # aiohttp: "400, message:"
            raise _RefusedError(400, f"unreadable body: {why[:200]!a}") from exc
        except TimeoutError as exc:
            raise _RefusedError(408, f"body not received within {self._body_timeout:g} s") from exc

    def _count_malformed(self, message: str) -> None:
        self.metrics.malformed.inc()
        self.metrics.admissions.labels(AdmissionOutcome.ERROR.value).inc()
        log.warning("malformed AdmissionReview", extra={"error": message[:500]})

    def _mutate(self, body: bytes) -> web.Response:
        try:
            review = parse_review(body)
        except MalformedReviewError as exc:
            self._count_malformed(str(exc))
            return _text(400, f"malformed AdmissionReview: {exc}")
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
        self.metrics.count_llm_server(admission)
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
        if admission.llm_warning:  # also in the review's warnings, which kubectl shows
            log.warning("LLM server flag asks for more than its fraction", extra={
                **extra, "warning": admission.llm_warning})  # fmt: skip
        return web.Response(
            body=json.dumps(admission.review).encode(), content_type="application/json"
        )


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
