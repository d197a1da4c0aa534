"""The workload's ``Allocation`` once a plan's steps are done: where its pod runs, the share
KAI or HAMi counts and the share its memory limit enforces. Pure.

What ingest reads back from the allocations bucket, as the simulated cluster writes it; the
backend (:meth:`~fracpilot_actuator.kube.backend.KubernetesBackend.publish_allocation`) puts
it in the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement, enforced_after
from fracpilot_actuator.kube.inventory import Inventory
from fracpilot_libs.contracts import Allocation, PlanKind, WorkloadRef
from fracpilot_libs.placement.planner import ResizePlan, allocation_for


def allocation_of(
    workload: WorkloadRef, inventory: Inventory, steps: tuple[ResizePlan, ...], now: datetime
) -> Allocation | None:
    """The workload's Allocation, where its pods are once the steps are done.

    For the first pod by name among those that keep their name (in place or unchanged), else
    the first evicted one (its replacement's name is not known yet). A pod whose GPU is not
    known yet (a scale-up's) has no record."""
    known = [s for s in steps if s.gpu_after and inventory.state.gpu(s.gpu_after)]
    kept = [s for s in known if s.kind in (PlanKind.IN_PLACE, PlanKind.NONE)]
    step = min(kept or known, key=lambda s: s.pod, default=None)
    gpu = inventory.state.gpu(step.gpu_after) if step is not None else None
    if step is None or gpu is None:
        return None
    return allocation_for(workload, step.pod, gpu, step.fraction_after, now)


def enforced_allocation(
    workload: WorkloadRef,
    inventory: Inventory,
    steps: tuple[ResizePlan, ...],
    now: datetime,
    enforcement: Mapping[str, Enforcement] | None = None,
) -> Allocation | None:
    """:func:`allocation_of`, with the share its pod's memory limit enforces once its step is
    done (``enforcement``: by pod, as the judge read it; a pod not in it is not enforced)."""
    allocation = allocation_of(workload, inventory, steps, now)
    if allocation is None:
        return None
    step = next(s for s in steps if s.pod == allocation.pod)
    e = (enforcement or {}).get(step.pod, NOT_ENFORCED)
    enforced = enforced_after(step, e, applied=True)
    return allocation.model_copy(update={"enforced_fraction": enforced})
