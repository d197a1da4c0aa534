"""The process shell every service runs in: telemetry, bus, signals and graceful shutdown.

A service supplies a ``start`` coroutine (declare, subscribe, spawn loops) and optionally a
``stop`` coroutine. Once started, ``/readyz`` follows the NATS connection and JetStream's
availability (in a cluster, a majority of its servers answering: a meta leader can be
elected). On SIGTERM or SIGINT the runtime marks itself not ready, stops serving requests and
lets the consumers finish the message in hand, then calls ``stop`` (the connection is still
open, so it may publish or write a last checkpoint), flushes and closes the NATS connection
and exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.servers import has_quorum, servers_answering
from fracpilot_libs.telemetry import (
    HealthState,
    TelemetryServer,
    service_ready_gauge,
    service_registry,
    setup_tracing,
)

log = logging.getLogger(__name__)


class ServiceRuntime:
    """Owns what a service needs from the outside world, so its logic can stay free of it."""

    def __init__(
        self,
        service: str,
        settings: ServiceSettings,
        span_processor: SpanProcessor | None = None,
    ) -> None:
        self.service = service
        self.settings = settings
        self.registry = service_registry(service)
        self.health = HealthState()
        self.tracer_provider: TracerProvider = setup_tracing(
            service, settings.otlp_endpoint, span_processor
        )
        self.bus = Bus(service, settings, self.registry, self.tracer_provider)
        self.http = TelemetryServer(self.registry, self.health)
        self.stop_requested = asyncio.Event()
        self._up = service_ready_gauge(self.registry, service)

    async def run(
        self,
        start: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]] | None = None,
        install_signals: bool = True,
    ) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop_requested.set)
        await self.http.start(self.settings.metrics.host, self.settings.metrics.port)
        log.info(
            "telemetry endpoint listening",
            extra={"host": self.settings.metrics.host, "port": self.http.port},
        )
        try:
            await self.bus.connect()
            await self.bus.ensure_streams()
            await start()
            self.health.set_ready(True)
            self._up.set(1)
            log.info("service ready")
            follower = asyncio.create_task(self._follow_connection())
            await self.stop_requested.wait()
            follower.cancel()
            log.info("shutting down: draining")
        finally:
            self.health.set_ready(False, "shutting down")
            self._up.set(0)
            await self.bus.stop_consuming()
            if stop is not None:
                try:
                    await stop()
                except Exception:
                    log.exception("the service's stop failed")
            await self.bus.close()
            await self.http.stop()
            self.tracer_provider.shutdown()
            log.info("stopped")

    async def _follow_connection(
        self, every_s: float = 0.2, jetstream_every_s: float = 2.0
    ) -> None:
        """Once started, the service is ready exactly while its NATS connection is up and
        JetStream answers (nats-py reconnects on its own; the consumers and watchers carry on
        after it). The connection is looked at every ``every_s``, JetStream asked every
        ``jetstream_every_s``."""
        was_problem: str | None = None
        jetstream_up, asked_at = True, loop_time()
        while not self.stop_requested.is_set():
            await asyncio.sleep(every_s)
            connected = self.bus.connected
            if not connected:
                jetstream_up = False  # asked again as soon as the connection is back
            elif not jetstream_up or loop_time() - asked_at >= jetstream_every_s:
                jetstream_up, asked_at = await self._jetstream_up(), loop_time()
                connected = self.bus.connected  # a lost connection is the reason given first
            if self.stop_requested.is_set():
                # Shutting down, though the cancel may be lost in the replies awaited just
                # now (nats-py's asyncio.wait_for: see fracpilot_libs.deadlines).
                return
            problem = readiness_problem(connected, jetstream_up)
            if problem != was_problem:
                was_problem = problem
                self.health.set_ready(problem is None, problem or "")
                self._up.set(1 if problem is None else 0)
                log.log(
                    logging.INFO if problem is None else logging.WARNING,
                    "ready again" if problem is None else f"not ready: {problem}",
                )

    async def _jetstream_up(self) -> bool:
        """JetStream answers for a stream and, in a cluster, a majority of its servers answer
        the server ping: the server this service is connected to may lead a stream or the
        meta group after losing its quorum and still answer for a while."""
        if not await self.bus.jetstream_available():
            return False
        size = self.bus.cluster_servers
        if size is None or size < 2:  # a single server, or the ping is not allowed
            return True
        answering = await servers_answering(self.bus.nc)
        if answering is None:
            return False
        self.bus.cluster_servers = max(size, answering)  # a cluster seen partly at first
        return has_quorum(answering, self.bus.cluster_servers)


def readiness_problem(connected: bool, jetstream_up: bool) -> str | None:
    """Why a started service is not ready (None: it is)."""
    if not connected:
        return "NATS connection lost"
    if not jetstream_up:
        return "JetStream unavailable"
    return None


def loop_time() -> float:
    return asyncio.get_running_loop().time()
