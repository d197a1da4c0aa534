"""The one snapshot reader: what a stream or a KV bucket holds now, read once.

An ephemeral consumer without acknowledgements reads the messages pending when it was made
(all of them, the last per subject, or from a start time) through a
:class:`~fracpilot_libs.nats.pull_feed.PullFeed`, in chunks, then is deleted: nothing is left
behind and no KV watcher waits for a quiet moment a busy bucket may never have. A KV bucket
is its stream ``KV_<bucket>`` read last-per-subject, deleted keys left out. The decision
service's checkpoints and partition leases and the CLI read this way; the policy list reads
through a KV watch (:func:`read_kv_watched`), which is all the decision identity may do there.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from fracpilot_libs.nats.errors import TransientNatsError
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.nats.kv_initial import InitialValues
from fracpilot_libs.nats.pull_feed import ConsumerGoneError, PullFeed
from fracpilot_libs.nats.subjects import stream_position

_DELETED = ("DEL", "PURGE")
CHUNK = 10_000  # messages asked for per pull request
STALL_S = 15.0  # no chunk for this long: the read has failed


class SnapshotStalledError(TransientNatsError):
    """A snapshot read stopped getting messages before it had them all."""

    def __init__(self, message: str, read: int, of: int) -> None:
        super().__init__(message)
        self.read, self.of = read, of


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as a stream holds it."""

    subject: str
    data: bytes
    deleted: bool  # a KV delete or purge marker
    reply: str  # where the stream position is (see subjects.stream_position), read when asked

    @property
    def sequence(self) -> int:
        return stream_position(self.reply)[0]

    @property
    def stored_ns(self) -> int:
        return stream_position(self.reply)[1]

    @property
    def received_at(self) -> datetime:
        """When the server stored it."""
        return datetime.fromtimestamp(self.stored_ns / 1e9, UTC)


def is_deleted(headers: dict[str, str] | None) -> bool:
    """Whether a KV stream message is a delete or purge marker."""
    return bool(headers) and (headers or {}).get("KV-Operation") in _DELETED


async def read_stream_chunks(
    nc: NatsClient,
    stream: str,
    filter_subject: str,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    start: datetime | None = None,
    *,
    chunk: int = CHUNK,
    stall_s: float = STALL_S,
    name_prefix: str = "fracpilot-snapshot",
) -> AsyncIterator[list[StoredMessage]]:
    """The stream's messages on ``filter_subject`` that were there when the read began, in
    stream order, ``chunk`` at most at a time; an absent stream holds none. Raises
    :class:`SnapshotStalledError` when no chunk comes for ``stall_s``."""
    js = nc.jetstream()
    name = f"{name_prefix}-{uuid.uuid4().hex[:16]}"
    config = ConsumerConfig(
        name=name,
        deliver_policy=deliver,
        opt_start_time=start,
        ack_policy=AckPolicy.NONE,
        filter_subject=filter_subject,
        inactive_threshold=30.0,
        mem_storage=True,
    )
    try:
        info = await js.add_consumer(stream, config)
    except NotFoundError:
        return
    wanted = info.num_pending or 0
    feed = PullFeed(nc, stream, name, batch=min(chunk, max(1, wanted)), linger_s=0)
    received = 0
    try:
        if wanted:
            await feed.start()
        while received < wanted:
            try:
                async with asyncio.timeout(stall_s):
                    msgs = await feed.next_batch()
            except (TimeoutError, ConsumerGoneError) as exc:
                raise SnapshotStalledError(
                    f"reading {stream} ({filter_subject}) stalled after {received} of "
                    f"{wanted} messages",
                    received,
                    wanted,
                ) from exc
            msgs = msgs[: wanted - received]  # later ones were stored after the read began
            received += len(msgs)
            yield [
                StoredMessage(m.subject, m.data, is_deleted(m.headers), m.reply or "") for m in msgs
            ]
    finally:
        await feed.stop()
        with contextlib.suppress(Exception):  # gone now rather than after the threshold
            await js.delete_consumer(stream, name)


async def read_stream(
    nc: NatsClient,
    stream: str,
    filter_subject: str,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    start: datetime | None = None,
    *,
    name_prefix: str = "fracpilot-snapshot",
) -> list[StoredMessage]:
    """Every message :func:`read_stream_chunks` reads, in one list."""
    out: list[StoredMessage] = []
    async for part in read_stream_chunks(
        nc, stream, filter_subject, deliver, start, name_prefix=name_prefix
    ):
        out.extend(part)
    return out


def kv_stream(bucket: str) -> tuple[str, str]:
    """A KV bucket's stream and the subject prefix of its keys."""
    return f"KV_{bucket}", f"$KV.{bucket}."


async def kv_chunks(
    nc: NatsClient,
    bucket: str,
    *,
    chunk: int = CHUNK,
    stall_s: float = STALL_S,
    name_prefix: str = "fracpilot-snapshot",
) -> AsyncIterator[list[tuple[str, StoredMessage]]]:
    """The latest value of every key of a bucket, ``(key, message)``, deleted keys left out;
    in chunks, never all in memory (a bucket of 100,000 checkpoints)."""
    stream, prefix = kv_stream(bucket)
    async for part in read_stream_chunks(
        nc,
        stream,
        f"{prefix}>",
        DeliverPolicy.LAST_PER_SUBJECT,
        chunk=chunk,
        stall_s=stall_s,
        name_prefix=name_prefix,
    ):
        yield [(m.subject[len(prefix) :], m) for m in part if not m.deleted and m.data]


async def read_kv(
    nc: NatsClient, bucket: str, *, name_prefix: str = "fracpilot-snapshot"
) -> dict[str, StoredMessage]:
    """The latest value of every key of a KV bucket (deleted keys left out)."""
    values: dict[str, StoredMessage] = {}
    async for part in kv_chunks(nc, bucket, name_prefix=name_prefix):
        values.update(part)
    return values


async def read_kv_watched(kv: KvBucket) -> dict[str, bytes]:
    """Every current value of a KV bucket through a KV watch (deleted keys left out): for an
    identity allowed to watch a bucket but not to read its stream with a consumer of its own
    (the decision service and the policy bucket, deploy/nats/permissions.conf)."""
    # Deletes are read too (and left out here): the last value present may be one, and its
    # entry is the one that says nothing more is pending (fracpilot_libs.nats.kv_initial).
    watcher = await kv.watch_all()
    initial = InitialValues(watcher)
    values: dict[str, bytes] = {}
    try:
        while True:
            entry = await watcher.updates(timeout=5)  # type: ignore[no-untyped-call]
            if entry is not None:
                if entry.operation in _DELETED or not entry.value:
                    values.pop(entry.key, None)
                else:
                    values[entry.key] = entry.value
            if await initial.saw(entry):
                break
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return values
