"""Reading a KV bucket through a watch, against a real nats-server, when nats-py's "end of the
initial values" marker overtakes the values (fracpilot_libs.nats.kv_initial): the policy list
once came back empty in CI that way. The overtaking is timing (the consumer-info reply handled
before the values already queued in the client), so the tests put the marker first in the
watcher's queue, as nats-py does then."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.nats.kv_snapshot import read_kv_watched
from fracpilot_libs.nats.kv_watch import follow_kv

pytestmark = pytest.mark.integration


class Value(BaseModel):
    n: int


@pytest.fixture
def marker_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new watcher's queue starts with nats-py's end marker, before the values."""
    watch_all = KvBucket.watch_all

    async def overtaken(self: KvBucket, *, ignore_deletes: bool = False) -> Any:
        watcher = await watch_all(self, ignore_deletes=ignore_deletes)
        await asyncio.sleep(0.2)  # the values reach the client's queue
        queued = watcher._updates
        entries = [e for e in (queued.get_nowait() for _ in range(queued.qsize())) if e]
        assert entries, "the values were not queued yet"
        for update in (None, *entries):
            queued.put_nowait(update)
        watcher._init_done = True  # nats-py puts no second marker after the last value
        return watcher

    monkeypatch.setattr(KvBucket, "watch_all", overtaken)


@pytest.mark.usefixtures("marker_first")
async def test_a_watched_read_waits_for_the_values_an_early_marker_overtook(
    bucket: KvBucket,
) -> None:
    for i in range(3):
        await bucket.put(f"k{i}", f'{{"n":{i}}}'.encode())
    await bucket.put("gone", b'{"n":9}')
    await bucket.delete("gone")  # the last message: a delete, read and left out
    assert await read_kv_watched(bucket) == {f"k{i}": f'{{"n":{i}}}'.encode() for i in range(3)}


@pytest.mark.usefixtures("marker_first")
async def test_a_follower_says_its_initial_values_are_in_only_once_reported(
    bucket: KvBucket,
) -> None:
    for i in range(3):
        await bucket.put(f"k{i}", f'{{"n":{i}}}'.encode())
    seen: dict[str, int | None] = {}

    async def on_update(key: str, value: Value | None) -> None:
        seen[key] = None if value is None else value.n

    async def no_dead_letters(*args: Any) -> None:
        raise AssertionError(f"dead-lettered: {args}")

    done, stopping = asyncio.Event(), asyncio.Event()
    follow = asyncio.create_task(
        follow_kv(
            bucket,
            await bucket.watch_all(),
            bucket.name,
            Value,
            on_update,
            initial_done=done,
            stopping=stopping,
            reconnects=lambda: 0,
            dead_letter=no_dead_letters,
        )
    )
    try:
        await asyncio.wait_for(done.wait(), 10)
        assert seen == {"k0": 0, "k1": 1, "k2": 2}  # all in when it says so
    finally:
        stopping.set()
        await follow


async def test_an_empty_bucket_reads_empty_at_once(bucket: KvBucket) -> None:
    started = time.monotonic()
    assert await read_kv_watched(bucket) == {}
    assert time.monotonic() - started < 4  # the marker is the end: no wait for a value
