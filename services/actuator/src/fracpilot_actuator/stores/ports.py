"""What the Kubernetes backend stores outside the cluster, as ports (``typing.Protocol``).

- :class:`TargetStore`: each workload's :class:`WorkloadTarget` (the admission webhook and
  pod-template patches size new pods from it);
- :class:`DisruptionHistory`: the recent disruptive actions, so the rate guardrail holds
  across restarts and leader changes;
- :class:`AllocationStore`: where a workload's pod runs once an action is done, for ingest;
- :class:`PendingRecreates`: the recreates waiting for their replacements, so a restarted
  actuator or a new leader still verifies them and publishes their final results;
- :class:`ConsolidationProgress`: the node or card being emptied and its move in flight, so a
  new leader goes on with the plan rather than re-planning.

The NATS KV adapters are in :mod:`fracpilot_actuator.stores.nats_kv`, in-memory stores (for
running without NATS, and for tests) in :mod:`fracpilot_actuator.stores.memory`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from fracpilot_actuator.guardrails import Disruption
from fracpilot_libs.contracts import Allocation, WorkloadRef, WorkloadTarget


class UnreadableHistoryError(ValueError):
    """The stored disruption history (the rate guardrail then fails safe), or the stored
    pending recreates, cannot be read."""


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


class PendingRecreates(Protocol):
    """The recreates waiting to be verified, one record (JSON text, written and read by
    :mod:`fracpilot_actuator.kube.verification`) per workload key. The leader's in-memory
    records are the truth while it leads; they are saved whole at each change."""

    async def load(self) -> dict[str, str]:
        """The saved records; empty when none were saved. Raises
        :class:`UnreadableHistoryError` when what is stored cannot be read."""

    async def save(self, records: Mapping[str, str]) -> None: ...


class ConsolidationProgress(Protocol):
    """The node or card consolidation is emptying, with its move in flight: one JSON text
    (written and read by :mod:`fracpilot_actuator.kube.consolidation_progress`), saved whole at
    each change; "" when nothing is in flight."""

    async def load(self) -> str:
        """The saved text; "" when none was saved."""

    async def save(self, text: str) -> None: ...
