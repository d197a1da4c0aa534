"""The shards' cursors on a real nats-server: a cycle reads each of its cursors once (when it
begins); moving them writes from those revisions and reads only the cursors of shards it does
not hold; a cursor another replica moved meanwhile is read again and never moved back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from prometheus_client import CollectorRegistry

from fracpilot_ingest.settings import ShardSettings
from fracpilot_ingest.shard_plan import CURSOR_PREFIX, cursor_key, parse_cursor
from fracpilot_ingest.shards import IngestShards
from fracpilot_libs.nats.kv import KvBucket, KvEntry, open_kv

SHARDS = 4


class CountedBucket(KvBucket):
    """The real bucket, its reads counted by key."""

    def __init__(self, bucket: KvBucket) -> None:
        super().__init__(bucket.raw, bucket.name)
        self.reads: list[str] = []

    async def get(self, key: str) -> KvEntry | None:
        self.reads.append(key)
        return await super().get(key)


@pytest.fixture
async def shards(nats_url: str, request: pytest.FixtureRequest) -> AsyncIterator[IngestShards]:
    nc = await nats.connect(nats_url)
    replica = IngestShards(
        ShardSettings(shards=SHARDS, shard_lease_s=5.0, replica_id=request.node.name[:40]),
        CollectorRegistry(),
        ("UUID",),
    )
    await replica.start(nc, 1)  # a lone replica: every shard held when this returns
    yield replica
    await replica.stop()
    await nc.close()


async def state(nats_url: str, name: str) -> tuple[CountedBucket, nats.NATS]:
    nc = await nats.connect(nats_url)
    return CountedBucket(await open_kv(nc.jetstream(), name)), nc


async def cursor(kv: KvBucket, key: str) -> float | None:
    entry = await kv.get(key)
    return parse_cursor(entry.value) if entry is not None else None


async def test_a_cycle_reads_each_cursor_once_and_moves_them_all(
    shards: IngestShards, nats_url: str
) -> None:
    kv, nc = await state(nats_url, "cursor_reads_once")
    try:
        for k in range(SHARDS):
            await kv.put(cursor_key(k, SHARDS), b"100.000")
        for until in (115.0, 130.0):  # a second cycle starts from the first one's writes
            kv.reads.clear()
            plan = await shards.begin_cycle(kv, 0.0)
            assert sorted(plan.cursors) == list(range(SHARDS))
            await shards.end_cycle(kv, plan, until)
            # Each of the cycle's cursors once, at its start (not again to move them, nor
            # for the floor: the cycle wrote them), and the floor's own key to move it.
            expected = [cursor_key(k, SHARDS) for k in range(SHARDS)] + [CURSOR_PREFIX]
            assert sorted(kv.reads) == sorted(expected)
            for k in range(SHARDS):
                assert await cursor(kv, cursor_key(k, SHARDS)) == until
            assert await cursor(kv, CURSOR_PREFIX) == until  # the floor
    finally:
        await nc.close()


async def test_a_cursor_moved_meanwhile_is_read_again_and_never_moved_back(
    shards: IngestShards, nats_url: str
) -> None:
    kv, nc = await state(nats_url, "cursor_moved_meanwhile")
    try:
        for k in range(SHARDS):
            await kv.put(cursor_key(k, SHARDS), b"100.000")
        plan = await shards.begin_cycle(kv, 0.0)
        ahead, behind = cursor_key(0, SHARDS), cursor_key(1, SHARDS)
        await kv.put(ahead, b"145.000")  # another replica, ahead of this cycle
        await kv.put(behind, b"105.000")  # another replica, behind it
        kv.reads.clear()
        await shards.end_cycle(kv, plan, 130.0)
        assert sorted(set(kv.reads) - {CURSOR_PREFIX}) == [ahead, behind]  # read again: these
        assert await cursor(kv, ahead) == 145.0  # not moved back
        assert await cursor(kv, behind) == 130.0  # moved on from the revision read again
        assert await cursor(kv, cursor_key(2, SHARDS)) == 130.0
        assert await cursor(kv, CURSOR_PREFIX) == 130.0  # the floor: the earliest of all
    finally:
        await nc.close()
