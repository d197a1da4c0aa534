"""A lease bucket: a KV bucket whose keys live only while they are rewritten (its TTL), written
with a short wait for the ack, read in one snapshot and watched for changes.

The decision replicas keep their partition leases in one (:mod:`fracpilot_libs.leases.ownership`).
What this module adds to :mod:`fracpilot_libs.nats.kv`:

- :func:`open_lease_bucket`: the bucket with the lease as its TTL (set on an existing one too),
  bound to a JetStream context whose writes wait ``io_timeout_s`` for their ack, not nats-py's
  5 s: a write sent while the bucket has no leader is never answered, and the wait is how late
  the holder notices the new leader;
- :func:`read_lease_bucket`: every live key with its revision, one snapshot;
- :class:`KeyWatch`: every change from now on, a deletion told apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from fracpilot_libs.nats.kv import KvBucket, KvEntry, KvTimeoutError, fracpilot_errors
from fracpilot_libs.nats.kv_snapshot import read_kv
from fracpilot_libs.nats.streams import set_replicas

log = logging.getLogger(__name__)


async def open_lease_bucket(
    nc: Client,
    bucket: str,
    *,
    ttl_s: float,
    replicas: int,
    io_timeout_s: float,
    description: str = "",
) -> KvBucket:
    """The bucket, made with ``ttl_s`` as its TTL (or that TTL set on an existing one), bound
    to a JetStream context whose reads and writes wait no longer than ``io_timeout_s`` for
    their answer (the set-up keeps nats-py's timeout). A failure is nats-py's: the caller is
    starting and gives up."""
    js = nc.jetstream()
    try:
        await js.key_value(bucket)
        info = await js.stream_info(f"KV_{bucket}")
        if info.config.max_age != ttl_s:
            log.warning(
                "setting the TTL of a lease bucket",
                extra={"bucket": bucket, "from_s": info.config.max_age, "to_s": ttl_s},
            )
            info.config.max_age = ttl_s
            await js.update_stream(info.config)
        await set_replicas(js, f"KV_{bucket}", replicas)
    except (BucketNotFoundError, NotFoundError):
        await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=ttl_s,
                storage=StorageType.FILE,
                replicas=replicas,
                description=description or None,
            )
        )
    info = await js.stream_info(f"KV_{bucket}")
    raw = KeyValue(  # as js.key_value makes it, on the context with the short wait
        name=bucket,
        stream=f"KV_{bucket}",
        pre=f"$KV.{bucket}.",
        js=nc.jetstream(timeout=io_timeout_s),
        direct=bool(info.config.allow_direct),
    )
    return KvBucket(raw, bucket)


async def read_lease_bucket(
    nc: Client, bucket: str, *, timeout_s: float = 10.0, name_prefix: str = "leases"
) -> list[KvEntry]:
    """Every live key of the bucket with its revision: the last message of each key, read up
    to the count there was when the read began (:mod:`fracpilot_libs.nats.kv_snapshot`: a KV
    watch waits for a moment with nothing pending, which a busy bucket may not have). Raises
    :class:`KvTimeoutError` when the read takes longer than ``timeout_s``, another
    :class:`~fracpilot_libs.nats.errors.NatsError` for other NATS trouble."""
    with fracpilot_errors(f"reading {bucket}"):
        try:
            async with asyncio.timeout(timeout_s):
                entries = await read_kv(nc, bucket, name_prefix=name_prefix)
        except TimeoutError as exc:
            raise KvTimeoutError(f"reading {bucket}: longer than {timeout_s} s") from exc
    return [KvEntry(key, m.data, m.sequence) for key, m in entries.items()]


@dataclass(frozen=True, slots=True)
class KeyChange:
    key: str
    deleted: bool  # deleted or purged; else written


class KeyWatch:
    """Every key of a bucket as it changes, from its current values on (no older history).
    A restarted server forgets the watch (an ephemeral consumer): a caller whose
    :meth:`next_change` raises stops it and starts another."""

    def __init__(self, watcher: KeyValue.KeyWatcher, bucket: str) -> None:
        self._watcher = watcher
        self._bucket = bucket

    @classmethod
    async def start(cls, bucket: KvBucket) -> KeyWatch:
        """Raises :class:`~fracpilot_libs.nats.errors.NatsError` when the server refuses or
        does not answer."""
        with fracpilot_errors(f"watching {bucket.name}"):
            return cls(await bucket.raw.watchall(include_history=False), bucket.name)

    async def next_change(self, timeout_s: float) -> KeyChange | None:
        """The next change; ``None`` when none came within ``timeout_s`` (or at the end of
        the current values)."""
        with fracpilot_errors(f"watching {self._bucket}"):
            try:
                entry = await self._watcher.updates(timeout=timeout_s)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                return None
        if entry is None:
            return None
        return KeyChange(entry.key, deleted=entry.operation is not None)  # DEL or PURGE

    async def stop(self) -> None:
        """Never raises: a watch whose connection is gone has nothing left to stop."""
        with contextlib.suppress(nats.errors.Error):
            await self._watcher.stop()  # type: ignore[no-untyped-call]
