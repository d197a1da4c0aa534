"""Scale-ups waiting for capacity: move each pod once a GPU is there, give up on time.

A scale-up's pods move (in place when they now fit on their GPU, else evicted) once their
placeholder was scheduled or the pod fits somewhere; after ``capacity_timeout_s`` without
capacity the scale-up fails and its placeholders are removed. The end is reported through the
backend's ``report`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Protocol

from fracpilot_actuator.actuation import Report
from fracpilot_actuator.guardrails import GuardState
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement, must_recreate
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.hami import fit_rule
from fracpilot_actuator.kube.inventory import Inventory
from fracpilot_actuator.kube.judge import ClusterView, actuation_of, memory_share_mib
from fracpilot_actuator.kube.placeholders import PendingScaleUp
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_libs.contracts import GpuSharing, Outcome, PlanKind, WorkloadRef
from fracpilot_libs.placement.planner import ResizePlan, apply_pod_plan, plan_pod

log = logging.getLogger(__name__)


class ScaleUpHost(Protocol):
    """What the scale-ups use of the backend that owns them (the backend imports this module,
    so naming the backend's class here would be an import circle)."""

    settings: KubeBackendSettings
    executor: StepExecutor
    guards: GuardState
    report: Report

    async def observe(self, workload: WorkloadRef) -> ClusterView: ...

    async def publish_allocation(
        self,
        workload: WorkloadRef,
        inventory: Inventory,
        steps: tuple[ResizePlan, ...],
        enforcement: Mapping[str, Enforcement] | None = None,
    ) -> None: ...


class ScaleUps:
    """The backend's waiting scale-ups, by workload key."""

    def __init__(self, backend: ScaleUpHost) -> None:
        self.backend = backend
        self.pending: dict[str, PendingScaleUp] = {}

    async def reconcile(self, now: datetime) -> None:
        for key, pending in list(self.pending.items()):
            try:
                await self._advance(pending, now)
            except Exception:
                log.exception("scale-up check failed; trying again", extra={"workload": key})

    async def _advance(self, pending: PendingScaleUp, now: datetime) -> None:
        backend, executor = self.backend, self.backend.executor
        settings = backend.settings
        decision = pending.decision
        view = await backend.observe(decision.workload)
        inventory = view.inventory
        live = {p.name: p for p in view.live}
        placements = {p.pod: p for p in inventory.placements_of(view.live)}
        bound = {(p.namespace, p.name): p.node for p in inventory.placeholders if p.node}
        timed_out = now - pending.started_at > timedelta(seconds=settings.capacity_timeout_s)
        state, last = inventory.state, None
        done: list[ResizePlan] = []
        for pod_name, (namespace, placeholder) in list(pending.placeholders.items()):
            pod, placement = live.get(pod_name), placements.get(pod_name)
            if pod is not None and placement is not None:
                node_ok_for = inventory.node_ok_for(pod.backend)
                step = plan_pod(
                    state,
                    placement,
                    decision.new_fraction,
                    # an upsize past an enforced limit is a recreate (enforcement.py)
                    in_place=pod.backend is GpuSharing.KAI
                    and not must_recreate(view.enforcement.get(pod_name, NOT_ENFORCED), decision),
                    fit=fit_rule(pod.backend, inventory.hami_memory_factor),
                    node_ok=node_ok_for(placement, state) if node_ok_for else None,
                )
                node = bound.get((namespace, placeholder))
                if step.kind is PlanKind.SCALE_UP and node is None:  # no capacity yet
                    if not timed_out:
                        continue
                    error = (
                        f"no GPU with {decision.new_fraction:g} free appeared within "
                        f"{settings.capacity_timeout_s:g} s; placeholder removed"
                    )
                    await executor.event(pod, "CapacityNotAvailable", error, warning=True)
                    await self._finish(pending, Outcome.FAILED, inventory, step, error)
                    return
                state, last = apply_pod_plan(state, step), step
                done.append(step)
            # Free the placeholder's GPU first: the recreated pod is to take it.
            await executor.delete_placeholder(namespace, placeholder)
            pending.placeholders.pop(pod_name)
            if pod is None or placement is None:
                pending.notes.append(f"{pod_name} is gone; its replacement gets the target")
            elif step.kind is PlanKind.IN_PLACE:
                memory_mib = memory_share_mib(decision, view)
                enforced = view.enforcement.get(pod_name, NOT_ENFORCED)
                await executor.resize_in_place(decision, pod, step, memory_mib, now, enforced)
                pending.notes.append(f"{pod_name} now fits on its GPU: resized in place")
            elif step.kind is not PlanKind.NONE:
                where = node or inventory.gpu_node(step.gpu_after) or "a node the scheduler found"
                failure = await executor.evict(
                    decision, pod, step, view.enforcement.get(pod_name, NOT_ENFORCED)
                )
                if failure is not None:
                    await self._finish(pending, Outcome.FAILED, inventory, step, failure)
                    return
                pending.notes.append(f"capacity appeared on {where}; {pod_name} evicted")
        if not pending.placeholders:
            await backend.publish_allocation(
                decision.workload, inventory, tuple(done), view.enforcement
            )
            await self._finish(pending, Outcome.APPLIED, inventory, last, None)

    async def _finish(
        self,
        pending: PendingScaleUp,
        outcome: Outcome,
        inventory: Inventory,
        step: ResizePlan | None,
        error: str | None,
    ) -> None:
        backend = self.backend
        for namespace, placeholder in pending.placeholders.values():
            await backend.executor.delete_placeholder(namespace, placeholder)
        key = pending.decision.workload.key
        self.pending.pop(key, None)
        backend.guards = backend.guards.end(key)
        detail = "; ".join([*pending.notes, *([error] if error else [])])
        await backend.report(
            pending.decision,
            actuation_of(inventory, PlanKind.SCALE_UP, step, outcome, detail, error),
        )
