"""A stream the cluster cannot place is declared again until the deadline (nats/declare_retry):
JetStream's "no suitable peers for placement" (error 10005) is what a replicated stream gets
while a peer is not yet current at a cluster's start-up (seen in bench/ingest_replicas.py's
3-node cluster under load), and a peer coming back mends it. Made here for certain, by a real
3-node cluster asked for more replicas than it has servers: the real server's refusal is
tried again, logged each time, and raised once the deadline has passed."""

from __future__ import annotations

import logging

import nats
import nats.js.errors
import pytest
from nats.js.api import StreamConfig

from fracpilot_libs.nats.declare_retry import NO_PEERS_FOR_PLACEMENT, declare_patiently
from support.nats_cluster import NatsCluster

pytestmark = pytest.mark.integration


async def test_a_stream_without_peers_for_placement_is_tried_again_until_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fracpilot_libs.nats.declare_retry")
    with NatsCluster() as cluster:
        nc = await nats.connect(cluster.url.split(","))
        try:
            js = nc.jetstream()
            calls = 0

            async def declare() -> None:
                nonlocal calls
                calls += 1
                await js.add_stream(StreamConfig(name="FIVE", subjects=["five.>"], num_replicas=5))

            with pytest.raises(nats.js.errors.APIError) as raised:
                await declare_patiently(
                    declare, "streams", deadline_s=2.0, first_delay_s=0.1, max_delay_s=0.3
                )
        finally:
            await nc.close()
    assert raised.value.err_code == NO_PEERS_FOR_PLACEMENT, raised.value
    assert calls >= 3
    retries = [r for r in caplog.records if r.getMessage().startswith("declaring on jetstream")]
    assert len(retries) == calls - 1
    assert all("10005" in str(getattr(r, "error", "")) for r in retries)
