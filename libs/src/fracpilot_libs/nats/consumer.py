"""Durable pull consumers: each message decoded into a wire model, handled, then acknowledged,
retried or dead-lettered; and each consumer's lag exported.

A message that does not decode is dead-lettered with the reason and the raw payload and
terminated; a handler that raises :class:`PermanentError` likewise; a handler that raises
anything else is retried with a delay, and dead-lettered once it has been delivered
``max_deliver`` times. Nothing is lost and the consumer keeps running. Messages come through
the one pull feed (:class:`fracpilot_libs.nats.pull_feed.PullFeed`); each is handled in a CONSUMER
span joined to the publisher's trace (:mod:`fracpilot_libs.nats.spans`). A consumer's lag
(``num_pending``, ``num_ack_pending`` of its consumer info) is read every
:data:`LAG_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError
from opentelemetry import trace
from pydantic import BaseModel

from fracpilot_libs.deadlines import cancel_and_wait, cancel_requested, within
from fracpilot_libs.nats.bus_metrics import BusMetrics
from fracpilot_libs.nats.decoding import DecodeError, ErrorKind, decode
from fracpilot_libs.nats.pull_feed import PullFeed
from fracpilot_libs.nats.spans import mark_failed, process_span

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

LAG_INTERVAL_S = 5.0  # how often each consumer's lag is read from the server

Handler = Callable[[M, Msg], Awaitable[None]]
DeadLetterer = Callable[[str, bytes, Mapping[str, str] | None, ErrorKind, str], Awaitable[None]]


class PermanentError(Exception):
    """A handler raises this for a message that can never succeed: dead-letter it, no retry."""


async def ensure_durable(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Create the durable consumer unless it exists (an existing one is kept as it is)."""
    durable = config.durable_name or ""
    try:
        await js.consumer_info(stream, durable)
    except NotFoundError:
        config.name = durable
        await js.add_consumer(stream, config=config)


@dataclass
class DurableConsumer(Generic[M]):
    """One durable consumer's loop: fetch, decode, handle, settle each message."""

    feed: PullFeed
    durable: str
    model: type[M]
    handler: Handler[M]
    retry_delay_s: float
    max_deliver: int
    ack_wait_s: float
    metrics: BusMetrics
    tracer: trace.Tracer
    dead_letter: DeadLetterer
    stopping: asyncio.Event

    async def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    messages = await self._next_batch()
                except Exception as exc:  # connection trouble: nats-py reconnects, we wait
                    if self.stopping.is_set():
                        return
                    log.warning("fetch failed", extra={"consumer": self.durable, "error": str(exc)})
                    await asyncio.sleep(0.5)
                    continue
                for msg in messages:
                    await self._handle_one(msg)
        finally:
            await self.feed.stop()

    async def _next_batch(self) -> list[Msg]:
        """The next batch, or none once stopping (an idle feed waits a while for one)."""
        batch = asyncio.ensure_future(self.feed.next_batch())
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({batch, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the fetch must not outlive the consumer
            with contextlib.suppress(Exception):
                await cancel_and_wait(batch)
            raise
        finally:
            stop.cancel()
        if not batch.done():  # stopping: what was fetched comes again after the ack wait
            with contextlib.suppress(Exception):  # a fetch that failed as it was given up
                await cancel_and_wait(batch)
            return []
        return batch.result()

    async def _while_in_progress(self, msg: Msg, work: Awaitable[None]) -> None:
        """Run a handler, telling the server it is still at work every half ack wait, so that
        a slow action (retried evictions) is not delivered again while it runs."""
        every = max(0.5, self.ack_wait_s / 2)

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(every)
                with contextlib.suppress(Exception):
                    await msg.in_progress()

        keeper = asyncio.create_task(keep_alive())
        try:
            await work
        finally:
            await cancel_and_wait(keeper)

    async def _handle_one(self, msg: Msg) -> None:
        headers = dict(msg.headers or {})
        with (
            self.metrics.handle_seconds.labels(self.durable).time(),
            process_span(self.tracer, msg, self.durable) as span,
        ):
            try:
                decoded = decode(self.model, msg.data)
            except DecodeError as exc:
                mark_failed(span, f"decode:{exc.kind}", exc.reason)
                await self.dead_letter(msg.subject, msg.data, headers, exc.kind, exc.reason)
                await msg.term()
                return
            try:
                await self._while_in_progress(msg, self.handler(decoded, msg))
            except PermanentError as exc:
                mark_failed(span, type(exc).__qualname__, str(exc))
                await self.dead_letter(msg.subject, msg.data, headers, "processing", str(exc))
                await msg.term()
                return
            except Exception as exc:
                mark_failed(span, type(exc).__qualname__, repr(exc))
                await self._failed(msg, headers, exc)
                return
            await msg.ack()
            self.metrics.consumed.labels(self.durable).inc()

    async def _failed(self, msg: Msg, headers: dict[str, str], exc: Exception) -> None:
        delivered = msg.metadata.num_delivered if msg.metadata else 1
        if delivered >= self.max_deliver:
            await self.dead_letter(
                msg.subject,
                msg.data,
                headers,
                "max_deliveries",
                f"failed {delivered} times, last: {exc!r}",
            )
            await msg.term()
        else:
            log.warning(
                "handler failed, will retry",
                extra={"consumer": self.durable, "error": repr(exc), "delivered": delivered},
            )
            self.metrics.retried.labels(self.durable).inc()
            await msg.nak(delay=self.retry_delay_s)


async def watch_lag(
    js: JetStreamContext,
    metrics: BusMetrics,
    stream: str,
    durable: str,
    stopping: asyncio.Event,
) -> None:
    """Export a durable consumer's lag until ``stopping`` is set; when cancelled its series
    are removed (another replica may own the consumer now)."""
    gauges = (metrics.consumer_pending, metrics.consumer_ack_pending)
    try:
        while not stopping.is_set():
            try:
                info = await js.consumer_info(stream, durable, timeout=2)
            except Exception as exc:  # reconnecting, or the consumer is being recreated
                log.debug("consumer info failed", extra={"consumer": durable, "error": str(exc)})
            else:
                gauges[0].labels(stream, durable).set(info.num_pending or 0)
                gauges[1].labels(stream, durable).set(info.num_ack_pending or 0)
            if cancel_requested():  # cancelled (a hand-over), the cancel lost in the ask
                raise asyncio.CancelledError
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), LAG_INTERVAL_S)
    except asyncio.CancelledError:
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(stream, durable)
        raise
