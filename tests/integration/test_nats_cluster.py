"""fracpilot on a three-node JetStream cluster (tests/support/nats_cluster.py): its streams
and KV buckets are replicated, an earlier version's R1 ones are raised in place, and a
stream's leader can be found and killed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, running, wait_for
from support.nats_cluster import (
    IdleService,
    NatsCluster,
    replicas_of,
    stream_info,
    stream_leader,
)

pytestmark = pytest.mark.integration

BUCKETS = (
    subjects.DECISION_STATE_BUCKET,
    subjects.DECISION_PARTITION_BUCKET,
    subjects.POLICY_BUCKET,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster() as c:
        yield c


async def connected_bus(url: str, replicas: int | None = None) -> Bus:
    bus = Bus(
        "test",
        ServiceSettings(nats={"url": url, "replicas": replicas}, decision_partitions=2),
        CollectorRegistry(),
    )
    await bus.connect(retry_for_s=10)
    return bus


def test_the_fixture_forms_a_cluster(cluster: NatsCluster) -> None:
    leader = cluster.wait_for_meta_leader()
    assert leader in {n.name for n in cluster.nodes}
    for node in cluster.nodes:
        meta = (node.jsz() or {})["meta_cluster"]
        assert meta["cluster_size"] == 3
        assert meta["leader"] == leader


async def test_streams_and_buckets_are_r3_on_a_cluster(cluster: NatsCluster) -> None:
    await reset_nats(cluster.nodes[0].url)
    bus = await connected_bus(cluster.url)
    try:
        assert bus.replicas == 3
        await bus.ensure_streams()
        await bus.kv(subjects.TARGET_BUCKET)
    finally:
        await bus.close()
    replicas = await replicas_of(cluster.url)
    usage = [subjects.usage_stream(p) for p in range(2)]
    for name in (*subjects_streams(), *usage, f"KV_{subjects.TARGET_BUCKET}"):
        assert replicas[name] == 3, name
    info = await stream_info(cluster.url, usage[0])
    assert len(info["cluster"]["replicas"]) == 2  # the leader and two followers


def subjects_streams() -> tuple[str, ...]:
    return (subjects.DECISION_STREAM, subjects.ACTUATION_STREAM, subjects.DEADLETTER_STREAM)


async def test_streams_and_buckets_are_r1_on_a_single_server(nats_url: str) -> None:
    await reset_nats(nats_url)
    bus = await connected_bus(nats_url)
    try:
        assert bus.replicas == 1
        await bus.ensure_streams()
        await bus.kv(subjects.TARGET_BUCKET)
    finally:
        await bus.close()
    replicas = await replicas_of(nats_url)
    for name in (*subjects_streams(), subjects.usage_stream(0), f"KV_{subjects.TARGET_BUCKET}"):
        assert replicas[name] == 1, name


async def test_an_earlier_versions_r1_streams_and_buckets_are_raised_to_r3(
    cluster: NatsCluster,
) -> None:
    await reset_nats(cluster.nodes[0].url)
    # An earlier version (every stream and bucket R1: the explicit setting stands for it).
    old = DecisionSettings(nats={"url": cluster.url, "replicas": 1}, decision_partitions=2)
    async with running(DecisionService(old)):
        pass
    before = await replicas_of(cluster.url)
    made = [*subjects_streams(), subjects.usage_stream(0), *(f"KV_{b}" for b in BUCKETS)]
    assert all(before[name] == 1 for name in made), before

    new = DecisionSettings(nats={"url": cluster.url}, decision_partitions=2)
    async with running(DecisionService(new)):
        pass
    after = await replicas_of(cluster.url)
    assert all(after[name] == 3 for name in made), after
    # The raised stream has its followers (the messages are copied in the background).
    info = await stream_info(cluster.url, subjects.usage_stream(0))
    assert len(info["cluster"]["replicas"]) == 2


async def test_the_stream_leader_is_found_and_a_new_one_elected_when_it_is_killed(
    cluster: NatsCluster,
) -> None:
    await reset_nats(cluster.nodes[0].url)
    bus = await connected_bus(cluster.url)
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()
    stream = subjects.DECISION_STREAM
    leader = await stream_leader(cluster.url, stream)
    assert leader is not None
    node = cluster.node(leader)
    node.kill()
    others = ",".join(n.url for n in cluster.nodes if n is not node)
    moved: list[str | None] = [None]

    async def elected() -> bool:
        try:
            moved[0] = await stream_leader(others, stream)
        except Exception:
            return False
        return moved[0] not in (None, leader)

    await wait_for_async(elected, timeout_s=20)
    cluster.restart(node)
    assert node.running
    cluster.wait_for_meta_leader()


async def wait_for_async(check: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError("condition not met in time")


async def test_readiness_follows_jetstream_not_only_the_connection(cluster: NatsCluster) -> None:
    await reset_nats(cluster.nodes[0].url)
    meta_leader = cluster.wait_for_meta_leader()
    service = IdleService(cluster.url)
    health = service.runtime.health
    async with running(service):
        assert health.ready
        # The node that stays up leads neither the meta group nor the stream the probe asks
        # about: a leader that has lost its quorum goes on answering info requests for a
        # while (seen: over 16 s), so that case is not what this test measures.
        leaders = {meta_leader, await stream_leader(cluster.url, subjects.usage_stream(0))}
        kept = next(n for n in cluster.nodes if n.name not in leaders)
        frozen = [n for n in cluster.nodes if n is not kept]
        await service.runtime.bus.nc.close()  # connect again, to the node that stays up
        service.runtime.bus.settings.nats.url = kept.url
        await service.runtime.bus.connect(retry_for_s=10)
        for node in frozen:
            node.freeze()  # no quorum: no meta leader, though the connection stays up
        try:
            started = time.monotonic()
            await wait_for(lambda: not health.ready, timeout=60)
            lost_after = time.monotonic() - started
            assert service.runtime.bus.connected
            assert health.reason == "JetStream unavailable"
        finally:
            for node in frozen:
                node.thaw()
        started = time.monotonic()
        await wait_for(lambda: health.ready, timeout=30)
        back_after = time.monotonic() - started
    print(f"not ready {lost_after:.1f}s after the quorum was lost, ready {back_after:.1f}s after")
