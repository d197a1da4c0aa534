"""What waits after a decision was acted on: scale-ups waiting for capacity, recreates waiting
for their replacements. This module only executes; the plans are the judge's
(:func:`~fracpilot_actuator.kube.scale_up_plan.plan_scale_up`,
:func:`~fracpilot_actuator.kube.verification.replacement_verdict`).

- A scale-up's pods move once the judge says they fit (their placeholder was bound on a new
  node, or room appeared): in place, or evicted. An evicted pod's placeholder stays until the
  replacement is bound (make before break), unless the pod fits only on the placeholder's own
  GPU, when it goes right after the eviction. After ``capacity_timeout_s`` without capacity
  the scale-up fails and its placeholders are removed.
- A recreate (:class:`~fracpilot_actuator.kube.verification.PendingRecreate`) is verified:
  APPLIED with what the replacement holds, FAILED after ``verify_timeout_s``, or, born at
  another share, FAILED with the share it has, then corrected (the host's ``correct``).
  Each waiting recreate is saved (:class:`~fracpilot_actuator.stores.ports.PendingRecreates`)
  when it starts and forgotten once its final result is published, so a restarted actuator or
  a new leader (:meth:`ScaleUps.load_recreates`) carries on verifying it.
- While a replacement of ours waits behind KAI's nodescaleadjuster, a scaling pod of it that
  is bound but says ``PodScheduled=False`` is deleted (see docs/backends.md: KAI's scaler
  overwrites the condition kube-scheduler set, and KAI's binder then binds no fraction pod).
  The actuator's RBAC does not grant that delete (a write into KAI's own namespace, which
  may not exist): where it is refused (403) the pod is left, logged once, and named in the
  result; the recreate then ends as verified or as FAILED on its timeout, truthfully either way.

Each end is reported through the host's ``report`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from fracpilot_actuator.actuation import Actuation, Report
from fracpilot_actuator.guardrails import GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement
from fracpilot_actuator.kube.errors import KubeError
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.inventory import Inventory
from fracpilot_actuator.kube.judge import memory_share_mib
from fracpilot_actuator.kube.judgement import actuation_of
from fracpilot_actuator.kube.object_values import KAI_SCALE_ADJUST_NAMESPACE
from fracpilot_actuator.kube.placeholders import PendingScaleUp
from fracpilot_actuator.kube.scale_up_plan import plan_scale_up
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.kube.verification import (
    PendingRecreate,
    recreate_from_record,
    recreate_record,
    replacement_verdict,
    replacements_of,
)
from fracpilot_actuator.stores.memory import MemoryPendingRecreates
from fracpilot_actuator.stores.ports import PendingRecreates, UnreadableHistoryError
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind, WorkloadRef
from fracpilot_libs.placement.planner import ResizePlan

log = logging.getLogger(__name__)


class FollowUpHost(Protocol):
    """What the follow-ups use of the backend that owns them (the backend imports this module,
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
        now: datetime,
        enforcement: Mapping[str, Enforcement] | None = None,
    ) -> None: ...

    async def correct(
        self, decision: FractionDecision, now: datetime, corrections: int
    ) -> Actuation: ...


