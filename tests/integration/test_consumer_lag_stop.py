"""A consumer's lag watch ends when cancelled though the cancel is lost.

The decision service cancels a partition's lag watch when it hands the partition over (another
replica may own the consumer now, its series must go). The watch asks the server for the
consumer's info (``js.consumer_info``: a request whose reply nats-py awaits through
``asyncio.wait_for``, nats-py 2.16.0 nats/aio/client.py ``_request_new_style``), and on Python
3.11 ``wait_for`` returns the reply when the cancel comes in the same loop pass
(:mod:`fracpilot_libs.deadlines`): the watch then went on exporting the lag of a consumer this
replica no longer owned, until the bus stopped. Same loss as
tests/integration/test_actuator_stop.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import consumer as consumer_module
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, usage_stream_of, wait_for

pytestmark = pytest.mark.integration
USAGE = usage_stream_of(sample().workload)


async def test_a_cancelled_lag_watch_ends_though_its_cancel_comes_with_a_reply(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "LAG_INTERVAL_S", 0.05)
    await reset_nats(nats_url)
    bus = Bus("test", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    try:
        await bus.js.add_consumer(
            USAGE, ConsumerConfig(durable_name="own-p3", ack_policy=AckPolicy.EXPLICIT)
        )
        consumer_info = bus.js.consumer_info
        replies: list[asyncio.Future[None]] = []

        async def held_consumer_info(*args: Any, **kwargs: Any) -> Any:
            """The server's answer, each reply awaited as nats-py awaits one; the test gives
            the first."""
            replies.append(asyncio.get_running_loop().create_future())
            await asyncio.wait_for(replies[-1], 60)  # as nats-py's request
            return await consumer_info(*args, **kwargs)

        monkeypatch.setattr(bus.js, "consumer_info", held_consumer_info)
        watcher = bus.watch_consumer_lag(USAGE, "own-p3")
        await wait_for(lambda: bool(replies))  # the watch awaits its reply
        replies[-1].set_result(None)
        watcher.cancel()  # in this loop pass, as the reply comes
        await asyncio.wait({watcher}, timeout=5)
        # The ask went on to its end (wait_for lost the cancel); the watch ended after it.
        assert watcher.cancelled()
        assert len(replies) == 1
    finally:
        await bus.close()
