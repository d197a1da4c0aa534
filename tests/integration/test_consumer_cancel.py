"""A durable consumer cancelled while it waits for messages leaves no fetch behind.

``DurableConsumer._next_batch`` waits for the feed's next batch or the bus stopping. When the
consumer's task itself is cancelled in that wait (a partition handed over, a service cancelled
rather than stopped), the fetch it started must end with it: left running, it went on asking
the server for messages after the feed had unsubscribed, and took messages nobody would
handle (delivered again only after the ack wait) or failed with an exception nobody retrieved.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, usage_stream_of, wait_for

pytestmark = pytest.mark.integration


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
        await wait_for(lambda: bool(fetches()))  # ... and is idle, in a long-poll fetch
        (run,) = [t for t in asyncio.all_tasks() if t.get_name() == "consume-cancelled"]
        run.cancel()
        await asyncio.wait({run}, timeout=5)
        assert run.cancelled()
        assert fetches() == []  # ended with the consumer, not after its long poll
    finally:
        await bus.close()
