"""Each workload's last decision as a ``FractionRecommendation`` object, for ``kubectl get``.

The leader actuator hands every result it reports (:meth:`DecisionHandler.report`, applied or
held back: recommend mode, not opted in, dry-run) to :meth:`RecommendationWriter.offer`, which
never blocks the decision path: the latest result per workload waits in memory and a task
writes it.

Which workloads get one (``FRACPILOT_POLICYSYNC_RECOMMENDATIONS``, :func:`in_scope`): by
default (``opted-in``) only those of a namespace someone opted in, labelled
``fracpilot.io/mode=recommend`` or ``auto`` (every namespace when the default mode is auto):
an object in a team's namespace is a change there, and nothing changes until they opt in.
``all``: every workload that is not off (excluded namespace, opt-out, mode off); ``off``: none.
A workload that leaves the scope keeps its object as last written (its owner's deletion, or
``kubectl delete frec -l app.kubernetes.io/managed-by=fracpilot-actuator``, removes it).

When the FractionRecommendation CRD is not served (its resource answers 404), writing stops:
one warning, ``fracpilot_recommendation_writes_total{result="not_served"}`` counts each result
not written, and the API is asked again after ``recheck_s`` (10 minutes), not once a result.
Likewise when the actuator's token may not write them (the status patch answers 403:
deploy/rbac/actuator-recommendations.yaml not bound, e.g. installed with the scope ``off`` and
set otherwise by hand): one warning, ``result="forbidden"``, asked again after ``recheck_s``.
A 403 on the create alone (a namespace being deleted, a quota) is that workload's: an error.

A write is a merge patch of the object's status; when the object is not there
(404), the workload is read for its uid and the object is created with an ownerReference to
it, then its status is patched. A workload that is gone gets no object; the object of one
deleted later is deleted by Kubernetes' garbage collector (the ownerReference). Why an object
of its own and not an annotation on the workload: :mod:`fracpilot_libs.kube.recommendation_crd`.

The calls (deploy/rbac/actuator-recommendations.yaml, bound by the chart only when the scope is
not ``off``): create ``fractionrecommendations``, patch ``fractionrecommendations/status``; the
owner's uid with the reads the backend already has (:meth:`KubeApi.read_owner`,
:meth:`KubeApi.read_pod`).

:func:`status_of` and :func:`new_object` are pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.opt_in import Automation, selector_mode
from fracpilot_actuator.settings import OptInSettings
from fracpilot_libs.contracts import FractionDecision
from fracpilot_libs.deadlines import cancel_and_wait, event_set
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
Scope = Literal["off", "opted-in", "all"]
NamespaceLabelsOf = Callable[[str], Awaitable[Mapping[str, Any]]]


def in_scope(
    scope: Scope,
    namespace: str,
    namespace_labels: Mapping[str, Any],
    opt_in: OptInSettings,
    actuation: Actuation,
) -> bool:
    """Whether this result is written (the module doc): never for a workload that is off
    (its pods or namespace say so, or the namespace is excluded); under ``opted-in`` only
    when its namespace's label chose recommend or auto, or the default mode is auto."""
    if scope == "off" or actuation.held_back == "off":
        return False
    selected = selector_mode(namespace, namespace_labels, {}, opt_in)
    if selected.mode is Automation.OFF:
        return False
    return scope == "all" or selected.source == "namespace" or selected.mode is Automation.AUTO


def resource_not_served(exc: ApiException) -> bool:
    """A 404 for the resource itself (its CRD not installed), not for one object or its
    namespace. kube-apiserver answers a path it does not serve with the plain text ``404 page
    not found`` (group or resource unknown), and a missing object or namespace with a Status
    whose ``details.name`` names it (both seen on kube-apiserver v1.35.4 in the tests)."""
    if exc.status != 404:
        return False
    try:
        status = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return True
    details = (status.get("details") or {}) if isinstance(status, dict) else {}
    return not details.get("name")


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


class WritesStoppedError(RuntimeError):
    """No FractionRecommendation can be written now, whichever the workload: writes stop until
    the re-check. ``result``: the metric's label for the results not written meanwhile."""

    result = "error"
    summary = ""


class NotServedError(WritesStoppedError):
    """The FractionRecommendation resource answered 404: its CRD is not installed."""

    result = "not_served"
    summary = "the CRD is not served"


class ForbiddenError(WritesStoppedError):
    """The status patch answered 403: the actuator's token may not write them."""

    result = "forbidden"
    summary = "the actuator may not write them (RBAC)"


