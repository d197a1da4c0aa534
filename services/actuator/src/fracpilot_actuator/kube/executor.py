"""The Kubernetes backend's hands: each kind of step carried out against the API server.

- in place (KAI only): patches the running pod's ``gpu-fraction`` (or ``gpu-memory``)
  annotation, which KAI's scheduler re-reads, so the capacity is held at once; the new limit
  reaches the container when the pod is next recreated;
- recreate: evicts through the Eviction API (policy/v1), which honours PodDisruptionBudgets;
  refusals (429 from a PDB or an overloaded server, 409) and failures are retried with
  jittered backoff a bounded number of times, then reported failed; an eviction that got no
  answer (timeout, connection lost, 5xx) is checked (:meth:`KubeApi.pod_is_going`) before it
  is sent again, so no pod is evicted twice; a pod is never deleted directly;
- scale up: creates the placeholder pods of :mod:`fracpilot_actuator.kube.placeholders`
  (and the PriorityClass ``fracpilot-capacity`` when missing);
- targets_via=template: patches a Deployment's or StatefulSet's pod template the way the
  webhook would patch a pod (:func:`fracpilot_actuator.admission.template_patch`), with a
  WARNING log each time, as each such patch starts a rollout that replaces every pod.

A failed step answers a :class:`StepFailure`: its text, and the API server's status when it
refused, so the backend can tell a refusal for good (:func:`.errors.refused_for_good`: the
decision is dead-lettered) from one that may pass (a PDB's 429, a 5xx, no answer).

Every action leaves a Kubernetes Event on the pod (FractionResized, FractionEvictionRequested,
CapacityRequested, and Warning events when it fails); every write leaves a fence for the
reader (:mod:`fracpilot_actuator.kube.reader`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from fracpilot_actuator.admission import template_patch
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import Fence
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement, enforcement_note
from fracpilot_actuator.kube.errors import KubeError, TransientKubeError, refused_for_good
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.object_values import DECISION_ID, KAI_FRACTION, KAI_MEMORY, RESIZED_AT
from fracpilot_actuator.kube.placeholders import (
    PRIORITY_CLASS,
    PendingScaleUp,
    placeholder_name,
    placeholder_pod,
)
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_libs.contracts import FractionDecision, WorkloadTarget
from fracpilot_libs.placement.planner import ResizePlan

log = logging.getLogger(__name__)

COMPONENT = "fracpilot.io/actuator"
TEMPLATE_KINDS = ("Deployment", "StatefulSet")  # whose pod template targets_via=template patches
PRIORITY_CLASS_WAIT_S = 10.0  # how long a new PriorityClass may be unknown to admission


def _retry_eviction(exc: BaseException) -> bool:
    """Refused for now (429: a PDB allows no disruption, or the server is overloaded; 409), or
    failed in a way worth another try (5xx, no answer)."""
    return isinstance(exc, TransientKubeError) or (isinstance(exc, KubeError) and exc.status == 409)


def _status(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, KubeError) else None


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, KubeError) else str(exc)


class StepFailure(str):
    """Why a step failed, as the result's error text (a str, so whoever only reports it needs
    nothing more); ``status``: the HTTP status the API server refused with, None when it did
    not answer or the step failed otherwise."""

    status: int | None

    def __new__(cls, text: str, status: int | None = None) -> StepFailure:
        failure = super().__new__(cls, text)
        failure.status = status
        return failure

    @property
    def refused(self) -> str:
        """The status when the refusal is for good (:attr:`.Actuation.refused`), else ""."""
        return str(self.status) if refused_for_good(self.status) else ""


class InPlaceConflictError(Exception):
    """The pod changed between the read the plan was made on and the patch (409)."""


class StepExecutor:
    """Carries out steps against the API; ``fence`` is told of each write."""

    def __init__(
        self,
        api: KubeApi,
        settings: KubeBackendSettings,
        instance: str,
        fence: Callable[[Fence], None],
        caching: bool,
    ) -> None:
        self.api = api
        self.settings = settings
        self.instance = instance
        self._fence = fence
        self._caching = caching  # whether reads come from a cache that fences must hold back

    async def event(self, pod: PodInfo, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on the pod; failing to write one never fails the action."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        suffix = hashlib.sha256(f"{reason}{message}{now}".encode()).hexdigest()[:10]
        body = {
            "metadata": {"name": f"{pod.name}.{suffix}"[:253], "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "fracpilot-actuator"},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.create_event(pod.namespace, body)
        except Exception as exc:
            log.warning(
                "could not write an event",
                extra={"pod": pod.key, "reason": reason, "error": str(exc)[:300]},
            )

    async def resize_in_place(
        self,
        decision: FractionDecision,
        pod: PodInfo,
        step: ResizePlan,
        memory_mib: int,
        now: datetime,
        enforcement: Enforcement = NOT_ENFORCED,
    ) -> StepFailure | None:
        """Patch the pod as it was read (its resourceVersion and UID are the precondition),
        then read it back: None when it holds the new share, else why not. A conflict (the pod
        changed since it was read) raises :class:`InPlaceConflictError`; any other refusal of the
        API server (KAI's validating webhook, RBAC, ...) is the error returned."""
        annotations = {RESIZED_AT: now.isoformat(), DECISION_ID: decision.decision_id}
        if pod.share is not None and pod.share.kai_key == KAI_MEMORY:
            key, value = KAI_MEMORY, str(memory_mib)
        else:
            key, value = KAI_FRACTION, f"{step.fraction_after:g}"
        annotations[key] = value
        try:
            version = await self.api.patch_pod_annotations(
                pod.namespace,
                pod.name,
                annotations,
                resource_version=pod.resource_version,
                uid=pod.uid,
            )
        except KubeError as exc:
            if exc.status == 409:
                why = f"{pod.key} changed since it was read: {exc.message}"
                raise InPlaceConflictError(why) from exc
            error = f"in-place resize of {pod.key} refused ({exc.status}): {exc.message}"
            await self.event(pod, "FractionResizeFailed", error, warning=True)
            log.warning("in-place resize refused", extra={"pod": pod.key, "error": error})
            return StepFailure(error, exc.status)
        self._fence(Fence("pods", version, None if version else (pod.namespace, pod.name)))
        held = await self._read_back(pod, key)
        if held != value:
            error = (
                f"{pod.key} read back with {key}={held or 'nothing'} after the patch, not {value}"
            )
            log.warning("in-place resize not held", extra={"pod": pod.key, "error": error})
            return StepFailure(error)
        await self.event(
            pod,
            "FractionResized",
            f"GPU share {step.fraction_before:g} -> {step.fraction_after:g} in KAI's "
            f"accounting now; the container keeps what it started with until the pod is next "
            f"recreated: {enforcement_note(step, enforcement)}. "
            f"{decision.explanation} (decision {decision.decision_id}: {step.reason})",
        )
        return None

    async def _read_back(self, pod: PodInfo, key: str) -> str:
        """The annotation ``key`` on the pod as the API server holds it now ("" when the pod or
        the annotation is gone, or the read failed)."""
        try:
            raw = await self.api.read_pod(pod.namespace, pod.name)
        except KubeError as exc:
            log.warning("pod not read back", extra={"pod": pod.key, "error": str(exc)[:300]})
            return ""
        meta = (raw or {}).get("metadata") or {}
        if raw is None or (pod.uid and meta.get("uid") != pod.uid):
            return ""
        return str((meta.get("annotations") or {}).get(key, ""))

    async def evict(
        self,
        decision: FractionDecision,
        pod: PodInfo,
        step: ResizePlan,
        enforcement: Enforcement = NOT_ENFORCED,
    ) -> StepFailure | None:
        """Evict, retrying refusals and failures with jittered backoff; the error after the
        last attempt, or None. After a failure that may have evicted the pod all the same (no
        answer, 5xx) the pod is read before another eviction is sent."""
        await self.event(
            pod,
            "FractionEvictionRequested",
            f"evicting to recreate at GPU share {step.fraction_after:g} "
            f"(was {step.fraction_before:g}; {enforcement_note(step, enforcement)}): "
            f"{decision.explanation} "
            f"(decision {decision.decision_id}: {step.reason})",
        )
        return await self.evict_pod(pod)

    async def evict_pod(self, pod: PodInfo) -> StepFailure | None:
        """:meth:`evict` without its Event (the caller writes its own)."""
        s = self.settings.eviction
        attempts = 0
        unsure = False  # the last eviction may have taken effect: look before sending another
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retry_eviction),
                stop=stop_after_attempt(s.attempts),
                wait=wait_exponential(multiplier=s.backoff_s, max=s.backoff_max_s)
                + wait_random(0, s.backoff_s),  # jitter: replicas do not retry in step
                reraise=True,
            ):
                with attempt:
                    if unsure and await self.api.pod_is_going(pod.namespace, pod.name, pod.uid):
                        log.info("an unanswered eviction took effect", extra={"pod": pod.key})
                        break
                    attempts += 1
                    try:
                        await self.api.evict(pod.namespace, pod.name)
                    except KubeError as exc:
                        unsure = exc.server_failed
                        raise
                    except Exception:
                        unsure = False
                        raise
        except Exception as exc:
            await self._fence_pod(pod.namespace, pod.name)
            status = _status(exc)
            if status == 404:
                return None  # gone already: its replacement gets the target
            if unsure and await self._went_all_the_same(pod):
                return None
            if status == 429:
                error = (
                    f"eviction of {pod.key} refused {attempts} times "
                    f"(429: {_message(exc)}); not forced"
                )
            else:
                error = f"eviction of {pod.key} failed ({status}): {_message(exc)}"
            await self.event(pod, "FractionEvictionFailed", error, warning=True)
            log.warning("eviction failed", extra={"pod": pod.key, "error": error})
            return StepFailure(error, status)
        await self._fence_pod(pod.namespace, pod.name)
        log.info("evicted", extra={"pod": pod.key, "attempts": attempts})
        return None

    async def _went_all_the_same(self, pod: PodInfo) -> bool:
        """After the last eviction failed without a clear answer: whether it took effect, so
        that the result says what happened (False when that cannot be read either)."""
        try:
            going = await self.api.pod_is_going(pod.namespace, pod.name, pod.uid)
        except Exception:
            return False
        if going:
            log.info("the last, unanswered eviction took effect", extra={"pod": pod.key})
        return going

    async def _fence_pod(self, namespace: str, name: str) -> None:
        """After an eviction (done or not): the cache must show the pod as it is now."""
        if not self._caching:
            return
        try:
            version = await self.api.read_pod_version(namespace, name)
        except Exception:  # cannot tell: the next decision lists afresh
            self._fence(Fence("pods", 2**62))
            return
        self._fence(Fence("pods", version, gone=None if version else (namespace, name)))

    async def request_capacity(
        self, decision: FractionDecision, pods: list[PodInfo], now: datetime
    ) -> PendingScaleUp:
        """A placeholder pod for each pod that fits on no GPU; the scale-up that waits."""
        await self.api.ensure_priority_class(
            PRIORITY_CLASS,
            self.settings.placeholder_priority,
            "fracpilot placeholder pods: ask the autoscaler for a GPU before a pod moves",
        )
        pending = PendingScaleUp(decision=decision, started_at=now, placeholders={})
        for pod in pods:
            namespace = self.settings.capacity_namespace or pod.namespace
            name = placeholder_name(pod.namespace, pod.name)
            body = placeholder_pod(
                name=name,
                namespace=namespace,
                decision=decision,
                pod=pod,
                image=self.settings.placeholder_image,
            )
            try:
                version = await self._create_placeholder(namespace, body)
                self._fence(Fence("pods", version))
            except KubeError as exc:
                if exc.status != 409:  # 409: it is there from an earlier attempt
                    raise
            pending.placeholders[pod.name] = (namespace, name)
            await self.event(
                pod,
                "CapacityRequested",
                f"GPU share {decision.new_fraction:g} fits on no GPU: asked for a GPU with "
                f"placeholder pod {namespace}/{name}; the pod is evicted once it exists, and "
                "the placeholder kept until its replacement is bound. "
                f"{decision.explanation} (decision {decision.decision_id})",
            )
        return pending

    async def _create_placeholder(self, namespace: str, body: Mapping[str, Any]) -> int | None:
        """Create a placeholder pod. The apiserver's Priority admission reads PriorityClasses
        from an informer: right after the class is created it may refuse the pod with 403 "no
        PriorityClass with name ... was found" for a moment, so that refusal is tried again
        for up to PRIORITY_CLASS_WAIT_S."""
        waited = 0.0
        while True:
            try:
                return await self.api.create_pod(namespace, body)
            except KubeError as exc:
                lagging = exc.status == 403 and "PriorityClass" in (exc.message or str(exc))
                if not lagging or waited >= PRIORITY_CLASS_WAIT_S:
                    raise
            await asyncio.sleep(0.25)
            waited += 0.25

    async def delete_placeholder(self, namespace: str, name: str) -> None:
        await self.api.delete_pod(namespace, name)
        self._fence(Fence("pods", gone=(namespace, name)))

    async def patch_template(
        self, target: WorkloadTarget, owner: dict[str, Any] | None
    ) -> tuple[str, StepFailure | None]:
        """targets_via=template: size the workload's pod template; (a note, an error or None).

        Every patch that changes the template starts a rollout, and the log says so."""
        wl = target.workload
        what = f"{wl.owner_kind} {wl.display}"
        if wl.owner_kind not in TEMPLATE_KINDS or owner is None:
            log.warning(
                "no pod template to patch: without the webhook new pods keep the old share",
                extra={"workload": wl.key, "kind": wl.owner_kind},
            )
            return f"{what}'s pod template not patched (only a Deployment's or StatefulSet's)", None
        sizing, ops = template_patch(
            owner, target, hami_memory_factor=self.settings.hami_memory_factor
        )
        if not sizing.applies:
            log.warning(
                "pod template cannot take the target",
                extra={"workload": wl.key, "reason": sizing.reason},
            )
            return f"{what}'s pod template not patched: {sizing.reason}", None
        if not ops:
            return f"{what}'s pod template holds the target already", None
        log.warning(
            "patching the pod template: this starts a rollout that replaces every pod of the "
            "workload",
            extra={
                "workload": wl.key,
                "change": sizing.reason,
                "decision_id": target.decision_id,
            },
        )
        try:
            await self.api.patch_pod_template(wl.namespace, wl.owner_kind, wl.owner_name, ops)
        except Exception as exc:
            error = f"pod template patch of {what} failed ({_status(exc)}): {_message(exc)}"
            log.warning("pod template patch failed", extra={"workload": wl.key, "error": error})
            return "pod template not patched", StepFailure(error, _status(exc))
        return f"pod template patched ({sizing.reason}): a rollout replaces every pod", None
