"""A usage source that raises does not end ingestion (real NATS): the crash is logged with its
exception and counted, the source is started again after a pause, ingest is not ready while
the source keeps crashing, and ready again once it reads and publishes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.sources.base import Reading, Source
from helpers import counter, reset_nats, running, wait_for

pytestmark = pytest.mark.integration


class FlakySource:
    """The simulator, but its first ``crashes`` reads raise; after them ``open`` waits for
    ``release`` (so that the test sees the failing state before it recovers)."""

    def __init__(self, inner: Source, crashes: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.crashes = crashes
        self.go = asyncio.Event()
        self.release = asyncio.Event()
        self.opened = 0

    async def open(self) -> None:
        self.opened += 1
        if self.crashes == 0:
            await self.release.wait()
        await self.inner.open()

    async def read(self) -> Reading | None:
        await self.go.wait()
        if self.crashes > 0:
            self.crashes -= 1
            raise RuntimeError(f"exporter answered nonsense ({self.crashes} more to come)")
        return await self.inner.read()

    async def published(self, reading: Reading) -> None:
        await self.inner.published(reading)

    def next_read_in(self) -> float:
        return self.inner.next_read_in()


async def test_a_crashing_source_is_logged_counted_restarted_and_reflected_in_readiness(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await reset_nats(nats_url)
    settings = IngestSettings(
        nats={"url": nats_url},
        sim={"duration_s": 0, "workloads": 1, "speed": 600},
        restarts={"backoff_s": 0.05, "backoff_max_s": 0.2, "failing_after": 2},
    )
    service = IngestService(settings)
    flaky = FlakySource(service.sources[0], crashes=2)
    service.sources = [flaky]
    registry, health = service.runtime.registry, service.runtime.health

    def crashes() -> float:
        return counter(registry, "fracpilot_ingest_source_crashes_total", source="simulator")

    def published() -> float:
        return counter(
            registry,
            "fracpilot_ingest_samples_published_total",
            source="simulator",
            attribution="exact",
        )

    caplog.set_level(logging.ERROR, logger="fracpilot_ingest.supervision")
    async with running(service):
        assert health.ready
        flaky.go.set()  # the two crashing reads, then a restart waiting for release
        await wait_for(lambda: flaky.opened == 3, timeout=10)
        assert crashes() == 2
        assert not health.ready
        assert health.reason == "usage source failing: simulator (2 crashes in a row)"
        assert published() == 0
        crashed = [
            r for r in caplog.records if r.getMessage() == "usage source crashed: restarting it"
        ]
        assert len(crashed) == 2
        assert crashed[0].exc_info is not None
        assert "exporter answered nonsense (1 more to come)" in str(crashed[0].exc_info[1])

        flaky.release.set()  # the source works again: publishes, and ingest is ready
        await wait_for(lambda: published() >= 2 and health.ready, timeout=10)
        assert health.reason == "ok"
        assert crashes() == 2
        assert not service.finished.is_set()  # still running, not ended
