"""The recovery mechanisms the chaos scenarios rely on, each shown on its own (fast).

- A KV watch keeps following its bucket after nats-server is SIGKILLed and restarted on its
  store (a watcher is an ephemeral consumer the restarted server has forgotten), and a publish
  made while the server is down goes through once it is back.
- A service's /readyz follows its NATS connection: 503 while the server is gone, 200 again
  once it reconnects.
- The simulated cluster records the decisions it executed in the same write as the change: an
  actuator that executed a decision and died before recording it done does not execute it
  again when the decision comes back.

Each on a secured bus, as the chart's default is (issue 29): deploy/nats's configuration with
TLS, every client under the identity whose part it plays (the follower of the allocations is
ingest, their writer the actuator, the redelivered decision comes from decision, the reader of
the evidence is the operator).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from chaos.faults import readyz
from factories import decision
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    Outcome,
    UsageSample,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.runtime import ServiceRuntime
from helpers import connect, read_stream, read_usage, running, wait_for
from support.nats_auth import IDENTITIES, SecuredNats, chart_tls_files

pytestmark = pytest.mark.chaos


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SecuredNats]:
    """The secured bus; afterwards, no identity may have lacked a permission."""
    bus = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls")).start()
    try:
        yield bus
        lacked = {name: bus.violations(name) for name in IDENTITIES}
    finally:
        bus.cleanup()
    assert lacked == {name: [] for name in IDENTITIES}, "an identity lacked a permission"


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


async def test_kv_watch_and_publishes_carry_on_across_a_nats_restart(server: SecuredNats) -> None:
    bus = Bus("test", server.settings("ingest"), CollectorRegistry())
    try:
        await bus.connect(retry_for_s=5)
        await bus.ensure_streams()
        seen: dict[str, float] = {}

        async def on_update(key: str, value: Allocation | None) -> None:
            if value is not None:
                seen[key] = value.fraction

        writer = await connect(server.settings("actuator"))
        kv = await writer.jetstream().create_key_value(bucket=subjects.ALLOCATION_BUCKET)
        await kv.put("a", allocation(0.5).to_json())
        await writer.close()
        initial = await bus.watch_kv(subjects.ALLOCATION_BUCKET, Allocation, on_update)
        await asyncio.wait_for(initial.wait(), timeout=10)
        await wait_for(lambda: seen.get("a") == 0.5)

        server.stop(kill=True)
        await wait_for(lambda: not bus.connected, timeout=10)
        sample = UsageSample.model_validate_json(
            json.dumps(
                {
                    "sample_id": "s-1",
                    "workload": {"namespace": "inference", "owner_name": "chat"},
                    "pod": "chat-0",
                    "timestamp": "2026-03-02T00:00:00Z",
                    "compute": 0.1,
                    "memory_used_bytes": 1,
                    "memory_total_bytes": 2,
                    "source": "test",
                }
            )
        )
        publishing = asyncio.create_task(
            bus.publish(subjects.usage_subject(sample.workload), sample, sample.sample_id)
        )
        await asyncio.sleep(1.0)
        assert not publishing.done()  # waiting for the server, not failed
        server.start()
        assert await asyncio.wait_for(publishing, timeout=30) is True

        await wait_for(lambda: bus.reconnects >= 1, timeout=15)
        writer = await connect(server.settings("actuator"))
        other = await writer.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        await other.put("a", allocation(0.75).to_json())
        await writer.close()
        await wait_for(lambda: seen.get("a") == 0.75, timeout=10)
        assert [s for s, _ in await read_usage(server.settings("operator"))]
    finally:
        await bus.close()
        server.cleanup()


async def test_readiness_follows_the_nats_connection(server: SecuredNats) -> None:
    runtime = ServiceRuntime("test", server.settings("decision"))

    async def start() -> None:
        return None

    task = asyncio.create_task(runtime.run(start, install_signals=False))
    try:
        await wait_for(lambda: runtime.health.ready, timeout=15)
        port = runtime.http.port
        assert await asyncio.to_thread(readyz, port)
        server.stop(kill=True)
        await wait_for(lambda: not runtime.health.ready, timeout=10)
        assert not await asyncio.to_thread(readyz, port)
        assert runtime.health.reason == "NATS connection lost"
        server.start()
        await wait_for(lambda: runtime.health.ready, timeout=15)
        assert await asyncio.to_thread(readyz, port)
    finally:
        runtime.stop_requested.set()
        await asyncio.wait_for(task, timeout=30)
        server.cleanup()


async def test_an_executed_decision_is_not_executed_again_after_a_crash(
    server: SecuredNats,
) -> None:
    settings = ActuatorSettings(
        **server.identity("actuator"),
        # opted in: the decision is applied (once)
        sim={
            "pods": "inference/chat=0.5",
            "cluster": "test",
            "namespace_labels": {"inference": {"fracpilot.io/mode": "auto"}},
        },
        ack_wait_s=2,
    )
    made = decision(current=0.5, new=0.75, decision_id="d-crash")
    try:
        async with running(ActuatorService(settings)) as service:
            nc = await connect(server.settings("decision"))  # the decision, from decision
            await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
            await wait_for(lambda: service.cluster.has_applied("d-crash"), timeout=15)
            # As if the actuator had died right after changing the cluster: the record of the
            # decision says "started", and the decision is delivered again.
            as_actuator = await connect(server.settings("actuator"))  # its own record
            claims = await as_actuator.jetstream().key_value(subjects.ACTUATOR_STATE_BUCKET)
            await asyncio.sleep(0.5)  # its own "done" record is written by now
            await claims.put("decision.d-crash", b"started")
            before = service.cluster.state
            await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())

            async def record() -> bytes:
                return (await claims.get("decision.d-crash")).value or b""

            deadline = time.monotonic() + 15
            while await record() == b"started":
                assert time.monotonic() < deadline, "the decision was not handled again"
                await asyncio.sleep(0.1)
            assert service.cluster.state == before  # nothing executed a second time
            assert service.cluster.applied.count("d-crash") == 1
            assert service.resumed._value.get() == 1  # type: ignore[attr-defined]
            await nc.close()
            await as_actuator.close()
        results = [
            ActuationResult.model_validate_json(d)
            for _, d in await read_stream(server.settings("operator"), subjects.ACTUATION_STREAM)
        ]
    finally:
        server.cleanup()
    assert [r.outcome for r in results if r.decision_id == "d-crash"] == [Outcome.APPLIED]
