"""A fetch ends when what awaits it is cancelled.

- ``DurableConsumer._next_batch`` waits for the feed's next batch or the bus stopping. When the
  consumer's task itself is cancelled in that wait (a service cancelled rather than stopped),
  the fetch it started must end with it: left running, it went on asking the server for
  messages after the feed had unsubscribed, and took messages nobody would handle (delivered
  again only after the ack wait) or failed with an exception nobody retrieved.
- ``PullFeed.next_batch`` asks for the consumer's info after a pull request went unanswered
  (503). nats-py awaits the reply through ``asyncio.wait_for``, which on Python 3.11 returns
  the reply and drops a cancel that comes in the same loop pass
  (:mod:`fracpilot_libs.deadlines`); the idle loop then long-polled on until a message came,
  and whoever cancelled it waited as long.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.pull_feed import PullFeed
from helpers import reset_nats, usage_stream_of, wait_for

pytestmark = pytest.mark.integration
USAGE = usage_stream_of(sample().workload)


def fetches() -> list[asyncio.Task[object]]:
    """The tasks running a pull feed's ``next_batch`` that have not ended."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "PullFeed.next_batch"
    ]


async def test_a_consumer_cancelled_while_idle_leaves_no_fetch_running(nats_url: str) -> None:
    await reset_nats(nats_url)
    bus = Bus("test", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    handled: list[str] = []

    async def handler(s: UsageSample, _msg: Msg) -> None:
        handled.append(s.sample_id)

    try:
        first = sample(minute=1)
        await bus.consume(
            stream=usage_stream_of(first.workload),
            durable="cancelled",
            model=UsageSample,
            filter_subject=f"{subjects.USAGE_PREFIX}.>",
            handler=handler,
        )
        await bus.publish(subjects.usage_subject(first.workload), first, first.sample_id)
        await wait_for(lambda: handled == [first.sample_id])  # the loop runs
        await wait_for(lambda: bool(fetches()))  # ... and waits in a fetch
        (run,) = [t for t in asyncio.all_tasks() if t.get_name() == "consume-cancelled"]
        run.cancel()
        await asyncio.wait({run}, timeout=5)
        assert run.cancelled()
        assert fetches() == []  # ended with the consumer, not after its long poll
    finally:
        await bus.close()


async def test_a_fetch_ends_when_its_cancel_comes_with_the_consumers_info(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await reset_nats(nats_url)
    bus = Bus("test", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    config = ConsumerConfig(durable_name="asked", ack_policy=AckPolicy.EXPLICIT)
    feed = PullFeed(bus.nc, USAGE, "asked", expires_s=0.2)
    try:
        await bus.js.add_consumer(USAGE, config)
        await feed.start()
        consumer_exists = feed._consumer_exists
        replies: list[asyncio.Future[None]] = []

        async def held_consumer_exists() -> bool:
            """The server's answer, its reply awaited as nats-py awaits one; the test gives it."""
            replies.append(asyncio.get_running_loop().create_future())
            await asyncio.wait_for(replies[-1], 60)  # as nats-py's request
            return await consumer_exists()

        monkeypatch.setattr(feed, "_consumer_exists", held_consumer_exists)
        fetch = asyncio.create_task(feed.next_batch())
        await asyncio.sleep(0.1)  # a long poll is out
        await bus.js.delete_consumer(USAGE, "asked")  # the next request goes unanswered
        await wait_for(lambda: bool(replies), timeout=10)  # the feed asks for its info
        await bus.js.add_consumer(USAGE, config)  # back: the info says it exists
        replies[-1].set_result(None)
        fetch.cancel()  # in this loop pass, as the reply comes
        await asyncio.wait({fetch}, timeout=5)
        assert fetch.cancelled()  # not long-polling on for a message that never comes
    finally:
        await feed.stop()
        await bus.close()
