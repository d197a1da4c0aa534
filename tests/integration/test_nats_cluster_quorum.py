"""How many replicas on a cluster of a given size, and readiness when the server a service is
connected to has lost its quorum (issue 17; tests/support/nats_cluster.py).

- On two servers an R3 stream cannot be placed: the replicas detected are 1 (min(3, size),
  odd), and the services' streams are made; on three they are 3.
- A service connected to the JetStream meta leader: the two other servers frozen (SIGSTOP,
  a partition that looks like a hung machine), the leader goes on answering stream info for
  a while, yet the service is not ready within a few readiness probes (one every 2 s); thawed,
  it is ready again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, running, wait_for
from support.nats_cluster import IdleService, NatsCluster, replicas_of

pytestmark = pytest.mark.integration


async def declared_by_a_bus(url: str) -> tuple[int, int | None]:
    """A bus with the replicas left to detection declares the streams and a bucket; returns
    the replicas it chose and the servers it counted."""
    bus = Bus(
        "test", ServiceSettings(nats={"url": url}, decision_partitions=2), CollectorRegistry()
    )
    await bus.connect(retry_for_s=10)
    try:
        await bus.ensure_streams()
        await bus.kv(subjects.TARGET_BUCKET)
        return bus.replicas, bus.cluster_servers
    finally:
        await bus.close()


async def test_two_servers_get_one_replica_and_the_streams_are_made() -> None:
    with NatsCluster(size=2) as cluster:
        replicas, servers = await declared_by_a_bus(cluster.url)
        assert (replicas, servers) == (1, 2)
        made = await replicas_of(cluster.url)
        for name in (subjects.DECISION_STREAM, subjects.usage_stream(1), "KV_fracpilot_targets"):
            assert made[name] == 1, made


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster() as c:
        yield c


async def test_three_servers_are_counted_and_get_three_replicas(cluster: NatsCluster) -> None:
    await reset_nats(cluster.nodes[0].url)
    # one node's URL only: the count comes from the servers' answers, not the URLs given
    assert await declared_by_a_bus(cluster.nodes[1].url) == (3, 3)
    assert (await replicas_of(cluster.url))[subjects.usage_stream(0)] == 3


async def test_readiness_is_lost_when_the_leader_it_talks_to_loses_its_quorum(
    cluster: NatsCluster,
) -> None:
    await reset_nats(cluster.nodes[0].url)
    leader = cluster.node(cluster.wait_for_meta_leader())
    others = [n for n in cluster.nodes if n is not leader]
    service = IdleService(leader.url)  # connected to the meta leader, and to it only
    health = service.runtime.health
    async with running(service):
        assert health.ready
        assert service.runtime.bus.cluster_servers == 3
        for node in others:
            node.freeze()
        try:
            started = time.monotonic()
            # a few 2 s probes; the stream-info probe alone took over 16 s here
            await wait_for(lambda: not health.ready, timeout=8)
            lost_after = time.monotonic() - started
            assert service.runtime.bus.connected  # the connection itself is fine
            assert health.reason == "JetStream unavailable"
        finally:
            for node in others:
                node.thaw()
        started = time.monotonic()
        await wait_for(lambda: health.ready, timeout=30)
        back_after = time.monotonic() - started
    print(f"not ready {lost_after:.1f}s after the quorum was lost, ready {back_after:.1f}s after")
