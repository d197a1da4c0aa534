"""The one adapter over nats-py that every service uses.

It connects with reconnect and backoff, declares the streams (:mod:`fracpilot_libs.nats.streams`)
and KV buckets idempotently, publishes JSON models with a ``Nats-Msg-Id`` for de-duplication,
each in a PRODUCER span whose context travels in the headers
(:mod:`fracpilot_libs.nats.spans`), and runs durable pull consumers
(:mod:`fracpilot_libs.nats.consumer`: decoded into a wire model, retried, dead-lettered, their lag
exported). It also serves core-NATS request/reply subjects in a queue group (:meth:`Bus.serve`):
a handler that raises gets an error reply, and the subscription keeps serving. Messages that
cannot be accepted are classified by :mod:`fracpilot_libs.nats.decoding` and dead-lettered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
)
from opentelemetry import trace
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.deadlines import cancel_and_wait
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus_metrics import BusMetrics, subject_prefix
from fracpilot_libs.nats.connect import client_options, connect_options, open_connection
from fracpilot_libs.nats.consumer import (
    DurableConsumer,
    Handler,
    PermanentError,
    ensure_durable,
    watch_lag,
)
from fracpilot_libs.nats.declare_retry import declare_patiently
from fracpilot_libs.nats.decoding import DecodeError, ErrorKind, dead_letter_record, decode
from fracpilot_libs.nats.errors import NatsUnreachableError, TransientNatsError
from fracpilot_libs.nats.kv import KvBucket, open_kv
from fracpilot_libs.nats.kv_snapshot import read_kv_watched
from fracpilot_libs.nats.kv_watch import follow_kv
from fracpilot_libs.nats.publish_retry import PublishRetryPolicy, retry_reason
from fracpilot_libs.nats.publish_window import PublishWindow
from fracpilot_libs.nats.pull_feed import PullFeed
from fracpilot_libs.nats.request_reply import RequestHandler, error_reply, request_callback
from fracpilot_libs.nats.servers import servers_answering
from fracpilot_libs.nats.spans import send_span
from fracpilot_libs.nats.streams import (
    StreamSpec,
    default_streams,
    ensure_streams,
    replicas_for,
)
from fracpilot_libs.nats.usage_streams import ensure_usage_streams, usage_partition_count

# Imported from here by the services and tests since before the bus was split.
__all__ = [
    "Bus",
    "DecodeError",
    "ErrorKind",
    "PermanentError",
    "RequestHandler",
    "StreamSpec",
    "decode",
    "default_streams",
    "error_reply",
]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def jetstream_unavailable(reply: bytes) -> bool:
    """A JetStream API reply with a server-side error (5xx: no meta leader, no stream leader,
    the cluster cannot handle the request). Any other answer, a "not found" too, shows it
    working."""
    try:
        error = json.loads(reply).get("error") or {}
    except (ValueError, AttributeError):
        return False
    code = error.get("code") if isinstance(error, dict) else None
    return isinstance(code, int) and code >= 500


async def publish_acked(
    js: JetStreamContext,
    metrics: BusMetrics,
    policy: PublishRetryPolicy,
    subject: str,
    body: bytes,
    headers: dict[str, str],
) -> PubAck:
    """One JetStream publish, sent again by ``policy`` until it is acknowledged."""
    prefix = subject_prefix(subject)
    loop = asyncio.get_running_loop()
    started = loop.time()
    failures = 0
    while True:
        elapsed = loop.time() - started
        try:
            ack = await js.publish(
                subject, body, headers=headers, timeout=policy.attempt_timeout(elapsed)
            )
        except Exception as exc:
            reason = retry_reason(exc)
            if reason is None:
                log.warning(
                    "publish failed", extra={"subject": subject, "error": f"{exc!r}: {exc}"}
                )
                raise
            failures += 1
            elapsed = loop.time() - started
            wait = policy.delay(failures, elapsed)
            if wait is None:
                metrics.publish_retry_seconds.labels(prefix, "failed").observe(elapsed)
                raise NatsUnreachableError(
                    f"publish to {subject} not acknowledged in {elapsed:.1f} s: {exc!r}"
                ) from exc
            metrics.publish_retries.labels(prefix, reason).inc()
            if failures == 1:
                log.info(
                    "publish not acknowledged, sending it again",
                    extra={"subject": subject, "reason": reason},
                )
            await asyncio.sleep(wait)
            continue
        if failures:
            metrics.publish_retry_seconds.labels(prefix, "acked").observe(loop.time() - started)
        return ack


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
        self._replicated: set[str] = set()  # buckets whose replicas were checked
        self.cluster_servers: int | None = None  # the servers seen answering; None: unknown
        self.reconnects = 0  # KV watchers start again after each reconnect (see watch_kv)
        self.publish_retry = PublishRetryPolicy()

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
    def replicas(self) -> int:
        """Replicas of every stream and KV bucket: the setting, else detected from the servers
        (3 in a cluster of three or more, else 1; :func:`replicas_for`)."""
        info = self.nc._server_info
        return replicas_for(self.settings.nats.replicas, info, self.cluster_servers)

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def jetstream_available(self, timeout_s: float = 2.0) -> bool:
        """True when JetStream answers for the usage stream 0 (every service may ask for its
        info, ``$JS.API.INFO`` is not in every identity's permissions): connected, and in a
        cluster a meta leader and that stream's leader elected (a cluster that lost its
        quorum answers with an error, or not at all)."""
        if not self.connected:
            return False
        subject = f"{self.js._prefix}.STREAM.INFO.{subjects.usage_stream(0)}"
        try:
            reply = await self.nc.request(subject, b"", timeout=timeout_s)
        except Exception:  # a timeout, no responders, a connection lost meanwhile
            return False
        return not jetstream_unavailable(reply.data)

    async def connect(self, retry_for_s: float = 60.0) -> None:
        """Connect, retrying with exponential backoff; afterwards nats-py reconnects forever."""
        s = self.settings
        options = client_options(
            s,
            connect_timeout_s=s.nats.connect_timeout_s,
            keep_reconnecting=True,
            name=f"fracpilot-{self.service}",
        )
        options |= {
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnect,
            "reconnected_cb": self._on_reconnect,
        }
        connect_options(s)  # identity and TLS settings checked once, before any retry
        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_after_delay(retry_for_s),
            retry=retry_if_exception_type(TransientNatsError),
            reraise=True,
        ):
            with attempt:
                self._nc = await open_connection(s, **options)
        self._js = self.nc.jetstream()
        if self.nc._server_info.get("cluster"):
            self.cluster_servers = await servers_answering(self.nc)
        log.info(
            "connected to NATS",
            extra={"url": self.nc.connected_url.netloc if self.nc.connected_url else s.nats.url},
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
            try:
                await asyncio.wait({task}, timeout=10)  # 10 s to finish the message in hand
            finally:
                await cancel_and_wait(task)
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
        (:func:`fracpilot_libs.nats.usage_streams.ensure_usage_streams`): only the decision
        service, which consumes the partitions, changes their number (``assign_partitions``)."""
        replicas = self.replicas

        async def declare() -> None:
            await ensure_streams(self.js, specs or default_streams(self.settings.streams), replicas)
            if specs is None:
                s = self.settings
                await ensure_usage_streams(
                    self.js,
                    s.decision_partitions,
                    s.usage_max_age_s,
                    assign=assign_partitions,
                    replicas=replicas,
                    max_bytes=s.streams.usage_max_bytes or None,
                )

        await declare_patiently(declare, "streams")

    async def kv(self, bucket: str, history: int = 1) -> KvBucket:
        """The bucket, made with :attr:`replicas` replicas, or raised to them once per
        connection when an earlier version made it with fewer."""
        return await declare_patiently(
            lambda: open_kv(
                self.js,
                bucket,
                history=history,
                replicas=self.replicas,
                replicated=self._replicated,
            ),
            f"bucket {bucket}",
        )

    async def kv_values(self, bucket: str) -> dict[str, bytes]:
        """Every current value of a KV bucket, read in one pass (deleted keys left out)."""
        return await read_kv_watched(await self.kv(bucket))

    async def watch_kv(
        self,
        bucket: str,
        model: type[M],
        on_update: Callable[[str, M | None], Awaitable[None]],
    ) -> asyncio.Event:
        """Follow a KV bucket in the background: every current value, then every change
        (:func:`fracpilot_libs.nats.kv_watch.follow_kv`). The returned event is set once every
        value present at the start has been reported."""
        kv = await self.kv(bucket)
        watcher = await kv.watch_all()
        initial_done = asyncio.Event()
        follow = follow_kv(
            kv,
            watcher,
            bucket,
            model,
            on_update,
            initial_done=initial_done,
            stopping=self._stopping,
            reconnects=lambda: self.reconnects,
            dead_letter=self.dead_letter,
        )
        self._tasks.append(asyncio.create_task(follow, name=f"watch-{bucket}"))
        return initial_done

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, subject: str, message: BaseModel, msg_id: str | None = None) -> bool:
        """Publish to JetStream and wait for the ack; returns False for a server-side duplicate.
        A publish the server does not acknowledge ("no responders" or no answer, as while a
        stream's leader is elected) is sent again with the same ``Nats-Msg-Id``
        (:mod:`fracpilot_libs.nats.publish_retry`); past the deadline it raises
        :class:`~fracpilot_libs.nats.errors.NatsUnreachableError`."""
        return await self.publish_bytes(subject, message.model_dump_json().encode(), msg_id)

    async def publish_bytes(self, subject: str, body: bytes, msg_id: str | None = None) -> bool:
        """:meth:`publish` for a payload already encoded (a usage batch)."""
        prefix = subject_prefix(subject)
        with send_span(self.tracer, subject, body, msg_id) as headers:
            ack = await publish_acked(
                self.js, self.metrics, self.publish_retry, subject, body, headers
            )
        if ack.duplicate:
            self.metrics.duplicates.labels(prefix).inc()
            return False
        self.metrics.published.labels(prefix).inc()
        return True

    def publish_window(self, size: int) -> PublishWindow:
        """A window of ``size`` outstanding acknowledgements over :meth:`publish_bytes`
        (:mod:`fracpilot_libs.nats.publish_window`)."""
        return PublishWindow(self.publish_bytes, size)

    async def publish_core(self, subject: str, body: bytes) -> None:
        """Core NATS, at most once, not stored: for a view a reader may miss a message of (the
        per-workload usage view); buffered by nats-py, flushed with its next write."""
        await self.nc.publish(subject, body)

    async def usage_partitions(self) -> int:
        """The usage partition count in force (the setting when there are no streams yet)."""
        count = await usage_partition_count(self.js)
        return count or self.settings.decision_partitions

    async def dead_letter(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        kind: ErrorKind,
        reason: str,
    ) -> None:
        record = dead_letter_record(self.service, subject, data, headers, kind, reason)
        self.metrics.dead_letters.labels(subject_prefix(subject), kind).inc()
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

        on_request = request_callback(self.tracer, self.metrics, subject, handler, on_error)
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
        """Start a durable pull consumer in the background (:mod:`fracpilot_libs.nats.consumer`).

        ``ack_wait_s`` (default: the ``ack_wait_s`` setting) is how soon a message whose
        consumer died unacknowledged is delivered again."""
        s = self.settings
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_s or s.ack_wait_s,
            max_deliver=s.max_deliver + 1,  # one more so we can dead-letter it
            filter_subject=filter_subject,
            max_ack_pending=10_000,
        )
        await ensure_durable(self.js, stream, config)
        feed = PullFeed(self.nc, stream, durable, batch=s.fetch_batch, linger_s=0)
        await feed.start()
        consumer = DurableConsumer(
            feed=feed,
            durable=durable,
            model=model,
            handler=handler,
            retry_delay_s=retry_delay_s,
            max_deliver=s.max_deliver,
            ack_wait_s=s.ack_wait_s,
            metrics=self.metrics,
            tracer=self.tracer,
            dead_letter=self.dead_letter,
            stopping=self._stopping,
        )
        self._tasks.append(asyncio.create_task(consumer.run(), name=f"consume-{durable}"))
        self.watch_consumer_lag(stream, durable)

    def watch_consumer_lag(self, stream: str, durable: str) -> asyncio.Task[None]:
        """Export a durable consumer's lag until the bus stops or the returned task is
        cancelled (its series are then removed: another replica may own the consumer now).
        :meth:`consume` calls it; a service that runs its own consumers calls it for each."""
        self._tasks = [t for t in self._tasks if not t.done()]
        lag = watch_lag(self.js, self.metrics, stream, durable, self._stopping)
        task = asyncio.create_task(lag, name=f"lag-{durable}")
        self._tasks.append(task)
        return task
