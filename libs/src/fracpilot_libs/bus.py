"""The one adapter over nats-py that every service uses.

It connects with reconnect and backoff, declares the streams, consumers and KV buckets
idempotently, publishes JSON models with a ``Nats-Msg-Id`` for de-duplication and the current
trace context in the headers, and runs durable pull consumers that decode each message into a
wire model. A message that does not decode is dead-lettered with the reason and the raw
payload and terminated; a handler that raises is retried with a delay, and dead-lettered once
it has been delivered ``max_deliver`` times. Nothing is lost and the consumer keeps running.
Each consumer's lag (``num_pending``, ``num_ack_pending`` of its consumer info) is exported as
a gauge per stream and consumer name, read every :data:`LAG_INTERVAL_S`.
It also serves core-NATS request/reply subjects in a queue group (:meth:`Bus.serve`): a handler
that raises gets an error reply, and the subscription keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import DeadLetter, utcnow
from fracpilot_libs.nats_connect import connect_options, open_connection
from fracpilot_libs.telemetry import extract_trace, inject_trace
from fracpilot_libs.usage_streams import ensure_usage_streams

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
ErrorKind = Literal["decode", "validation", "processing", "max_deliveries"]


# A publish that fails with one of these is retried (with backoff, for 30 s): the server is
# restarting or JetStream is not up yet (nats-py turns "no responders" into NoStreamResponse).
RETRYABLE_PUBLISH_ERRORS: tuple[type[Exception], ...] = (
    NatsTimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


LAG_INTERVAL_S = 5.0  # how often each consumer's lag is read from the server


class PermanentError(Exception):
    """A handler raises this for a message that can never succeed: dead-letter it, no retry."""


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float | None
    description: str


def default_streams() -> tuple[StreamSpec, ...]:
    """Decisions, results and dead letters, kept for audit. (The usage streams, one per
    partition and bounded in age, are :mod:`fracpilot_libs.usage_streams`.)"""
    return (
        StreamSpec(
            subjects.DECISION_STREAM,
            (f"{subjects.DECISION_PREFIX}.>",),
            None,
            "fraction decisions, replayable for audit",
        ),
        StreamSpec(
            subjects.ACTUATION_STREAM,
            (f"{subjects.ACTUATION_PREFIX}.>",),
            None,
            "actuation results, replayable for audit",
        ),
        StreamSpec(
            subjects.DEADLETTER_STREAM,
            (f"{subjects.DEADLETTER_PREFIX}.>",),
            None,
            "messages a service could not accept, with the reason",
        ),
    )


class BusMetrics:
    """Counters every service exposes about its traffic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "fracpilot_bus_published_total",
            "Messages published",
            ["subject_prefix"],
            registry=registry,
        )
        self.duplicates = Counter(
            "fracpilot_bus_duplicates_total",
            "Publishes the server recognised as duplicates (same Nats-Msg-Id)",
            ["subject_prefix"],
            registry=registry,
        )
        self.consumed = Counter(
            "fracpilot_bus_consumed_total",
            "Messages handled and acknowledged",
            ["consumer"],
            registry=registry,
        )
        self.retried = Counter(
            "fracpilot_bus_retried_total",
            "Messages negatively acknowledged for a retry",
            ["consumer"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "fracpilot_dead_letters_total",
            "Messages dead-lettered, by reason kind",
            ["subject_prefix", "kind"],
            registry=registry,
        )
        self.requests = Counter(
            "fracpilot_bus_requests_total",
            "Requests served, by outcome (replied, or failed: the handler raised)",
            ["subject", "outcome"],
            registry=registry,
        )
        self.consumer_pending = Gauge(
            "fracpilot_consumer_pending_messages",
            "Messages in the stream not yet delivered to this consumer (its lag)",
            ["stream", "consumer"],
            registry=registry,
        )
        self.consumer_ack_pending = Gauge(
            "fracpilot_consumer_ack_pending_messages",
            "Messages delivered to this consumer and not yet acknowledged",
            ["stream", "consumer"],
            registry=registry,
        )
        self.handle_seconds = Histogram(
            "fracpilot_bus_handle_seconds",
            "Time to handle one message",
            ["consumer"],
            registry=registry,
        )


def _prefix(subject: str) -> str:
    """A low-cardinality label for a subject: ``fracpilot.usage.v1`` or ``$KV.<bucket>``."""
    return ".".join(subject.split(".")[: 2 if subject.startswith("$KV.") else 3])


def _raw_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def decode(model: type[M], data: bytes) -> M:
    """Parse a JSON payload into a model; raises ValueError with a readable reason.

    The payload is parsed once (pydantic's JSON parser); a payload that is not JSON at all is
    told apart by the error's type, so it is reported as ``decode``, anything else as
    ``validation``.
    """
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if errors and errors[0]["type"] == "json_invalid":
            raise DecodeError("decode", f"not valid JSON: {errors[0]['msg']}") from exc
        raise DecodeError("validation", describe_validation_error(exc)) from exc


class DecodeError(ValueError):
    def __init__(self, kind: ErrorKind, reason: str) -> None:
        super().__init__(reason)
        self.kind: ErrorKind = kind
        self.reason = reason


Handler = Callable[[M, Msg], Awaitable[None]]
RequestHandler = Callable[[bytes, Mapping[str, str]], Awaitable[bytes]]
"""Serves one request: the raw payload and headers in, the raw reply out."""


def error_reply(reason: str) -> bytes:
    """The reply to a request whose handler failed: ``{"ok": false, "error": reason}``."""
    return json.dumps({"ok": False, "error": reason}).encode()


class Bus:
    """A connected NATS client with JetStream, scoped to one service."""

    def __init__(
        self,
        service: str,
        settings: ServiceSettings,
        registry: CollectorRegistry,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.service = service
        self.settings = settings
        self.registry = registry
        self.metrics = BusMetrics(registry)
        self.tracer = trace.get_tracer(f"fracpilot.{service}", tracer_provider=tracer_provider)
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._subscriptions: list[Subscription] = []
        self._stopping = asyncio.Event()
        self.reconnects = 0  # KV watchers start again after each reconnect (see watch_kv)

    # --- connection -------------------------------------------------------------------------

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise RuntimeError("bus is not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("bus is not connected")
        return self._js

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(self, retry_for_s: float = 60.0) -> None:
        """Connect, retrying with exponential backoff; afterwards nats-py reconnects forever."""
        s = self.settings
        options: dict[str, Any] = {
            "servers": [u.strip() for u in s.nats_url.split(",")],
            "name": f"fracpilot-{self.service}",
            "connect_timeout": s.nats_connect_timeout_s,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 1,
            "allow_reconnect": True,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnect,
            "reconnected_cb": self._on_reconnect,
        }
        connect_options(s)  # identity and TLS settings checked once, before any retry
        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_after_delay(retry_for_s),
            retry=retry_if_exception_type((OSError, nats.errors.NoServersError, TimeoutError)),
            reraise=True,
        ):
            with attempt:
                self._nc = await open_connection(s, **options)
        self._js = self.nc.jetstream()
        log.info(
            "connected to NATS",
            extra={"url": self.nc.connected_url.netloc if self.nc.connected_url else s.nats_url},
        )

    async def _sync_with_server(self) -> None:
        """Return once the server has processed every command sent so far (SUB, UNSUB).

        nats-py's ``flush()`` writes its PING straight to the socket, possibly ahead of
        commands still in its write buffer, so one PONG does not prove a SUB arrived; by the
        second PING the buffer has been written.
        """
        await self.nc.flush(timeout=5)
        await self.nc.flush(timeout=5)

    async def _on_error(self, exc: Exception) -> None:
        log.warning("NATS error", extra={"error": str(exc)})

    async def _on_disconnect(self) -> None:
        log.warning("disconnected from NATS")

    async def _on_reconnect(self) -> None:
        self.reconnects += 1
        log.info("reconnected to NATS")

    async def stop_consuming(self) -> None:
        """Stop serving requests and stop the consumers and watchers; each consumer finishes
        the message in hand. The connection stays open (for a last publish or KV write)."""
        self._stopping.set()
        if self._subscriptions:
            for sub in self._subscriptions:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            self._subscriptions.clear()
            with contextlib.suppress(Exception):  # new requests now go to other replicas
                await self._sync_with_server()
        for task in self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=10)
        self._tasks.clear()

    async def close(self) -> None:
        """Stop the consumers (each finishes the message in hand), flush acks, close."""
        await self.stop_consuming()
        # The consumer loops have finished their messages; flush their acks and close.
        # (nats-py's drain() waits out its timeout on pull subscriptions.)
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.flush(timeout=5)
            with contextlib.suppress(Exception):
                await self._nc.close()

    # --- declarations -----------------------------------------------------------------------

    async def ensure_streams(
        self, specs: tuple[StreamSpec, ...] | None = None, *, assign_partitions: bool = False
    ) -> None:
        """Create the streams, or update them to the specs; then the usage partition streams
        (:func:`fracpilot_libs.usage_streams.ensure_usage_streams`): only the decision
        service, which consumes the partitions, changes their number (``assign_partitions``)."""
        s = self.settings
        for spec in specs or default_streams():
            config = StreamConfig(
                name=spec.name,
                description=spec.description,
                subjects=list(spec.subjects),
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                discard=DiscardPolicy.OLD,
                max_age=spec.max_age_s,
                duplicate_window=120.0,
            )
            try:
                await self.js.stream_info(spec.name)
            except NotFoundError:
                await self.js.add_stream(config)
                continue
            await self.js.update_stream(config)
        if specs is None:
            await ensure_usage_streams(
                self.js, s.decision_partitions, s.usage_max_age_s, assign=assign_partitions
            )

    async def kv(self, bucket: str, history: int = 1) -> KeyValue:
        try:
            return await self.js.key_value(bucket)
        except BucketNotFoundError:
            return await self.js.create_key_value(
                KeyValueConfig(bucket=bucket, history=history, storage=StorageType.FILE)
            )

    async def kv_values(self, bucket: str) -> dict[str, bytes]:
        """Every current value of a KV bucket, read in one pass (deleted keys left out)."""
        kv = await self.kv(bucket)
        watcher = await kv.watchall(ignore_deletes=True)
        values: dict[str, bytes] = {}
        try:
            while (entry := await watcher.updates(timeout=5)) is not None:  # type: ignore[no-untyped-call]
                if entry.operation not in ("DEL", "PURGE") and entry.value:
                    values[entry.key] = entry.value
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]
        return values

    async def watch_kv(
        self,
        bucket: str,
        model: type[M],
        on_update: Callable[[str, M | None], Awaitable[None]],
    ) -> asyncio.Event:
        """Follow a KV bucket in the background: every current value, then every change.

        A deleted key is reported as ``None``; a value that does not decode is dead-lettered.
        The returned event is set once every value present at the start has been reported.
        """
        kv = await self.kv(bucket)
        watcher = await kv.watchall()
        subject = f"$KV.{bucket}"
        initial_done = asyncio.Event()

        async def follow() -> None:
            nonlocal watcher
            generation = self.reconnects
            while not self._stopping.is_set():
                if generation != self.reconnects:
                    # A watcher is an ephemeral consumer: a restarted server has forgotten it
                    # and nats-py does not notice, so start again from every current value.
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
                    try:
                        watcher = await kv.watchall()
                    except Exception as exc:
                        log.warning("KV watch not restarted yet", extra={"error": str(exc)})
                        await asyncio.sleep(0.5)
                        continue
                    generation = self.reconnects
                    log.info("KV watch restarted after a reconnect", extra={"bucket": bucket})
                try:
                    entry = await watcher.updates(timeout=0.5)  # type: ignore[no-untyped-call]
                except NatsTimeoutError:
                    continue
                except Exception as exc:  # connection trouble: wait for the reconnect
                    if self._stopping.is_set():
                        break
                    log.warning("KV watch failed", extra={"bucket": bucket, "error": str(exc)})
                    await asyncio.sleep(0.5)
                    continue
                if entry is None:  # end of the initial values
                    initial_done.set()
                    continue
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    await on_update(entry.key, None)
                    continue
                try:
                    value = decode(model, entry.value)
                except DecodeError as exc:
                    await self.dead_letter(
                        f"{subject}.{entry.key}", entry.value, None, exc.kind, exc.reason
                    )
                    continue
                await on_update(entry.key, value)
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

        self._tasks.append(asyncio.create_task(follow(), name=f"watch-{bucket}"))
        return initial_done

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, subject: str, message: BaseModel, msg_id: str | None = None) -> bool:
        """Publish to JetStream and wait for the ack; returns False for a server-side duplicate."""
        headers = inject_trace({})
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=0.1, max=2),
            stop=stop_after_delay(30),
            retry=retry_if_exception_type(RETRYABLE_PUBLISH_ERRORS),
            reraise=True,
        ):
            with attempt:
                ack = await self.js.publish(
                    subject, message.model_dump_json().encode(), headers=headers, timeout=5
                )
        prefix = _prefix(subject)
        if ack.duplicate:
            self.metrics.duplicates.labels(prefix).inc()
            return False
        self.metrics.published.labels(prefix).inc()
        return True

    async def dead_letter(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        kind: ErrorKind,
        reason: str,
    ) -> None:
        record = DeadLetter(
            service=self.service,
            subject=subject,
            reason=reason[:8000],
            error_kind=kind,
            raw_payload=_raw_text(data),
            headers=dict(headers or {}),
            received_at=utcnow(),
        )
        self.metrics.dead_letters.labels(_prefix(subject), kind).inc()
        log.warning(
            "dead-lettered a message",
            extra={"subject": subject, "kind": kind, "reason": reason[:500]},
        )
        await self.publish(subjects.deadletter_subject(self.service), record)

    # --- request/reply ----------------------------------------------------------------------

    async def serve(
        self,
        subject: str,
        queue: str,
        handler: RequestHandler,
        on_error: Callable[[str], bytes] = error_reply,
    ) -> None:
        """Answer requests on a core-NATS subject in a queue group (replicas share them).

        Each request runs in a server span joined to the caller's trace. A handler that raises
        is logged and answered with ``on_error(reason)``; the subscription keeps serving.
        """

        async def on_request(msg: Msg) -> None:
            headers = dict(msg.headers or {})
            with self.tracer.start_as_current_span(
                f"serve {subject}",
                context=extract_trace(headers),
                kind=SpanKind.SERVER,
                attributes={"messaging.system": "nats", "messaging.destination": subject},
            ) as span:
                try:
                    reply = await handler(msg.data, headers)
                    outcome = "replied"
                except Exception as exc:
                    log.exception("request handler failed", extra={"subject": subject})
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, "handler failed"))
                    reply = on_error(f"internal error: {exc!r}"[:2000])
                    outcome = "failed"
                self.metrics.requests.labels(subject, outcome).inc()
                if not msg.reply:
                    return
                try:
                    await msg.respond(reply)
                except Exception as exc:  # the requester is gone, or the connection is
                    log.warning("could not reply", extra={"subject": subject, "error": str(exc)})

        self._subscriptions.append(await self.nc.subscribe(subject, queue=queue, cb=on_request))
        await self._sync_with_server()  # served from now on: requesters will not hear "none"

    # --- consuming --------------------------------------------------------------------------

    async def consume(
        self,
        *,
        stream: str,
        durable: str,
        filter_subject: str,
        model: type[M],
        handler: Handler[M],
        ack_wait_s: float | None = None,
        retry_delay_s: float = 1.0,
    ) -> None:
        """Start a durable pull consumer in the background; see the module docstring.

        ``ack_wait_s`` (default: the ``ack_wait_s`` setting) is how soon a message whose
        consumer died unacknowledged is delivered again."""
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_s or self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver + 1,  # one more so we can dead-letter it
            filter_subject=filter_subject,
            max_ack_pending=10_000,
        )
        sub = await self.js.pull_subscribe(
            filter_subject, durable=durable, stream=stream, config=config
        )
        task = asyncio.create_task(
            self._consume_loop(sub, durable, model, handler, retry_delay_s),
            name=f"consume-{durable}",
        )
        self._tasks.append(task)
        self.watch_consumer_lag(stream, durable)

    def watch_consumer_lag(self, stream: str, durable: str) -> asyncio.Task[None]:
        """Export a durable consumer's lag until the bus stops or the returned task is
        cancelled (its series are then removed: another replica may own the consumer now).
        :meth:`consume` calls it; a service that runs its own consumers calls it for each."""
        self._tasks = [t for t in self._tasks if not t.done()]
        task = asyncio.create_task(self._watch_lag(stream, durable), name=f"lag-{durable}")
        self._tasks.append(task)
        return task

    async def _watch_lag(self, stream: str, durable: str) -> None:
        gauges = (self.metrics.consumer_pending, self.metrics.consumer_ack_pending)
        try:
            while not self._stopping.is_set():
                try:
                    info = await self.js.consumer_info(stream, durable, timeout=2)
                except Exception as exc:  # reconnecting, or the consumer is being recreated
                    log.debug(
                        "consumer info failed", extra={"consumer": durable, "error": str(exc)}
                    )
                else:
                    gauges[0].labels(stream, durable).set(info.num_pending or 0)
                    gauges[1].labels(stream, durable).set(info.num_ack_pending or 0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=LAG_INTERVAL_S)
        except asyncio.CancelledError:
            for gauge in gauges:
                with contextlib.suppress(KeyError):
                    gauge.remove(stream, durable)
            raise

    async def _consume_loop(
        self,
        sub: JetStreamContext.PullSubscription,
        durable: str,
        model: type[M],
        handler: Handler[M],
        retry_delay_s: float,
    ) -> None:
        while not self._stopping.is_set():
            try:
                messages = await sub.fetch(self.settings.fetch_batch, timeout=0.5)
            except (NatsTimeoutError, TimeoutError):
                continue
            except Exception as exc:  # connection trouble: nats-py reconnects, we wait
                if self._stopping.is_set():
                    return
                log.warning("fetch failed", extra={"consumer": durable, "error": str(exc)})
                await asyncio.sleep(0.5)
                continue
            for msg in messages:
                await self._handle_one(msg, durable, model, handler, retry_delay_s)

    async def _while_in_progress(self, msg: Msg, work: Awaitable[None]) -> None:
        """Run a handler, telling the server it is still at work every half ack wait, so that
        a slow action (retried evictions) is not delivered again while it runs."""
        every = max(0.5, self.settings.ack_wait_s / 2)

        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(every)
                with contextlib.suppress(Exception):
                    await msg.in_progress()

        keeper = asyncio.create_task(keep_alive())
        try:
            await work
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _handle_one(
        self,
        msg: Msg,
        durable: str,
        model: type[M],
        handler: Handler[M],
        retry_delay_s: float,
    ) -> None:
        headers = dict(msg.headers or {})
        ctx = extract_trace(headers)
        with (
            self.metrics.handle_seconds.labels(durable).time(),
            self.tracer.start_as_current_span(
                f"consume {_prefix(msg.subject)}",
                context=ctx,
                kind=SpanKind.CONSUMER,
                attributes={"messaging.system": "nats", "messaging.destination": msg.subject},
            ),
        ):
            try:
                decoded = decode(model, msg.data)
            except DecodeError as exc:
                await self.dead_letter(msg.subject, msg.data, headers, exc.kind, exc.reason)
                await msg.term()
                return
            try:
                await self._while_in_progress(msg, handler(decoded, msg))
            except PermanentError as exc:
                await self.dead_letter(msg.subject, msg.data, headers, "processing", str(exc))
                await msg.term()
                return
            except Exception as exc:
                delivered = msg.metadata.num_delivered if msg.metadata else 1
                if delivered >= self.settings.max_deliver:
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
                        extra={"consumer": durable, "error": repr(exc), "delivered": delivered},
                    )
                    self.metrics.retried.labels(durable).inc()
                    await msg.nak(delay=retry_delay_s)
                return
            await msg.ack()
            self.metrics.consumed.labels(durable).inc()
