"""The one typed door to a NATS KV bucket: every service reads and writes KV through it.

nats-py's ``KeyValue`` answers a missing key with an exception, a stale revision with another,
a timeout with a third, and hands back entries whose value may be ``None``. :class:`KvBucket`
says the same things as values and fracpilot's own errors:

- :meth:`KvBucket.get` returns a :class:`KvEntry` or ``None`` (absent, deleted or purged);
- :meth:`KvBucket.create` and :meth:`KvBucket.update` raise :class:`RevisionMismatchError`
  when someone else wrote first (compare-and-set), and only then;
- every other failure is fracpilot's: a server that does not answer raises
  :class:`KvTimeoutError`, one that is restarting or electing a leader ("no responders", 503,
  a reconnecting connection) another
  :class:`~fracpilot_libs.nats.errors.TransientNatsError`, anything else a
  :class:`~fracpilot_libs.nats.errors.PermanentNatsError`; so a caller retries or gives up by
  type, never by inspecting nats-py.

Buckets are opened with :func:`open_kv` (made when missing, raised to the replica count when an
earlier version made them with fewer). ``raw`` is for this package's own readers (snapshots,
watches, through :meth:`KvBucket.watch_all`); nothing outside ``fracpilot_libs.nats`` touches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from fracpilot_libs.nats.errors import (
    TRANSIENT_CLIENT_ERRORS,
    PermanentNatsError,
    TransientNatsError,
)
from fracpilot_libs.nats.streams import set_replicas

log = logging.getLogger(__name__)

# JSStreamWrongLastSequenceErrF, JSStreamWrongLastSequenceConstantErr
_WRONG_LAST_SEQUENCE = (10071, 10164)


class RevisionMismatchError(Exception):
    """A compare-and-set write lost: the key exists (create) or is past ``last`` (update)."""


class KvTimeoutError(TransientNatsError):
    """The bucket's server did not answer in time (a leader moving, a server restarting)."""


