"""The typed KV door (fracpilot_libs.nats.kv) against a real nats-server: absence is ``None``,
a lost compare-and-set is :class:`RevisionMismatchError`, and batched puts say what failed."""

from __future__ import annotations

import pytest

from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.kv import KvBucket, KvEntry, RevisionMismatchError, open_kv

pytestmark = pytest.mark.integration


async def value_of(bucket: KvBucket, key: str) -> bytes | None:
    entry = await bucket.get(key)
    return None if entry is None else entry.value


async def test_an_absent_and_a_deleted_key_read_as_none(bucket: KvBucket) -> None:
    assert await bucket.get("never.written") is None
    revision = await bucket.put("a", b"1")
    assert await bucket.get("a") == KvEntry("a", b"1", revision)
    await bucket.delete("a")
    assert await bucket.get("a") is None


async def test_a_lost_compare_and_set_raises_revision_mismatch(bucket: KvBucket) -> None:
    first = await bucket.create("k", b"1")
    with pytest.raises(RevisionMismatchError):
        await bucket.create("k", b"2")  # it exists
    second = await bucket.update("k", b"2", last=first)
    with pytest.raises(RevisionMismatchError):
        await bucket.update("k", b"3", last=first)  # stale: someone wrote after
    with pytest.raises(RevisionMismatchError):
        await bucket.delete("k", last=first)
    assert await bucket.get("k") == KvEntry("k", b"2", second)
    # A deleted key holds nothing: create writes it again.
    await bucket.delete("k")
    await bucket.create("k", b"4")
    assert await value_of(bucket, "k") == b"4"


async def test_opening_an_existing_bucket_keeps_its_values(
    nc: NatsClient, bucket: KvBucket
) -> None:
    await bucket.put("kept", b"yes")
    replicated: set[str] = set()
    again = await open_kv(nc.jetstream(), bucket.name, replicated=replicated)
    assert replicated == {bucket.name}  # its replicas checked once on this connection
    assert await value_of(again, "kept") == b"yes"


async def test_put_many_stores_every_key_and_reports_the_failed_ones(
    nc: NatsClient, bucket: KvBucket
) -> None:
    items = [(f"w.{i}", f"{i}".encode()) for i in range(250)]
    assert await bucket.put_many(nc, items, timeout_s=10) == set()
    for key, value in (items[0], items[-1]):
        assert await value_of(bucket, key) == value

    # A bucket that is gone stores nothing: every key is reported.
    await nc.jetstream().delete_key_value(bucket.name)
    failed = await bucket.put_many(nc, [("x.1", b"1"), ("x.2", b"2")], timeout_s=2)
    assert failed == {"x.1", "x.2"}
    await open_kv(nc.jetstream(), bucket.name)  # for the fixture to delete
