"""The in-memory stores behind the actuator's ports: what is put is what is got."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from factories import workload
from fracpilot_actuator.guardrails import Disruption
from fracpilot_actuator.stores.memory import (
    MemoryAllocationStore,
    MemoryDisruptionHistory,
    MemoryTargetStore,
)
from fracpilot_actuator.stores.ports import AllocationStore, DisruptionHistory, TargetStore
from fracpilot_libs.contracts import Allocation, GpuSharing, WorkloadTarget
from fracpilot_libs.nats import subjects

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def target(name: str, fraction: float, decision_id: str = "d-1") -> WorkloadTarget:
    return WorkloadTarget(
        workload=workload(name),
        fraction=fraction,
        memory_mib=int(fraction * 81920),
        backend=GpuSharing.KAI,
        decision_id=decision_id,
        updated_at=T0,
    )


def test_the_target_store_keeps_one_target_per_workload() -> None:
    async def run() -> None:
        store: TargetStore = MemoryTargetStore()
        assert await store.get(workload("chat")) is None
        await store.put(target("chat", 0.25))
        await store.put(target("chat", 0.5, "d-2"))
        await store.put(target("embed", 0.125))
        got = await store.get(workload("chat"))
        assert got is not None
        assert (got.fraction, got.decision_id) == (0.5, "d-2")

    asyncio.run(run())


def test_the_disruption_history_is_none_until_saved_then_what_was_saved() -> None:
    async def run() -> None:
        fake = MemoryDisruptionHistory()
        history: DisruptionHistory = fake
        assert await history.load() is None
        recent = (Disruption("w", "ns", T0), Disruption("v", "other", T0))
        await history.save(recent)
        await history.save(recent[:1])
        assert await history.load() == recent[:1]
        assert fake.saves == 2

    asyncio.run(run())


def test_the_allocation_store_keeps_the_last_allocation_per_workload_key() -> None:
    async def run() -> None:
        fake = MemoryAllocationStore()
        store: AllocationStore = fake
        for pod, fraction in (("chat-0", 0.25), ("chat-1", 0.5)):
            await store.put(
                Allocation(
                    workload=workload("chat"),
                    pod=pod,
                    node="n1",
                    gpu_uuid="GPU-1",
                    fraction=fraction,
                    device_memory_bytes=80 * 2**30,
                    updated_at=T0,
                )
            )
        assert list(fake.allocations) == [subjects.kv_key(workload("chat"))]
        assert fake.allocations[subjects.kv_key(workload("chat"))].pod == "chat-1"

    asyncio.run(run())
