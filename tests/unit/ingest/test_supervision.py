"""The source supervisor's pauses and readiness verdict (the restart loop itself runs against
real NATS in tests/integration/test_ingest_source_restarts.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter

from fracpilot_ingest.sources.base import Reading, Source
from fracpilot_ingest.supervision import SourceSupervisor
from helpers import wait_for


class Broken:
    name = "scrape"

    async def open(self) -> None:
        raise ConnectionError("no route")

    async def read(self) -> Reading | None:
        return None

    async def published(self, reading: Reading) -> None:
        pass

    def next_read_in(self) -> float:
        return 0.0


def supervisor(registry: CollectorRegistry, **kw: float) -> SourceSupervisor:
    crashes = Counter("fracpilot_test_crashes_total", "crashes", ["source"], registry=registry)

    async def run(source: Source) -> None:
        await source.open()

    return SourceSupervisor(run, crashes, **kw)


def test_pauses_double_within_their_bounds() -> None:
    sup = supervisor(CollectorRegistry(), backoff_s=1.0, backoff_max_s=10.0)
    for failures, low in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0)):
        assert low <= sup.pause(failures) <= min(low + 1.0, 10.0)
    assert sup.pause(30) == 10.0


def test_a_source_crashing_in_a_row_is_a_readiness_problem_until_it_progresses() -> None:
    registry = CollectorRegistry()
    sup = supervisor(registry, backoff_s=0.01, backoff_max_s=0.01, failing_after=3)
    source = Broken()

    async def crash_a_while() -> None:
        task = asyncio.create_task(sup.supervise(source))
        await wait_for(lambda: sup.failures.get("scrape", 0) >= 3, timeout=10)
        task.cancel()

    assert sup.problem() is None
    asyncio.run(crash_a_while())
    assert (
        sup.problem() == f"usage source failing: scrape ({sup.failures['scrape']} crashes in a row)"
    )
    assert registry.get_sample_value("fracpilot_test_crashes_total", {"source": "scrape"}) >= 3
    sup.progressed(source)
    assert sup.problem() is None
