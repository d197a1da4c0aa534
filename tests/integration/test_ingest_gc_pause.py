"""The ingest keeps the cyclic collector paused over a reading's whole life (real NATS): from
the source's read to the reading's release, which comes inside the pause, so no collection
walks the reading's millions of objects while they are still held (fracpilot_libs.gc_pause;
docs/performance.md, "One pause over a reading's life")."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.sources.base import Reading, Source
from helpers import reset_nats, running, wait_for

pytestmark = pytest.mark.integration


class HeldSamples(list):  # type: ignore[type-arg]
    """A reading's samples, in a list that can be watched for its release."""


class WatchedSource:
    """The simulator, noting whether the collector runs while it reads, when the service
    reports a reading published, and when each reading is released."""

    def __init__(self, inner: Source) -> None:
        self.inner, self.name = inner, inner.name
        self.collector_on: dict[str, list[bool]] = {
            "read": [],
            "published": [],
            "released": [],
            "between": [],  # asked how long to wait: the reading is over
        }

    async def open(self) -> None:
        await self.inner.open()

    async def read(self) -> Reading | None:
        self.collector_on["read"].append(gc.isenabled())
        reading = await self.inner.read()
        if reading is None:
            return None
        held = HeldSamples(reading.samples)
        weakref.finalize(held, lambda: self.collector_on["released"].append(gc.isenabled()))
        return dataclasses.replace(reading, samples=held)

    async def published(self, reading: Reading) -> None:
        self.collector_on["published"].append(gc.isenabled())
        await self.inner.published(reading)

    def next_read_in(self) -> float:
        self.collector_on["between"].append(gc.isenabled())
        return self.inner.next_read_in()


async def test_the_collector_is_paused_from_a_readings_query_to_its_release(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    assert gc.isenabled()
    settings = IngestSettings(
        nats={"url": nats_url}, sim={"duration_s": 0, "workloads": 3, "speed": 600}
    )
    service = IngestService(settings)
    watched = WatchedSource(service.sources[0])
    service.sources = [watched]
    async with running(service):
        await wait_for(lambda: len(watched.collector_on["between"]) >= 3, timeout=30)
        # Copied now: a reading the stop cuts short is freed after its pause has ended.
        on = {what: list(seen) for what, seen in watched.collector_on.items()}
    assert on["read"]
    assert not any(on["read"])
    assert on["published"]
    assert not any(on["published"])
    assert len(on["released"]) >= 3
    assert not any(on["released"])  # freed by reference counting, inside the pause
    assert all(on["between"])  # between readings the collector runs (cycles made meanwhile)
    assert gc.isenabled()
