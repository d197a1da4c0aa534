"""Shared isolation's I/O: the co-tenants' facts before the judge, their re-division after it.

The judge (:func:`fracpilot_actuator.kube.card_plan.plan_card`) divides a card among its
tenants; it needs, for each pod on the deciding pod's GPU in its namespace, the pod's
workload, that workload's last forecast (:class:`~fracpilot_actuator.stores.forecasts.
ForecastBook`, fed by every decision) and whether its workload object opts out
(:meth:`SharedCards.facts`). The executor's steps change the deciding workload's pods; the
co-tenants' new shares are patched here (:func:`redivide`), each conditional on the pod as
read, read back, and explained by a ``FractionRedivided`` Event on the pod: shrinking ones
before the deciding pod's step, growing ones after it, so that the card's fractions never
sum above 1.0 in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import Fence
from fracpilot_actuator.kube.cluster_view import ClusterView, CoTenant
from fracpilot_actuator.kube.errors import KubeError
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.judgement import ActuationPlan
from fracpilot_actuator.kube.object_values import (
    DECISION_ID,
    KAI_FRACTION,
    RESIZED_AT,
    is_opted_out,
)
from fracpilot_actuator.stores.forecasts import ForecastBook
from fracpilot_libs.contracts import FractionDecision, GpuSharing, WorkloadRef
from fracpilot_libs.owners import top_owner

log = logging.getLogger(__name__)
REDIVISION = "co-tenant re-division"  # patch_share's purpose for a decision's co-tenants
CONSOLIDATION_SHRINK = "consolidation shrink"  # ... for a tenant shrunk to make room for a move


class SharedCards:
    """The forecasts of the decisions seen, and the co-tenants' facts for one decision."""

    def __init__(self, api: KubeApi, book: ForecastBook | None = None) -> None:
        self.api = api
        self.book = book or ForecastBook()

    async def facts(
        self, view: ClusterView, decision: FractionDecision, now: datetime
    ) -> ClusterView:
        """The view with its co-tenants' facts (only for a one-pod KAI workload whose
        decision has a forecast: the others are sized per pod)."""
        self.book.record(decision)
        live = view.live
        if len(live) != 1 or decision.forecast is None or live[0].backend is not GpuSharing.KAI:
            return view
        me, share = live[0], live[0].share
        if share is None:
            return view
        wl = decision.workload
        found: dict[str, CoTenant] = {}
        for placement in view.inventory.state.placements:
            pod = view.inventory.pods.get(placement.pod_key)
            if placement.gpu_uuid != share.gpu_uuid or pod is None or pod.key == me.key:
                continue
            if pod.namespace != wl.namespace:  # never changed from another namespace
                continue
            kind, name = top_owner(pod.namespace, pod.controller, view.owners, pod.name)
            ref = WorkloadRef(
                cluster=wl.cluster, namespace=pod.namespace, owner_kind=kind, owner_name=name
            )
            known = self.book.get((pod.namespace, kind, name), now)
            opted_out = False
            if known is not None and kind != "Pod":
                opted_out = await self._owner_opted_out(ref)
            found[pod.key] = CoTenant(ref, known, opted_out)
        return replace(view, co_tenants=found)

    async def _owner_opted_out(self, ref: WorkloadRef) -> bool:
        """Whether the workload object opts out; one that cannot be read counts as opted out
        (its pods are then left as they are)."""
        try:
            owner = await self.api.read_owner(ref.namespace, ref.owner_kind, ref.owner_name)
        except Exception as exc:
            log.warning(
                "co-tenant's workload not read: its pods keep their shares",
                extra={"workload": ref.key, "error": str(exc)[:300]},
            )
            return True
        return owner is not None and is_opted_out(owner)


async def redivide(
    executor: StepExecutor,
    fence: Callable[[Fence], None],
    chosen: ActuationPlan,
    now: datetime,
    *,
    shrinking: bool,
) -> tuple[list[str], str | None]:
    """Patch the co-tenants that shrink (``shrinking``) or grow; (notes, the first error of
    a shrink: the deciding pod must not grow into room that was not freed). A grow that fails
    is noted and logged: the co-tenant keeps less than its share, never more."""
    decision = chosen.decision
    notes: list[str] = []
    for r in chosen.redivision:
        if r.shrinks != shrinking:
            continue
        pod, step = r.pod, r.step
        error = await patch_share(
            executor,
            fence,
            pod,
            step.fraction_before,
            step.fraction_after,
            step.reason,
            decision_id=decision.decision_id,
            now=now,
            purpose=REDIVISION,
        )
        if error is not None:
            if shrinking:
                return notes, error
            notes.append(error)
            continue
        notes.append(
            f"co-tenant {pod.key} re-divided in place {step.fraction_before:g} -> "
            f"{step.fraction_after:g}"
        )
    return notes, None


def share_change_failed(purpose: str, reason: str, pod: str, value: str, error: str) -> str:
    """What an in-place ``gpu-fraction`` change that did not take says: what it was for (the
    ``purpose``, else the change's ``reason``), the pod, the value and the error."""
    doing = purpose or f"in-place GPU share change ({reason})"
    return f"{doing} of {pod} to {KAI_FRACTION}={value} failed: {error}"


async def patch_share(
    executor: StepExecutor,
    fence: Callable[[Fence], None],
    pod: PodInfo,
    before: float | None,
    after: float,
    reason: str,
    *,
    now: datetime,
    decision_id: str = "",
    purpose: str = "",
) -> str | None:
    """Set a KAI pod's accounted ``gpu-fraction`` in place (shared isolation: scheduler
    accounting only, no restart): a patch conditional on the pod as read, read back, and a
    ``FractionRedivided`` Event on the pod (``FractionRedivideFailed`` and the error when it
    did not take). Used by a decision's card re-division and by consolidation's shrinks.

    ``purpose``: what the change is for, as the failure names it ("co-tenant re-division",
    "consolidation shrink"); "" names the change by ``reason``. The error returned (None when
    it took) says what was being done, so that a caller's own message need not guess."""
    api = executor.api
    value = f"{after:g}"
    annotations = {KAI_FRACTION: value, RESIZED_AT: now.isoformat()}
    if decision_id:
        annotations[DECISION_ID] = decision_id
    try:
        version = await api.patch_pod_annotations(
            pod.namespace,
            pod.name,
            annotations,
            resource_version=pod.resource_version,
            uid=pod.uid,
        )
        fence(Fence("pods", version, None if version else (pod.namespace, pod.name)))
        raw = await api.read_pod(pod.namespace, pod.name)
        held = str(
            (((raw or {}).get("metadata") or {}).get("annotations") or {}).get(KAI_FRACTION, "")
        )
        error = None if held == value else f"read back {KAI_FRACTION}={held or 'nothing'}"
    except KubeError as exc:
        error = f"refused ({exc.status}): {exc.message}"
    if error is not None:
        error = share_change_failed(purpose, reason, pod.key, value, error)
        await executor.event(pod, "FractionRedivideFailed", error, warning=True)
        log.warning("in-place share change failed", extra={"pod": pod.key, "error": error})
        return error
    was = "?" if before is None else f"{before:g}"
    await executor.event(
        pod,
        "FractionRedivided",
        f"GPU share {was} -> {after:g} in KAI's accounting (memory not enforced: the "
        f"container is not limited by it): {reason}",
    )
    return None
