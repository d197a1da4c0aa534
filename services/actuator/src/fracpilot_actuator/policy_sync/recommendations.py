"""Each workload's last decision as a ``FractionRecommendation`` object, for ``kubectl get``.

The leader actuator hands every result it reports (:meth:`DecisionHandler.report`, applied or
held back: recommend mode, not opted in, dry-run) to :meth:`RecommendationWriter.offer`, which
never blocks the decision path: the latest result per workload waits in memory and a task
writes it. A write is a merge patch of the object's status; when the object is not there
(404), the workload is read for its uid and the object is created with an ownerReference to
it, then its status is patched. A workload that is gone gets no object; the object of one
deleted later is deleted by Kubernetes' garbage collector (the ownerReference). Why an object
of its own and not an annotation on the workload: :mod:`fracpilot_libs.kube.recommendation_crd`.

The calls (deploy/rbac/actuator.yaml): create ``fractionrecommendations``, patch
``fractionrecommendations/status``; the owner's uid with the reads the backend already has
(:meth:`KubeApi.read_owner`, :meth:`KubeApi.read_pod`).

:func:`status_of` and :func:`new_object` are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_libs.contracts import FractionDecision
from fracpilot_libs.deadlines import event_set
from fracpilot_libs.kube.client import in_thread
from fracpilot_libs.kube.policy_crd import GROUP, VERSION
from fracpilot_libs.kube.recommendation_crd import KIND, MANAGED_BY, PLURAL, object_name

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
API_VERSION = f"{GROUP}/{VERSION}"
# The API version of each kind a workload can be (fracpilot_libs.owners: where a pod's owner
# chain ends), for the ownerReference.
OWNER_API_VERSIONS: Mapping[str, str] = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "Pod": "v1",
}
Key = tuple[str, str]  # namespace, object name


def _time(decision: FractionDecision) -> str:
    return decision.decided_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_of(decision: FractionDecision, actuation: Actuation) -> dict[str, Any]:
    """The object's status after this result. Every field is there, None when unknown, so
    that a merge patch clears what an older decision said and this one does not."""
    d, forecast = decision, decision.forecast
    return {
        "target": f"{d.workload.owner_kind}/{d.workload.owner_name}",
        "cluster": d.workload.cluster,
        "currentFraction": d.current_fraction,
        "recommendedFraction": d.new_fraction,
        "wouldSave": round(d.current_fraction - d.new_fraction, 6),
        "memoryPeak": forecast.memory_peak if forecast is not None else None,
        "memoryNeedMiB": d.memory_need_mib,
        "computePeak": forecast.compute if forecast is not None else None,
        "direction": d.direction.value,
        "reason": d.reason.value,
        "message": d.explanation,
        "mode": d.mode.value,
        "isolation": d.isolation.value,
        "enforcement": d.enforcement.value,
        "outcome": actuation.outcome.value,
        "heldBack": actuation.held_back or None,
        "detail": actuation.detail[:4000] or None,
        "decisionId": d.decision_id,
        "decisionTime": _time(d),
        "policyRevision": d.policy_revision,
    }


def new_object(decision: FractionDecision, owner_uid: str) -> dict[str, Any]:
    """The object as created (its status is patched next): the workload in ``spec``, owned by
    the workload. Not a controller reference and no blockOwnerDeletion: the workload's
    deletion waits for nothing of fracpilot's, and no update of its finalizers is needed.
    No label of the workload is copied: Argo CD's tracking label would make it an extraneous
    resource of the workload's Application."""
    w = decision.workload
    api_version = OWNER_API_VERSIONS[w.owner_kind]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(w.owner_kind, w.owner_name),
            "namespace": w.namespace,
            "labels": {
                "app.kubernetes.io/managed-by": MANAGED_BY,
                "app.kubernetes.io/part-of": "fracpilot",
            },
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": w.owner_kind,
                    "name": w.owner_name,
                    "uid": owner_uid,
                }
            ],
        },
        "spec": {
            "targetRef": {"apiVersion": api_version, "kind": w.owner_kind, "name": w.owner_name}
        },
    }


class RecommendationWriter:
    """Keeps one FractionRecommendation per workload equal to its last result (see the
    module doc). ``api``: the actuator's :class:`KubeApi` (its reads of workloads)."""

    def __init__(self, api: KubeApi, registry: CollectorRegistry, timeout_s: float = 30.0) -> None:
        self._kube = api
        self._custom = client.CustomObjectsApi(api.api)
        self._timeout_s = timeout_s
        self._waiting: dict[Key, tuple[FractionDecision, Actuation]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.writes = Counter(
            "fracpilot_recommendation_writes_total",
            "FractionRecommendation writes by result: status (patched), created, gone (the "
            "workload is not there), skipped (a kind without an ownerReference), error",
            ["result"],
            registry=registry,
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="recommendations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def offer(self, decision: FractionDecision, actuation: Actuation) -> None:
        """Write this result (later; a newer result of the workload replaces it)."""
        w = decision.workload
        self._waiting[w.namespace, object_name(w.owner_kind, w.owner_name)] = (decision, actuation)
        self._idle.clear()
        self._wake.set()

    async def drained(self, timeout_s: float) -> bool:
        """Every result offered so far is written (or given up on)."""
        return await event_set(self._idle, timeout_s)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                key = next(iter(self._waiting))
                decision, actuation = self._waiting.pop(key)
                try:
                    self.writes.labels(await self.write(decision, actuation)).inc()
                except Exception as exc:  # the API away: the workload's next result writes it
                    self.writes.labels("error").inc()
                    log.warning(
                        "could not write a FractionRecommendation",
                        extra={"object": "/".join(key), "error": repr(exc)[:500]},
                    )
            self._idle.set()

    async def write(self, decision: FractionDecision, actuation: Actuation) -> str:
        """One result written now; returns how (the metric's result label)."""
        w = decision.workload
        name = object_name(w.owner_kind, w.owner_name)
        body = {"status": status_of(decision, actuation)}
        if await self._patch_status(w.namespace, name, body):
            return "status"
        if w.owner_kind not in OWNER_API_VERSIONS:
            log.info("no FractionRecommendation for this kind", extra={"kind": w.owner_kind})
            return "skipped"
        if w.owner_kind == "Pod":
            owner = await self._kube.read_pod(w.namespace, w.owner_name)
        else:
            owner = await self._kube.read_owner(w.namespace, w.owner_kind, w.owner_name)
        uid = ((owner or {}).get("metadata") or {}).get("uid")
        if not uid:
            return "gone"
        try:
            await self._call(
                lambda: self._custom.create_namespaced_custom_object(
                    GROUP, VERSION, w.namespace, PLURAL, new_object(decision, str(uid)),
                    _request_timeout=self._timeout_s,
                )
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                raise RuntimeError(
                    f"{PLURAL}.{GROUP} is not served: is the FractionRecommendation CRD "
                    "installed (deploy/crds/)?"
                ) from exc
            if exc.status != 409:  # 409: created meanwhile; patch it all the same
                raise
        if not await self._patch_status(w.namespace, name, body):
            raise RuntimeError(f"{w.namespace}/{name} created, then not found")
        return "created"

    async def _patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """False when the object is not there."""
        try:
            await self._call(
                lambda: self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, body,
                    _content_type=MERGE_PATCH, _request_timeout=self._timeout_s,
                )
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def _call(self, call: Any) -> object:
        return await in_thread(call, self._timeout_s + 1.0, name="recommendation")
