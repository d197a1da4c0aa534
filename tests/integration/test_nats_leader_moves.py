"""fracpilot's clients while stream leaders move on a three-node cluster (issue 17).

A leader is moved with ``$JS.API.STREAM.LEADER.STEPDOWN.<stream>`` (and a consumer's with
``$JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>``), as nats-server does when a node
goes away: publishes in flight meanwhile get "no responders" or no answer and are sent again
with their ``Nats-Msg-Id``; a pull request ends with "Leadership Change", or 503 while the
consumer has no leader (which once made the feed think its consumer was deleted, for good);
a KV watch and the decision service's partition leases carry on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import nats
import pytest
from prometheus_client import CollectorRegistry

from factories import decision, sample
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Allocation, FractionDecision, WorkloadRef, utcnow
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import counter, reset_nats, running, wait_for
from support.nats_cluster import NatsCluster, stream_info

pytestmark = pytest.mark.integration

STEP_DOWNS = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster() as c:
        yield c


async def step_down(url: str, subject: str) -> None:
    """Ask for a new leader; a request made while there is none yet is asked again."""
    nc = await nats.connect(url.split(","))
    try:
        for _ in range(50):
            try:
                reply = json.loads((await nc.request(subject, b"", timeout=5)).data)
            except Exception:  # no leader to answer yet
                reply = {}
            if reply.get("success"):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{subject}: no step-down")
    finally:
        await nc.close()


async def wait_for_leader(url: str, stream: str) -> None:
    async def elected() -> bool:
        try:
            return bool(((await stream_info(url, stream)).get("cluster") or {}).get("leader"))
        except Exception:
            return False

    for _ in range(100):
        if await elected():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stream} has no leader")


def allocation(fraction: float) -> Allocation:
    return Allocation(
        workload=WorkloadRef(namespace="inference", owner_name="chat"),
        pod="chat-0",
        node="n",
        gpu_uuid="GPU-0",
        fraction=fraction,
        device_memory_bytes=80 * 2**30,
        updated_at=utcnow(),
    )


async def test_publishes_consumers_and_kv_watches_carry_on_through_leader_moves(
    cluster: NatsCluster,
) -> None:
    await reset_nats(cluster.nodes[0].url)
    settings = ServiceSettings(nats={"url": cluster.url}, decision_partitions=2, ack_wait_s=2)
    bus = Bus("test", settings, CollectorRegistry())
    await bus.connect(retry_for_s=10)
    got: list[str] = []
    seen: dict[str, float] = {}
    sent: list[str] = []
    stop = asyncio.Event()
    try:
        await bus.ensure_streams()

        async def handle(d: FractionDecision, _msg: object) -> None:
            got.append(d.decision_id)

        async def on_update(key: str, value: Allocation | None) -> None:
            if value is not None:
                seen[key] = value.fraction

        await bus.consume(
            stream=subjects.DECISION_STREAM,
            durable="moves",
            filter_subject=f"{subjects.DECISION_PREFIX}.>",
            model=FractionDecision,
            handler=handle,
        )
        initial = await bus.watch_kv(subjects.ALLOCATION_BUCKET, Allocation, on_update)
        await asyncio.wait_for(initial.wait(), timeout=10)
        kv = await bus.kv(subjects.ALLOCATION_BUCKET)

        async def publish() -> None:
            i = 0
            while not stop.is_set():
                made = decision(current=0.5, new=0.75, decision_id=f"d-{i}")
                await bus.publish(subjects.decision_subject(made.workload), made, f"d-{i}")
                sent.append(f"d-{i}")
                i += 1
                await asyncio.sleep(0.01)

        publisher = asyncio.create_task(publish())
        kv_stream = f"KV_{subjects.ALLOCATION_BUCKET}"
        for n in range(STEP_DOWNS):
            await step_down(
                cluster.url, f"$JS.API.STREAM.LEADER.STEPDOWN.{subjects.DECISION_STREAM}"
            )
            await step_down(
                cluster.url,
                f"$JS.API.CONSUMER.LEADER.STEPDOWN.{subjects.DECISION_STREAM}.moves",
            )
            await step_down(cluster.url, f"$JS.API.STREAM.LEADER.STEPDOWN.{kv_stream}")
            await wait_for_leader(cluster.url, kv_stream)
            await kv.put("chat", allocation(0.1 + n / 10).to_json())
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(publisher, timeout=60)
        # Every decision stored once and delivered (one in hand at a move comes again after
        # the ack wait), the watch at the last value.
        await wait_for(lambda: set(got) == set(sent), timeout=30)
        await wait_for(lambda: seen.get("chat") == 0.1 + (STEP_DOWNS - 1) / 10, timeout=15)
        stored = await stream_info(cluster.url, subjects.DECISION_STREAM)
        assert stored["state"]["messages"] == len(sent)
        assert len(sent) > 50
    finally:
        stop.set()
        await bus.close()


async def test_the_partition_leases_keep_working_when_the_kv_leader_moves(
    cluster: NatsCluster,
) -> None:
    await reset_nats(cluster.nodes[0].url)
    settings = DecisionSettings(
        nats={"url": cluster.url},
        replica_id="only",
        decision_partitions=2,
        partition={"lease_s": 4.0},
        checkpoint={"interval_s": 0.2, "when_idle_s": 0},
    )
    service = DecisionService(settings)
    registry = service.runtime.registry
    bus = Bus("feeder", ServiceSettings(nats={"url": cluster.url}), CollectorRegistry())
    async with running(service):
        await bus.connect(retry_for_s=10)
        try:
            await wait_for(lambda: service.ownership is not None, timeout=10)
            assert service.ownership is not None
            await wait_for(lambda: service.ownership.owned == {0, 1}, timeout=20)
            leases = f"KV_{subjects.DECISION_PARTITION_BUCKET}"
            for minute in range(STEP_DOWNS * 3):
                s = sample(minute=minute)
                await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
                if minute % 3 == 0:
                    await step_down(cluster.url, f"$JS.API.STREAM.LEADER.STEPDOWN.{leases}")
                await asyncio.sleep(0.5)
            await asyncio.sleep(settings.partition.lease_s)  # past a lease's whole span
            assert service.ownership.owned == {0, 1}
            assert all(service.ownership.holds(p) for p in (0, 1))
            moves = "fracpilot_decision_partition_moves_total"
            assert counter(registry, moves, move="dropped") == 0
        finally:
            await bus.close()
