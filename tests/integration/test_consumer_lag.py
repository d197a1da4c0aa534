"""Every consuming service exports its consumers' lag, read from the server's consumer info:
``fracpilot_consumer_pending_messages`` (not yet delivered) and
``fracpilot_consumer_ack_pending_messages`` (delivered, not yet acknowledged), per stream and
consumer name."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import consumer as consumer_module
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, usage_stream_of, wait_for

pytestmark = pytest.mark.integration
USAGE = usage_stream_of(sample().workload)  # every sample here is of that one workload


def lag(registry: CollectorRegistry, consumer: str) -> tuple[float | None, float | None]:
    labels = {"stream": USAGE, "consumer": consumer}
    return (
        registry.get_sample_value("fracpilot_consumer_pending_messages", labels),
        registry.get_sample_value("fracpilot_consumer_ack_pending_messages", labels),
    )


async def test_the_lag_gauges_follow_each_consumer(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "LAG_INTERVAL_S", 0.1)
    await reset_nats(nats_url)
    registry = CollectorRegistry()
    bus = Bus("test", ServiceSettings(nats={"url": nats_url}, fetch_batch=2), registry)
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    release = asyncio.Event()

    async def slow(_s: UsageSample, _msg: Msg) -> None:
        await release.wait()

    async def quick(_s: UsageSample, _msg: Msg) -> None:
        return None

    for name, handler in (("slow", slow), ("quick", quick)):
        await bus.consume(
            stream=USAGE,
            durable=name,
            filter_subject=f"{subjects.USAGE_PREFIX}.>",
            model=UsageSample,
            handler=handler,
        )
    for minute in range(10):
        s = sample(minute=minute)
        await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
    try:
        # The slow consumer holds its first fetch unacknowledged; the rest waits for it.
        def slow_is_stuck() -> bool:
            pending, unacked = lag(registry, "slow")
            return (
                pending is not None
                and unacked is not None
                and pending + unacked == 10
                and (
                    1 <= unacked <= 2  # the message in hand (and the rest of its batch)
                )
            )

        await wait_for(slow_is_stuck, timeout=10)
        await wait_for(lambda: lag(registry, "quick") == (0.0, 0.0), timeout=10)
        release.set()
        await wait_for(lambda: lag(registry, "slow") == (0.0, 0.0), timeout=10)
    finally:
        release.set()
        await bus.close()


async def test_a_service_with_its_own_consumers_exports_their_lag_until_it_lets_go(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer the service drives itself (a partition it owns for a while) has its lag
    exported while watched, and no series once it is handed over."""
    monkeypatch.setattr(consumer_module, "LAG_INTERVAL_S", 0.1)
    await reset_nats(nats_url)
    registry = CollectorRegistry()
    bus = Bus("test", ServiceSettings(nats={"url": nats_url}), registry)
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    try:
        await bus.js.add_consumer(
            USAGE,
            ConsumerConfig(durable_name="own-p3", ack_policy=AckPolicy.EXPLICIT),
        )
        for minute in range(3):
            s = sample(minute=minute)
            await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
        watcher = bus.watch_consumer_lag(USAGE, "own-p3")
        await wait_for(lambda: lag(registry, "own-p3") == (3.0, 0.0), timeout=10)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        assert lag(registry, "own-p3") == (None, None)
    finally:
        await bus.close()
