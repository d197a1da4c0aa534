"""The policy sync's adapter: watch the policy objects, write the bucket, patch the statuses.

Two informers (:class:`~fracpilot_libs.kube.informer.Informer`) keep the FractionPolicies of
every namespace and the ClusterFractionPolicy in memory. After both have listed, every change
(and every ``resync_s``, which also notices policies set over NATS) runs one pass of
:func:`~fracpilot_actuator.policy_sync.plan.plan_sync` over all objects and the whole policy
bucket, then carries its plan out: KV puts and deletes of ``kubernetes.*`` keys, status
patches, a dead letter and a count for each object found invalid. The leader actuator runs
it (see ``ActuatorService``); a pass is idempotent, so a new leader just runs one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from fracpilot_actuator.metrics import PolicySyncMetrics
from fracpilot_actuator.policy_sync.objects import PolicyObject
from fracpilot_actuator.policy_sync.plan import SyncPlan, plan_sync, status_patch
from fracpilot_actuator.settings import PolicySyncSettings
from fracpilot_libs.contracts import Policy, utcnow
from fracpilot_libs.deadlines import cancel_and_wait, event_set
from fracpilot_libs.kube.client import in_thread
from fracpilot_libs.kube.informer import Informer
from fracpilot_libs.kube.policy_crd import (
    CLUSTER_KIND,
    CLUSTER_PLURAL,
    GROUP,
    NAMESPACED_KIND,
    NAMESPACED_PLURAL,
    VERSION,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.decoding import DecodeError, decode

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
PLURALS = {NAMESPACED_KIND: NAMESPACED_PLURAL, CLUSTER_KIND: CLUSTER_PLURAL}


class PolicySync:
    """Keeps the ``kubernetes.*`` entries of the policy bucket equal to the policy objects."""

    def __init__(
        self,
        api_client: Any,
        bus: Bus,
        registry: CollectorRegistry,
        settings: PolicySyncSettings | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings or PolicySyncSettings()
        self._bus = bus
        self._custom = client.CustomObjectsApi(api_client)
        self._clock = clock
        self.metrics = PolicySyncMetrics(registry)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.passes = 0
        self.last_plan: SyncPlan | None = None
        self.informers = {
            kind: Informer(
                plural,
                partial(self._custom.list_cluster_custom_object, GROUP, VERSION, plural),
                resync_s=int(self.settings.resync_s) + 1,
                timeout_s=self.settings.timeout_s,
                on_change=self._wake.set,
                log_as="policy informer",
            )
            for kind, plural in PLURALS.items()
        }

    def start(self) -> None:
        self._stopping = False
        for informer in self.informers.values():
            informer.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="policy-sync")

    async def stop(self) -> None:
        # The flag ends the loop after the pass in hand even if the cancel is lost (nats-py's
        # replies come through asyncio.wait_for: see DecisionHandler.stop).
        self._stopping = True
        self._wake.set()
        for informer in self.informers.values():
            informer.stop()
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        for informer in self.informers.values():
            while not await informer.wait_synced(60.0):
                log.warning(  # e.g. the CRDs are not installed: a pass would delete everything
                    "policy objects not listed yet: is the CRD installed?",
                    extra={"resource": informer.name},
                )
        log.info("policy sync started")
        while not self._stopping:
            await event_set(self._wake, self.settings.resync_s)
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.sync_once()
            except Exception as exc:  # NATS or the API away: the next pass tries again
                self.metrics.errors.labels("pass").inc()
                log.warning("policy sync pass failed", extra={"error": repr(exc)[:500]})
                await asyncio.sleep(1.0)
                self._wake.set()

    def objects(self) -> list[PolicyObject]:
        return [
            PolicyObject.from_api({"kind": kind, **obj})
            for kind, informer in self.informers.items()
            for obj in informer.store.values()
        ]

    async def _stored(self) -> dict[str, Policy]:
        stored = {}
        for key, raw in (await self._bus.kv_values(subjects.POLICY_BUCKET)).items():
            try:
                stored[key] = decode(Policy, raw)
            except DecodeError as exc:  # the decision service reports it; nothing to sync
                log.debug("stored policy does not decode", extra={"key": key, "reason": exc.reason})
        return stored

    async def sync_once(self) -> SyncPlan:
        """One pass: plan over every object and the bucket, then carry the plan out."""
        started = time.perf_counter()
        objects = self.objects()
        plan = plan_sync(objects, await self._stored(), self._clock())
        kv = await self._bus.kv(subjects.POLICY_BUCKET)
        for key, policy in plan.puts.items():
            await kv.put(key, policy.to_json())
            self.metrics.writes.labels("put").inc()
            log.info("policy synced", extra={"key": key, "revision": policy.revision})
        for key in plan.deletes:
            await kv.delete(key)
            self.metrics.writes.labels("delete").inc()
            log.info("synced policy removed", extra={"key": key})
        by_key = {o.key: o for o in objects}
        for obj, reason in plan.newly_invalid:
            await self._report_invalid(obj, reason)
        for ref, status in plan.statuses.items():
            await self._patch_status(by_key[ref], status)
        for (kind, state), count in plan.states.items():
            self.metrics.objects.labels(kind, state).set(count)
        self.metrics.duration.observe(time.perf_counter() - started)
        self.passes += 1
        self.last_plan = plan
        return plan

    async def _report_invalid(self, obj: PolicyObject, reason: str) -> None:
        self.metrics.invalid.labels(obj.kind).inc()
        body = {"kind": obj.kind, "metadata": {"namespace": obj.namespace, "name": obj.name}}
        payload = json.dumps({**body, "spec": dict(obj.spec)}).encode()
        subject = f"kubernetes.{obj.kind.lower()}.{VERSION}.{obj.namespace or '_'}.{obj.name}"
        headers = {"uid": obj.uid, "generation": str(obj.generation)}
        try:
            await self._bus.dead_letter(subject, payload, headers, "validation", reason)
        except Exception as exc:  # the status says it all the same
            log.warning("could not dead-letter a policy object", extra={"error": repr(exc)})

    async def _patch_status(self, obj: PolicyObject, status: dict[str, Any]) -> None:
        body = status_patch(obj.status, status)
        timeout = self.settings.timeout_s
        plural = PLURALS[obj.kind]

        def call() -> object:
            if obj.namespace:
                return self._custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, obj.namespace, plural, obj.name, body,
                    _content_type=MERGE_PATCH, _request_timeout=timeout,
                )  # fmt: skip
            return self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, plural, obj.name, body,
                _content_type=MERGE_PATCH, _request_timeout=timeout,
            )  # fmt: skip

        try:
            await in_thread(call, timeout + 1.0, name="policy-status")
        except ApiException as exc:
            if exc.status == 404:  # deleted meanwhile: the watch brings the deletion
                return
            self.metrics.errors.labels("status").inc()
            log.warning(
                "could not patch a policy's status",
                extra={"policy": f"{obj.namespace}/{obj.name}", "status": exc.status},
            )
            self._wake.set()
            return
        self.metrics.writes.labels("status").inc()
