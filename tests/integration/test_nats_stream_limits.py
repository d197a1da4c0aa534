"""Stream limits on a real nats-server: the services' set-up gives each stream its configured
max bytes / max age, changes them in place on the next start, and a stream at its byte limit
drops its oldest messages while publishes go on being accepted (discard policy "old")."""

from __future__ import annotations

import nats
from nats.js.api import DiscardPolicy
from prometheus_client import CollectorRegistry

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats


async def declare(url: str, **limits: float) -> None:
    settings = ServiceSettings(nats={"url": url}, decision_partitions=2, streams=limits)
    bus = Bus("test", settings, CollectorRegistry())
    await bus.connect(retry_for_s=10)
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()


async def test_limits_are_set_changed_in_place_and_old_messages_give_way(nats_url: str) -> None:
    await reset_nats(nats_url)
    await declare(nats_url, usage_max_bytes=200_000, deadletters_max_bytes=4096)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        usage = (await js.stream_info(subjects.usage_stream(1))).config
        assert usage.max_bytes == 200_000
        dead = (await js.stream_info(subjects.DEADLETTER_STREAM)).config
        assert dead.max_bytes == 4096
        assert dead.discard == DiscardPolicy.OLD
        for _ in range(40):  # ~10 kB into a 4 kB stream: every publish is accepted
            await js.publish(f"{subjects.DEADLETTER_PREFIX}.test", b"x" * 256, timeout=5)
        state = (await js.stream_info(subjects.DEADLETTER_STREAM)).state
        assert state.bytes <= 4096
        assert state.last_seq == 40
        assert state.first_seq > 1  # the oldest went
        # the next start with other limits updates the streams in place, messages kept
        await declare(nats_url, deadletters_max_bytes=0, deadletters_max_age_s=3600.0)
        info = await js.stream_info(subjects.DEADLETTER_STREAM)
        assert (info.config.max_bytes, info.config.max_age) in {(-1, 3600.0), (None, 3600.0)}
        assert info.state.last_seq == 40
    finally:
        await nc.close()