class ScaleUps:
    """The backend's waiting scale-ups and recreates, by workload key."""

    def __init__(self, backend: FollowUpHost, records: PendingRecreates | None = None) -> None:
        """``records``: where the waiting recreates are saved (None: in memory only)."""
        self.backend = backend
        self.records: PendingRecreates = records or MemoryPendingRecreates()
        self.pending: dict[str, PendingScaleUp] = {}
        self.recreates: dict[str, PendingRecreate] = {}
        self.scaling_pods_forbidden = False  # a delete in kai-scale-adjust was refused (403)

    def waiting(self, key: str) -> bool:
        return key in self.pending or key in self.recreates

    async def wait_for_replacements(self, recreate: PendingRecreate) -> None:
        """Verify the recreate from now on (:meth:`reconcile`), and save it first."""
        self.recreates[recreate.decision.workload.key] = recreate
        await self._save_recreates()

    async def load_recreates(self) -> None:
        """The recreates a previous run (or the previous leader) left waiting, as saved.

        Read whole, then swapped in: while the read awaits, the set held before stays in view
        (a new leader re-reads what its standby read at start; an empty set in between would
        read as "nothing waiting")."""
        try:
            records = await self.records.load()
        except UnreadableHistoryError as exc:
            log.error("pending recreates unreadable: none is verified", exc_info=exc)
            self.recreates.clear()
            return
        loaded: dict[str, PendingRecreate] = {}
        for key, text in records.items():
            try:
                loaded[key] = recreate_from_record(text)
            except ValueError as exc:
                log.error(
                    "a pending recreate is unreadable: dropped",
                    extra={"workload": key},
                    exc_info=exc,
                )
        self.recreates.clear()
        self.recreates.update(loaded)
        if self.recreates:
            log.info("resuming recreates", extra={"workloads": sorted(self.recreates)})

    async def _save_recreates(self) -> None:
        records = {key: recreate_record(r) for key, r in self.recreates.items()}
        try:
            await self.records.save(records)
        except Exception as exc:  # verified all the same, unless this process stops first
            log.warning(
                "pending recreates not saved: a restart would not verify them",
                extra={"error": str(exc)[:300]},
            )

    async def reconcile(self, now: datetime) -> None:
        for key, pending in list(self.pending.items()):
            try:
                await self._advance(pending, now)
            except Exception:
                log.exception("scale-up check failed; trying again", extra={"workload": key})
        for key, recreate in list(self.recreates.items()):
            try:
                await self._verify(recreate, now)
            except Exception:
                log.exception("recreate check failed; trying again", extra={"workload": key})

    # --- scale-ups ----------------------------------------------------------------------------

    async def _advance(self, pending: PendingScaleUp, now: datetime) -> None:
        backend, executor = self.backend, self.backend.executor
        settings = backend.settings
        decision = pending.decision
        view = await backend.observe(decision.workload)
        inventory, live = view.inventory, {p.name: p for p in view.live}
        moves = plan_scale_up(pending, view, now, settings.capacity_timeout_s)
        if any(m.action == "wait" for m in moves):
            return  # all pods move together, once each has room
        if give_up := next((m for m in moves if m.action == "give_up"), None):
            late = (
                f"no GPU with {decision.new_fraction:g} free appeared within "
                f"{settings.capacity_timeout_s:g} s; placeholder removed"
            )
            await executor.event(live[give_up.pod], "CapacityNotAvailable", late, warning=True)
            await self._end_scale_up(pending, Outcome.FAILED, inventory, give_up.step, late)
            return
        known = frozenset(p.uid for p in view.pods)
        evicted: list[tuple[ResizePlan, str]] = []  # (step, node it goes to)
        kept: dict[str, tuple[str, str]] = {}
        done: list[ResizePlan] = []
        for move in moves:
            step = move.step
            if move.action == "gone" or step is None:
                await executor.delete_placeholder(*move.placeholder)
                pending.notes.append(f"{move.pod} is gone; its replacement gets the target")
                continue
            pod = live[move.pod]
            enforced = view.enforcement.get(move.pod, NOT_ENFORCED)
            if step.kind is PlanKind.IN_PLACE:
                memory_mib = memory_share_mib(decision, view)
                error = await executor.resize_in_place(
                    decision, pod, step, memory_mib, now, enforced
                )
                await executor.delete_placeholder(*move.placeholder)
                if error is not None:
                    await self._end_scale_up(pending, Outcome.FAILED, inventory, step, error)
                    return
                pending.notes.append(f"{move.pod} now fits on its GPU: resized in place")
                done.append(step)
            elif step.kind is not PlanKind.NONE:
                where = move.node or inventory.gpu_node(step.gpu_after) or "a node it fits on"
                failure = await executor.evict(decision, pod, step, enforced)
                if failure is not None:
                    await self._end_scale_up(pending, Outcome.FAILED, inventory, step, failure)
                    return
                if move.release_first:  # its placeholder's GPU is the only room
                    await executor.delete_placeholder(*move.placeholder)
                else:
                    kept[move.pod] = move.placeholder
                evicted.append((step, move.node or inventory.gpu_node(step.gpu_after)))
                pending.notes.append(f"capacity appeared on {where}; {move.pod} evicted")
            else:
                await executor.delete_placeholder(*move.placeholder)
        key = decision.workload.key
        self.pending.pop(key, None)
        pending.placeholders.clear()
        if not evicted:
            await backend.publish_allocation(
                decision.workload, inventory, tuple(done), now, view.enforcement
            )
            last = done[-1] if done else None
            await self._report(
                pending.decision,
                actuation_of(inventory, PlanKind.SCALE_UP, last, Outcome.APPLIED, _notes(pending)),
                "verified",
            )
            backend.guards = backend.guards.end(key)
            return
        step, _ = evicted[0]
        await self.wait_for_replacements(
            PendingRecreate(
                decision=decision,
                kind=PlanKind.SCALE_UP,
                step=step,
                node_before=inventory.gpu_node(step.gpu_before),
                evicted=len(evicted),
                known_uids=known,
                started_at=now,
                placeholders=kept,
                notes=list(pending.notes),
            )
        )
        detail = _notes(pending) + "; waiting for the replacement to be bound"
        await self._report(
            decision, pending_result(PlanKind.SCALE_UP, step, inventory, detail), "evicted"
        )

    async def _end_scale_up(
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
        await self._report(
            pending.decision,
            actuation_of(inventory, PlanKind.SCALE_UP, step, outcome, detail, error),
            "finished",
        )

    # --- recreates ------------------------------------------------------------------------------

    async def _verify(self, recreate: PendingRecreate, now: datetime) -> None:
        backend = self.backend
        settings = backend.settings
        decision = recreate.decision
        view = await backend.observe(decision.workload)
        verdict = replacement_verdict(recreate, view, now, settings.verify_timeout_s)
        if verdict.state == "waiting":
            if await self._unstick_scaling_pods(recreate, view):
                await self._save_recreates()  # its notes
            return
        new, step = verdict.replacement, recreate.step
        stage = f"verified-{recreate.corrections}" if recreate.corrections else "verified"
        notes = "; ".join(recreate.notes)
        failed = Actuation(
            plan=recreate.kind,
            outcome=Outcome.FAILED,
            detail=f"{notes}; {verdict.reason}",
            fraction_before=step.fraction_before,
            fraction_after=step.fraction_before,
            node_before=recreate.node_before,
            gpu_before=step.gpu_before,
            error=verdict.reason,
        )
        # The final result is published before the recreate is forgotten: a crash in between
        # publishes it again after the restart (the same message id), never not at all.
        if new is None:  # timed out: nothing bound to report
            await self._report(decision, failed, stage)
            await self._forget(recreate)
            return
        # What the replacement holds, as read from it (never the plan's values).
        real = replace(
            failed,
            fraction_after=new.fraction,
            node_after=new.node,
            gpu_after=new.gpu,
            enforced_fraction=new.enforced,
        )
        if verdict.state == "verified":
            moved = tuple(
                step.model_copy(update={"pod": p.name, "gpu_after": p.share.gpu_uuid})
                for p in replacements_of(recreate, view)
                if p.share is not None
            )
            await backend.publish_allocation(
                decision.workload, view.inventory, moved, now, view.enforcement
            )
            await self._report(decision, replace(real, outcome=Outcome.APPLIED, error=None), stage)
            await self._forget(recreate)
            return
        # Born at another share: say what it holds, then correct it (within the budget).
        await self._report(decision, real, stage)
        await self._forget(recreate)
        if recreate.corrections >= settings.corrections:
            return
        corrected = await backend.correct(decision, now, recreate.corrections + 1)
        await self._report(decision, corrected, f"correction-{recreate.corrections + 1}")

    async def _forget(self, recreate: PendingRecreate) -> None:
        """The recreate's final result is out: its placeholders go, and so does its record."""
        backend = self.backend
        for namespace, placeholder in recreate.placeholders.values():
            await backend.executor.delete_placeholder(namespace, placeholder)
        key = recreate.decision.workload.key
        self.recreates.pop(key, None)
        backend.guards = backend.guards.end(key)
        await self._save_recreates()

    async def _unstick_scaling_pods(self, recreate: PendingRecreate, view: ClusterView) -> bool:
        """Delete a KAI scaling pod made for one of our waiting replacements that is bound yet
        says PodScheduled=False (docs/backends.md): the binder waits for it forever otherwise.
        Whether one was deleted."""
        namespace = KAI_SCALE_ADJUST_NAMESPACE
        deleted = False
        for pod in replacements_of(recreate, view):
            if pod.node:
                continue
            name = f"{pod.namespace}-{pod.name}"  # scalingPodName (KAI scaler/scaling_pod.go)
            scaling = await self.backend.executor.api.read_pod(namespace, name)
            if scaling is not None and stuck_scaling_pod(scaling):
                if self.scaling_pods_forbidden:
                    continue
                log.warning(
                    "KAI scaling pod bound but marked unschedulable: deleting it",
                    extra={"scaling_pod": f"{namespace}/{name}", "for": pod.key},
                )
                try:
                    await self.backend.executor.api.delete_pod(namespace, name)
                except KubeError as exc:
                    if exc.status != 403:
                        raise
                    self.scaling_pods_forbidden = True  # said once; not asked again
                    log.warning(
                        "may not delete KAI's stuck scaling pods (403): their replacements may "
                        "wait until the verify timeout; grant delete on pods in "
                        f"{namespace} to the actuator to have them deleted (docs/backends.md)",
                        extra={"scaling_pod": f"{namespace}/{name}", "error": exc.message},
                    )
                    recreate.notes.append(
                        f"KAI's stuck scaling pod {namespace}/{name} not deleted: forbidden"
                    )
                    return True
                recreate.notes.append(
                    f"deleted KAI's stuck scaling pod {namespace}/{name} (bound, yet "
                    "PodScheduled=False: KAI's binder waits for it)"
                )
                deleted = True
        return deleted

    async def _report(self, decision: FractionDecision, actuation: Actuation, stage: str) -> None:
        await self.backend.report(decision, _staged(actuation, stage))


def stuck_scaling_pod(raw: Mapping[str, Any]) -> bool:
    """Bound to a node, yet its PodScheduled condition is not True (KAI's scaler wrote False
    over the True kube-scheduler set: ``CreateScalingPod`` patches the status after create)."""
    if not (raw.get("spec") or {}).get("nodeName"):
        return False
    conditions = (raw.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("status") != "True" for c in conditions)


def _staged(actuation: Actuation, stage: str) -> Actuation:
    return replace(actuation, stage=stage)


def _notes(pending: PendingScaleUp) -> str:
    return "; ".join(pending.notes)


def pending_result(
    kind: PlanKind, step: ResizePlan | None, inventory: Inventory, detail: str
) -> Actuation:
    """PENDING: acted on, not verified yet; says where the pod was, not where it will be."""
    if step is None:
        return Actuation(plan=kind, outcome=Outcome.PENDING, detail=detail)
    return Actuation(
        plan=kind,
        outcome=Outcome.PENDING,
        detail=detail,
        fraction_before=step.fraction_before,
        fraction_after=step.fraction_before,
        node_before=inventory.gpu_node(step.gpu_before),
        gpu_before=step.gpu_before,
    )
