"""Ingest's source loop ends on stop though the stop's cancel is lost.

A reading awaits NATS replies (the sharded Prometheus source reads its cursors from the KV,
the publishes wait for their acks, the cursors are written back), each through nats-py's
``asyncio.wait_for`` (nats-py 2.16.0, nats/aio/client.py ``_request_new_style``), which on
Python 3.11 returns the reply when the cancel comes in the same loop pass
(:mod:`fracpilot_libs.deadlines`). A stop that only cancelled the source's task left its loop
reading and publishing after the stop (and a sharded ingest's stop, which waits for it, hung).
Same loss as tests/integration/test_actuator_stop.py.
"""

from __future__ import annotations

import asyncio

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.sources.base import Reading, Source
from fracpilot_libs.deadlines import within
from helpers import reset_nats, running, wait_for

pytestmark = pytest.mark.integration


class ReplyAwaitingSource:
    """The simulator, whose reads each await a reply as nats-py awaits one; the test gives
    the first."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.name = inner.name
        self.replies: list[asyncio.Future[None]] = []

    async def open(self) -> None:
        await self.inner.open()

    async def read(self) -> Reading | None:
        self.replies.append(asyncio.get_running_loop().create_future())
        await asyncio.wait_for(self.replies[-1], 60)  # as nats-py's request
        return await self.inner.read()

    async def published(self, reading: Reading) -> None:
        await self.inner.published(reading)

    def next_read_in(self) -> float:
        return self.inner.next_read_in()


async def test_stop_ends_the_source_loop_though_its_cancel_comes_with_a_reply(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    settings = IngestSettings(
        nats={"url": nats_url}, sim={"duration_s": 0, "workloads": 1, "speed": 600}
    )
    service = IngestService(settings)
    source = ReplyAwaitingSource(service.sources[0])
    service.sources = [source]
    async with running(service):
        await wait_for(lambda: bool(source.replies))  # a read awaits its reply
        tasks = list(service._tasks)
        source.replies[-1].set_result(None)
        # stop() cancels the source's task before its first await: in this loop pass, as the
        # reply comes.
        await within(service.stop(), 10)
        # The reading went on to its end (wait_for lost the cancel); no read came after it.
        await within(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert len(source.replies) == 1
