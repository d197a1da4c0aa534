"""What the Kubernetes backend stores outside the cluster, as ports (``typing.Protocol``).

- :class:`TargetStore`: each workload's :class:`WorkloadTarget` (the admission webhook and
  pod-template patches size new pods from it);
- :class:`DisruptionHistory`: the recent disruptive actions, so the rate guardrail holds
  across restarts and leader changes;
- :class:`AllocationStore`: where a workload's pod runs once an action is done, for ingest.

The NATS KV adapters are in :mod:`fracpilot_actuator.stores.nats_kv`, in-memory stores (for
running without NATS, and for tests) in :mod:`fracpilot_actuator.stores.memory`.
"""

from __future__ import annotations

from typing import Protocol

from fracpilot_actuator.guardrails import Disruption
from fracpilot_libs.contracts import Allocation, WorkloadRef, WorkloadTarget


class UnreadableHistoryError(ValueError):
    """The stored disruption history cannot be read (the rate guardrail then fails safe)."""


class TargetStore(Protocol):
    async def get(self, workload: WorkloadRef) -> WorkloadTarget | None:
        """The workload's recorded target; None when there is none or it cannot be read."""

    async def put(self, target: WorkloadTarget) -> None: ...


class DisruptionHistory(Protocol):
    async def load(self) -> tuple[Disruption, ...] | None:
        """The recorded disruptions; None when none were ever saved.

        Raises :class:`UnreadableHistoryError` when what is stored cannot be read."""

    async def save(self, recent: tuple[Disruption, ...]) -> None: ...


class AllocationStore(Protocol):
    async def put(self, allocation: Allocation) -> None:
        """Record where the allocation's workload runs (one record per workload)."""
