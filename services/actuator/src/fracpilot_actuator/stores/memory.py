"""In-memory implementations of the ports in :mod:`fracpilot_actuator.stores.ports`: production
stores for running without NATS (the Kubernetes backend keeps its disruption history here when
given no bucket), and the stores the tests use. What is put is what is got; nothing survives
the process.
"""

from __future__ import annotations

from collections.abc import Mapping

from fracpilot_actuator.guardrails import Disruption
from fracpilot_libs.contracts import Allocation, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects


class MemoryTargetStore:
    def __init__(self) -> None:
        self.targets: dict[str, WorkloadTarget] = {}  # by subjects.kv_key(workload)

    async def get(self, workload: WorkloadRef) -> WorkloadTarget | None:
        return self.targets.get(subjects.kv_key(workload))

    async def put(self, target: WorkloadTarget) -> None:
        self.targets[subjects.kv_key(target.workload)] = target


class MemoryDisruptionHistory:
    def __init__(self, recent: tuple[Disruption, ...] | None = None) -> None:
        self.recent = recent
        self.saves = 0

    async def load(self) -> tuple[Disruption, ...] | None:
        return self.recent

    async def save(self, recent: tuple[Disruption, ...]) -> None:
        self.recent = recent
        self.saves += 1


class MemoryAllocationStore:
    def __init__(self) -> None:
        self.allocations: dict[str, Allocation] = {}  # by subjects.kv_key(workload)

    async def put(self, allocation: Allocation) -> None:
        self.allocations[subjects.kv_key(allocation.workload)] = allocation


class MemoryPendingRecreates:
    def __init__(self, records: Mapping[str, str] | None = None) -> None:
        self.records: dict[str, str] = dict(records or {})
        self.saves = 0

    async def load(self) -> dict[str, str]:
        return dict(self.records)

    async def save(self, records: Mapping[str, str]) -> None:
        self.records = dict(records)
        self.saves += 1


class MemoryConsolidationProgress:
    def __init__(self, text: str = "") -> None:
        self.text = text
        self.saves = 0

    async def load(self) -> str:
        return self.text

    async def save(self, text: str) -> None:
        self.text = text
        self.saves += 1