class RecommendationWriter:
    """Keeps one FractionRecommendation per workload in scope equal to its last result (see
    the module doc). ``api``: the actuator's :class:`KubeApi` (its reads of workloads);
    ``namespace_labels``: a namespace's labels (the actuator's watch-fed cache); without it
    no namespace is opted in. ``clock``: monotonic seconds, for the re-check of the CRD."""

    def __init__(
        self,
        api: KubeApi,
        registry: CollectorRegistry,
        timeout_s: float = 30.0,
        *,
        scope: Scope = "opted-in",
        namespace_labels: NamespaceLabelsOf | None = None,
        opt_in: OptInSettings | None = None,
        recheck_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = api
        self._custom = client.CustomObjectsApi(api.api)
        self._timeout_s = timeout_s
        self.scope: Scope = scope
        self._namespace_labels = namespace_labels
        self._opt_in = opt_in or OptInSettings()
        self._recheck_s = recheck_s
        self._clock = clock
        self._stopped_until: float | None = None  # writes stop until then
        self._stopped_result = NotServedError.result  # and are counted so meanwhile
        self._waiting: dict[Key, tuple[FractionDecision, Actuation]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.writes = Counter(
            "fracpilot_recommendation_writes_total",
            "FractionRecommendation writes by result: status (patched), created, gone (the "
            "workload is not there), skipped (a kind without an ownerReference), "
            "not_opted_in (out of FRACPILOT_POLICYSYNC_RECOMMENDATIONS' scope), not_served "
            "(the CRD is not installed: not written), forbidden (the RBAC of "
            "actuator-recommendations.yaml is not bound: not written), error",
            ["result"],
            registry=registry,
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="recommendations")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    @property
    def writing(self) -> bool:
        """False while writes stop because the CRD was not served or the writes were
        forbidden (until the re-check)."""
        return self._stopped_until is None or self._clock() >= self._stopped_until

    def offer(self, decision: FractionDecision, actuation: Actuation) -> None:
        """Write this result (later; a newer result of the workload replaces it)."""
        if self.scope == "off":
            return
        if not self.writing:  # not even queued: nothing waits on an absent CRD or right
            self.writes.labels(self._stopped_result).inc()
            return
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
                self.writes.labels(await self._write_in_scope(key, decision, actuation)).inc()
            self._idle.set()

    async def _write_in_scope(
        self, key: Key, decision: FractionDecision, actuation: Actuation
    ) -> str:
        """One result: written when in scope and the CRD is served; the metric's label."""
        try:
            namespace = decision.workload.namespace
            labels = await self._namespace_labels(namespace) if self._namespace_labels else {}
            if not in_scope(self.scope, namespace, labels, self._opt_in, actuation):
                return "not_opted_in"
            if not self.writing:
                return self._stopped_result
            return await self.write(decision, actuation)
        except WritesStoppedError as exc:
            self._stop_writing(exc)
            return exc.result
        except Exception as exc:  # the API away: the workload's next result writes it
            log.warning(
                "could not write a FractionRecommendation",
                extra={"object": "/".join(key), "error": repr(exc)[:500]},
            )
            return "error"

    def _stop_writing(self, why: WritesStoppedError) -> None:
        """Log once per outage (and when its cause changes); drop what waits; ask again after
        ``recheck_s``."""
        if self._stopped_until is None or self._stopped_result != why.result:
            log.warning(
                f"FractionRecommendations are not written: {why.summary}",
                extra={"error": str(why), "recheck_s": self._recheck_s},
            )
        self._stopped_until = self._clock() + self._recheck_s
        self._stopped_result = why.result
        self.writes.labels(why.result).inc(len(self._waiting))
        self._waiting.clear()

    def _written_again(self) -> None:
        if self._stopped_until is not None:
            log.info("FractionRecommendations are written again")
            self._stopped_until = None

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
            if resource_not_served(exc):
                raise _not_served() from exc
            if exc.status != 409:  # 409: created meanwhile; patch it all the same
                raise
        if not await self._patch_status(w.namespace, name, body):
            raise RuntimeError(f"{w.namespace}/{name} created, then not found")
        self._written_again()
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
            if resource_not_served(exc):  # no object read, nor create tried, for nothing
                raise _not_served() from exc
            if exc.status == 403:  # RBAC is checked before the object is looked up
                raise _forbidden() from exc
            if exc.status == 404:
                return False
            raise
        self._written_again()
        return True

    async def _call(self, call: Any) -> object:
        return await in_thread(call, self._timeout_s + 1.0, name="recommendation")


def _forbidden() -> ForbiddenError:
    return ForbiddenError(
        f"patch {PLURAL}/status.{GROUP} is forbidden: is deploy/rbac/actuator-recommendations"
        ".yaml bound to the actuator's ServiceAccount (the chart binds it unless "
        "fractionPolicies.recommendations is off)?"
    )


def _not_served() -> NotServedError:
    return NotServedError(
        f"{PLURAL}.{GROUP} is not served: is the FractionRecommendation CRD installed "
        "(deploy/crds/, or the chart's fractionPolicies.crds.install)?"
    )