@contextlib.contextmanager
def fracpilot_errors(what: str) -> Iterator[None]:
    """nats-py's errors raised inside as fracpilot's (see the module's docstring)."""
    try:
        yield
    except nats.errors.TimeoutError as exc:
        raise KvTimeoutError(f"{what}: no answer") from exc
    except TRANSIENT_CLIENT_ERRORS as exc:
        raise TransientNatsError(f"{what}: {exc!r}") from exc
    except nats.errors.Error as exc:
        raise PermanentNatsError(f"{what}: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes
    revision: int


class KvBucket:
    """A KV bucket: values are bytes, revisions ints, absence ``None``."""

    def __init__(self, raw: KeyValue, name: str) -> None:
        self.raw = raw
        self.name = name

    async def get(self, key: str) -> KvEntry | None:
        with fracpilot_errors(f"KV get {self.name}/{key}"):
            try:
                entry = await self.raw.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                return None
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None
        return KvEntry(key, entry.value, entry.revision or 0)

    async def put(self, key: str, value: bytes) -> int:
        with fracpilot_errors(f"KV put {self.name}/{key}"):
            return await self.raw.put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        """Write ``key`` only if it holds nothing (absent or deleted); its revision."""
        with fracpilot_errors(f"KV create {self.name}/{key}"):
            try:
                return await self.raw.create(key, value)
            except KeyWrongLastSequenceError as exc:
                raise RevisionMismatchError(f"{self.name}/{key} exists") from exc

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write ``key`` only if its revision is still ``last``; the new revision."""
        with fracpilot_errors(f"KV update {self.name}/{key}"):
            try:
                return await self.raw.update(key, value, last=last)
            except KeyWrongLastSequenceError as exc:
                raise RevisionMismatchError(f"{self.name}/{key} is past revision {last}") from exc

    async def delete(self, key: str, last: int | None = None) -> None:
        """Delete ``key`` (only at revision ``last`` when given)."""
        with fracpilot_errors(f"KV delete {self.name}/{key}"):
            try:
                await self.raw.delete(key, last=last)
            except BadRequestError as exc:
                # nats-py names a stale ``last`` KeyWrongLastSequenceError on update only; on a
                # delete it is the server's bare 400 with the wrong-last-sequence codes.
                if exc.err_code not in _WRONG_LAST_SEQUENCE:
                    raise
                raise RevisionMismatchError(f"{self.name}/{key} is past revision {last}") from exc

    async def watch_all(self, *, ignore_deletes: bool = False) -> KeyValue.KeyWatcher:
        """A watcher of every key: each current value, then ``None`` once, then every change
        (read by this package's followers and snapshots, :mod:`fracpilot_libs.nats.kv_watch`
        and :mod:`fracpilot_libs.nats.kv_snapshot`)."""
        with fracpilot_errors(f"KV watch {self.name}"):
            return await self.raw.watchall(ignore_deletes=ignore_deletes)

    async def put_many(
        self, nc: NatsClient, items: list[tuple[str, bytes]], timeout_s: float
    ) -> set[str]:
        """Many puts as plain JetStream publishes, each with its own reply subject on one inbox
        subscription: no future or task per write (what ``KeyValue.put`` costs), and a failed
        write is still told apart. Returns the keys not acknowledged as stored within
        ``timeout_s`` (all of them when the connection is down)."""
        return await self._publish_many(nc, items, timeout_s)

    async def delete_many(self, nc: NatsClient, keys: list[str], timeout_s: float) -> set[str]:
        """Many deletes, as :meth:`put_many` writes (a delete is a publish with the KV
        operation header, as ``KeyValue.delete`` sends it); the keys not acknowledged."""
        items = [(key, b"") for key in keys]
        return await self._publish_many(nc, items, timeout_s, {"KV-Operation": "DEL"})

    async def _publish_many(
        self,
        nc: NatsClient,
        items: list[tuple[str, bytes]],
        timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> set[str]:
        prefix = f"$KV.{self.name}."
        inbox = nc.new_inbox()
        stored: dict[int, bool] = {}
        all_in = asyncio.Event()

        async def on_ack(msg: Msg) -> None:
            # A publish acknowledgement is a JSON object; an error is one with "error", and
            # "no responders" (no such bucket) an empty status message.
            data = msg.data
            stored[int(msg.subject.rsplit(".", 1)[1])] = (
                data.startswith(b"{") and b'"error"' not in data
            )
            if len(stored) == len(items):
                all_in.set()

        sub = await nc.subscribe(f"{inbox}.*", cb=on_ack)
        try:
            for i, (key, data) in enumerate(items):
                await nc.publish(prefix + key, data, reply=f"{inbox}.{i}", headers=headers)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await all_in.wait()
        except Exception as exc:  # the connection is down: whatever is not stored failed
            log.warning("KV writes failed", extra={"bucket": self.name, "error": repr(exc)})
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return {key for i, (key, _) in enumerate(items) if not stored.get(i)}


async def open_kv(
    js: JetStreamContext,
    bucket: str,
    *,
    history: int = 1,
    replicas: int = 1,
    replicated: set[str] | None = None,
    ttl_s: float | None = None,
) -> KvBucket:
    """The bucket, made when missing (another replica making it meanwhile is fine), or raised
    to ``replicas`` once (``replicated`` holds the buckets already raised on this connection;
    ``None``: raise it now)."""
    try:
        raw = await js.key_value(bucket)
    except BucketNotFoundError:
        config = KeyValueConfig(
            bucket=bucket, history=history, storage=StorageType.FILE, replicas=replicas
        )
        if ttl_s is not None:
            config.ttl = ttl_s
        try:
            return KvBucket(await js.create_key_value(config), bucket)
        except Exception as exc:  # made by another replica meanwhile: open that one
            try:
                return KvBucket(await js.key_value(bucket), bucket)
            except BucketNotFoundError:
                raise exc from None  # not made at all: the creation's own error (retried?)
    if replicated is None or bucket not in replicated:
        await set_replicas(js, f"KV_{bucket}", replicas)
        if replicated is not None:
            replicated.add(bucket)
    return KvBucket(raw, bucket)
