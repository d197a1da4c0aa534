"""The actuator's Kubernetes backend against a real kube-apiserver and a real NATS.

Each test runs the actuator service (backend=kubernetes) in-process, publishes a decision on
NATS and reads the ActuationResult back, then looks at what changed in the cluster: pod
annotations, evictions, placeholder pods, PriorityClass, Events, pod templates (without the
webhook), and the target and the allocation in NATS KV.

No controllers, scheduler or kubelet run: the test writes what they would (a Deployment's
ReplicaSet and pods with owner references, pods bound with spec.nodeName and made
Running/Ready, node GPU capacity, PDB status). Creating a Node with GPU capacity stands for
the autoscaler's new node. Every node of a test carries the label ``fracpilot.io/test=<ns>``
and the actuator plans only on those, so tests sharing the control plane stay apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import nats
import pytest
from kubernetes import client

from factories import decision
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    CardForecast,
    ConsolidationMove,
    FractionDecision,
    GpuSharing,
    MoveState,
    Outcome,
    PlanKind,
    WorkloadRef,
    WorkloadTarget,
    utcnow,
)
from fracpilot_libs.deadlines import event_set
from fracpilot_libs.nats import subjects
from helpers import counter, read_stream, reset_nats, running, wait_for
from support import kube
from support.kube import MEM_MIB

pytestmark = pytest.mark.integration


# --- the cluster as controllers would leave it ----------------------------------------------------


class Cluster:
    """Writes nodes, workloads and pods into one test's namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.ns = namespace

    @property
    def selector(self) -> str:
        return f"fracpilot.io/test={self.ns}"

    def node(self, name: str, gpus: int) -> str:
        return kube.gpu_node(self.core, f"{name}-{self.ns}", gpus, {"fracpilot.io/test": self.ns})

    def deployment(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        *,
        template_annotations: dict[str, str] | None = None,
    ) -> client.V1OwnerReference:
        """A Deployment and its ReplicaSet; returns the owner reference for its pods."""
        template = kube.pod_template(name, template_annotations)
        return kube.deployment(self.apps, self.ns, name, labels=labels, template=template)

    def statefulset(self, name: str, limits: dict[str, str]) -> client.V1OwnerReference:
        """A StatefulSet whose pod template has these limits; the owner reference for its pods."""
        sts = self.apps.create_namespaced_stateful_set(
            self.ns,
            client.V1StatefulSet(
                metadata=client.V1ObjectMeta(name=name),
                spec=client.V1StatefulSetSpec(
                    selector=client.V1LabelSelector(match_labels={"app": name}),
                    service_name=name,
                    template=kube.pod_template(name, None, limits),
                ),
            ),
        )
        return kube.owner_ref("StatefulSet", sts)

    def cron_job(self, name: str, job: str) -> client.V1OwnerReference:
        """A CronJob and its Job ``job``; the owner reference (to the Job) for its pods."""
        batch = client.BatchV1Api(self.core.api_client)
        pods = kube.pod_template(name)
        pods.spec.restart_policy = "Never"  # a Job's pods are not restarted in place
        template = client.V1JobTemplateSpec(spec=client.V1JobSpec(template=pods))
        cron = batch.create_namespaced_cron_job(
            self.ns,
            client.V1CronJob(
                metadata=client.V1ObjectMeta(name=name),
                spec=client.V1CronJobSpec(schedule="0 3 * * *", job_template=template),
            ),
        )
        made = batch.create_namespaced_job(
            self.ns,
            client.V1Job(
                metadata=client.V1ObjectMeta(
                    name=job, owner_references=[kube.owner_ref("CronJob", cron, "batch/v1")]
                ),
                spec=template.spec,
            ),
        )
        return kube.owner_ref("Job", made, "batch/v1")

    def pod(
        self,
        name: str,
        node: str,
        owner: client.V1OwnerReference | None,
        *,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        limits: dict[str, str] | None = None,
    ) -> None:
        app = owner.name.rsplit("-", 1)[0] if owner else name
        kube.running_pod(
            self.core,
            self.ns,
            name,
            node,
            labels={"app": app, **(labels or {})},
            annotations=annotations,
            limits=limits,
            owner=owner,
        )

    def kai_pod(
        self, name: str, node: str, owner: client.V1OwnerReference | None, fraction: str, group: str
    ) -> None:
        self.pod(
            name,
            node,
            owner,
            annotations={"gpu-fraction": fraction},
            labels={kube.KAI_GROUP: f"{group}-{self.ns}"},
        )

    def reservation(self, group: str, node: str, gpu_uuid: str) -> None:
        """KAI's reservation pod of a GPU group, with the UUID it reports."""
        kube.kai_reservation(self.core, f"{group}-{self.ns}", node, gpu_uuid)

    def hami_pod(
        self, name: str, node: str, owner: client.V1OwnerReference, memory_mib: int, gpu: str
    ) -> None:
        self.pod(
            name,
            node,
            owner,
            annotations={"hami.io/vgpu-devices-allocated": f"{gpu},NVIDIA,{memory_mib},0:;"},
            limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib)},
        )

    def gone(self, name: str) -> None:
        """Finish an eviction's graceful deletion, as the kubelet would (a StatefulSet's
        replacement takes the same name only once the old pod is gone)."""
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def pdb(self, app: str, disruptions_allowed: int) -> None:
        kube.pdb(self.policy, self.ns, app, disruptions_allowed)

    def read_pod(self, name: str) -> client.V1Pod | None:
        return kube.read_pod(self.core, self.ns, name)

    def evicted(self, name: str) -> bool:
        """Gone, or marked for deletion (no kubelet finishes a graceful deletion)."""
        return kube.pod_is_evicted(self.core, self.ns, name)

    def events(self, pod: str) -> dict[str, client.CoreV1Event]:
        listed = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={pod}"
        )
        return {e.reason: e for e in listed.items}


# --- the actuator ------------------------------------------------------------------------------


@pytest.fixture
def cluster(kube_admin: client.ApiClient, kube_namespace: str) -> Cluster:
    """The test's namespace, opted in to automatic resizing (fracpilot.io/mode=auto)."""
    kube.label_namespace(
        client.CoreV1Api(kube_admin), kube_namespace, {"fracpilot.io/mode": "auto"}
    )
    return Cluster(kube_admin, kube_namespace)


def settings_for(nats_url: str, cluster: Cluster, **changes: Any) -> ActuatorSettings:
    fields: dict[str, Any] = {
        "nats": {"url": nats_url},
        "backend": "kubernetes",
        "cluster": "test",
        "gpu_node_selector": cluster.selector,
        "allow_single_replica": True,
        "eviction": {"attempts": 3, "backoff_s": 0.05, "backoff_max_s": 0.1},
        # an autoscaler that provisions a node within 0.1 s (the test creates the Node itself)
        "capacity": {"poll_s": 0.2, "timeout_s": 60, "autoscaler_max_node_provision_s": 0.1},
        "namespace": cluster.ns,  # the Lease lives in the test's namespace
    }
    for name, value in changes.items():  # a group's changes update the group
        group = fields.get(name)
        fields[name] = {**group, **value} if isinstance(group, dict) else value
    return ActuatorSettings(**fields)


@contextlib.asynccontextmanager
async def actuator(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster, **changes: Any
) -> AsyncIterator[ActuatorService]:
    await reset_nats(nats_url)
    service = ActuatorService(settings_for(nats_url, cluster, **changes), kube_api=kube_admin)
    async with running(service):
        yield service


def workload(cluster: Cluster, name: str) -> WorkloadRef:
    return WorkloadRef(cluster="test", namespace=cluster.ns, owner_name=name)


def decide(cluster: Cluster, name: str, current: float, new: float, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "workload": workload(cluster, name),
        "decision_id": f"d-{uuid.uuid4().hex[:12]}",
        "decided_at": utcnow(),
        "pod": f"{name}-0",
        "explanation": f"test: {name} {current:g} -> {new:g}",
    }
    fields.update(changes)
    return decision(current=current, new=new, name=name, **fields)


async def results(nats_url: str, decision_id: str) -> list[ActuationResult]:
    found = [
        ActuationResult.model_validate_json(data)
        for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM)
    ]
    return [r for r in found if r.decision_id == decision_id]


async def apply(
    nats_url: str, made: FractionDecision, count: int = 1, publish: bool = True
) -> list[ActuationResult]:
    """Publish the decision (unless told not to) and wait for ``count`` results of it."""
    if publish:
        nc = await nats.connect(nats_url)
        await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
        await nc.close()
    seen: list[ActuationResult] = []

    async def arrived() -> bool:
        seen[:] = await results(nats_url, made.decision_id)
        return len(seen) >= count

    deadline = asyncio.get_running_loop().time() + 30
    while not await arrived():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{len(seen)} of {count} results for {made.decision_id}")
        await asyncio.sleep(0.1)
    return seen


async def target_of(nats_url: str, wl: WorkloadRef) -> WorkloadTarget | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.TARGET_BUCKET)
        entry = await kv.get(subjects.kv_key(wl))
        return WorkloadTarget.model_validate_json(entry.value or b"")
    except Exception:
        return None
    finally:
        await nc.close()


async def allocation_of(nats_url: str, wl: WorkloadRef) -> Allocation | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        entry = await kv.get(subjects.kv_key(wl))
        return Allocation.model_validate_json(entry.value or b"")
    except Exception:
        return None
    finally:
        await nc.close()


@contextlib.contextmanager
def backend_logs() -> Iterator[list[logging.LogRecord]]:
    """The Kubernetes backend's log records (its modules under fracpilot_actuator.kube; the
    service replaces the root's handlers, so caplog would see nothing)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("fracpilot_actuator.kube")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# --- KAI in place --------------------------------------------------------------------------------


async def test_kai_in_place_patches_the_annotation_records_the_target_and_an_event(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    gpu = f"GPU-{uuid.uuid4()}"
    cluster.reservation("g1", node, gpu)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.25", "g1")
    cluster.kai_pod("chat-1", node, owner, "0.25", "g1")
    cluster.kai_pod("other-0", node, None, "0.25", "g1")

    async with actuator(nats_url, kube_admin, cluster):
        # Hundredths: KAI's GPU_PORTION is "%.2f" (0.375 would be written 0.38 and not fit).
        made = decide(cluster, "chat", 0.25, 0.37)
        [result] = await apply(nats_url, made)

    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result.detail
    assert (result.gpu_before, result.gpu_after) == (gpu, gpu)
    assert (result.node_before, result.fraction_after) == (node, 0.37)
    for name in ("chat-0", "chat-1"):
        pod = cluster.read_pod(name)
        assert pod is not None
        assert pod.metadata.annotations["gpu-fraction"] == "0.37"
        assert pod.metadata.annotations["fracpilot.io/decision-id"] == made.decision_id
        assert pod.metadata.deletion_timestamp is None
        event = cluster.events(name)["FractionResized"]
        assert event.type == "Normal"
        assert "test: chat 0.25 -> 0.37" in event.message
        assert event.reporting_component == "fracpilot.io/actuator"
    other = cluster.read_pod("other-0")
    assert other is not None
    assert other.metadata.annotations["gpu-fraction"] == "0.25"
    target = await target_of(nats_url, made.workload)
    assert target is not None
    assert (target.fraction, target.backend, target.decision_id) == (
        0.37,
        GpuSharing.KAI,
        made.decision_id,
    )
    # gpu-memory that KAI counts as 0.37: the label floored to 100 MiB (kube/kai.py)
    assert target.memory_mib == round(0.37 * (MEM_MIB // 100 * 100))
    allocation = await allocation_of(nats_url, made.workload)
    assert allocation is not None
    assert (allocation.pod, allocation.node, allocation.gpu_uuid, allocation.fraction) == (
        "chat-0",
        node,
        gpu,
        0.37,
    )
    assert allocation.device_memory_bytes == MEM_MIB * 2**20
    # With the webhook (the default) the pod template is left alone: no rollout.
    template = cluster.apps.read_namespaced_deployment("chat", cluster.ns).spec.template
    assert template.metadata.annotations is None


# --- recreate elsewhere, PDB ----------------------------------------------------------------------


async def test_recreate_elsewhere_honours_the_pdb_then_evicts_with_budget(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    full = cluster.node("full", gpus=1)
    cluster.node("spare", gpus=1)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", full, owner, "0.5", "g1")
    cluster.kai_pod("chat-1", full, owner, "0.5", "g1")
    cluster.pdb("chat", disruptions_allowed=0)

    async with actuator(nats_url, kube_admin, cluster):
        refused = decide(cluster, "chat", 0.5, 0.62, pod="chat-0")
        [result] = await apply(nats_url, refused)
        assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED)
        assert "refused 3 times" in (result.error or "")
        assert "disruption budget" in (result.error or "")
        assert result.node_after == f"spare-{cluster.ns}"
        assert not cluster.evicted("chat-0")  # retried, never forced
        # chat-1 grows in place only once chat-0 has moved out: not yet.
        assert cluster.read_pod("chat-1").metadata.annotations["gpu-fraction"] == "0.5"  # type: ignore[union-attr]
        assert {"FractionEvictionRequested", "FractionEvictionFailed"} <= set(
            cluster.events("chat-0")
        )
        target = await target_of(nats_url, refused.workload)
        assert target is not None
        assert target.fraction == 0.62  # recorded before the eviction

        cluster.pdb("chat", disruptions_allowed=1)
        allowed = decide(cluster, "chat", 0.5, 0.62, pod="chat-0")
        [evicted] = await apply(nats_url, allowed)
        # Evicted, not done: nothing has run at 0.62 yet (the result says so).
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert cluster.evicted("chat-0")
        assert cluster.read_pod("chat-1").metadata.annotations["gpu-fraction"] == "0.62"  # type: ignore[union-attr]
        # The ReplicaSet's new pod, sized by the webhook and bound by the scheduler.
        cluster.kai_pod("chat-2", f"spare-{cluster.ns}", owner, "0.62", "g2")
        _, result = await apply(nats_url, allowed, count=2, publish=False)
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
    assert (result.fraction_after, result.node_after) == (0.62, f"spare-{cluster.ns}")
    assert "chat-2" in result.detail


async def test_a_recreate_evicted_before_a_restart_is_verified_after_it(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    full = cluster.node("full", gpus=1)
    cluster.node("spare", gpus=1)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", full, owner, "0.5", "g1")
    cluster.kai_pod("chat-1", full, owner, "0.5", "g1")
    made = decide(cluster, "chat", 0.5, 0.62, pod="chat-0")
    async with actuator(nats_url, kube_admin, cluster):
        [evicted] = await apply(nats_url, made)
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert cluster.evicted("chat-0")
    # The actuator stopped before the ReplicaSet made the replacement; a new one starts
    # (same NATS: its state bucket holds the waiting recreate).
    service = ActuatorService(settings_for(nats_url, cluster), kube_api=kube_admin)
    async with running(service):
        # Ready is not leading: the recreate is taken up once this replica leads.
        assert await event_set(service.acting, 20)
        assert made.workload.key in service.backend.recreates  # type: ignore[union-attr]
        cluster.kai_pod("chat-2", f"spare-{cluster.ns}", owner, "0.62", "g2")
        _, result = await apply(nats_url, made, count=2, publish=False)
        await wait_for(lambda: not service.backend.recreates, timeout=10)  # type: ignore[union-attr]
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
    assert (result.fraction_after, result.node_after) == (0.62, f"spare-{cluster.ns}")
    assert "chat-2" in result.detail
    nc = await nats.connect(nats_url)
    try:
        state = await nc.jetstream().key_value(subjects.ACTUATOR_STATE_BUCKET)
        saved = await state.get("verification.recreates")
        assert json.loads(saved.value or b"") == {}  # forgotten once the result is out
    finally:
        await nc.close()


# --- scale up -------------------------------------------------------------------------------------


async def test_scale_up_asks_for_capacity_and_evicts_only_once_it_exists(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.5", "g1")
    cluster.kai_pod("big-0", node, None, "0.5", "g1")
    scheduling = client.SchedulingV1Api(kube_admin)

    async with actuator(nats_url, kube_admin, cluster) as service:
        made = decide(cluster, "chat", 0.5, 0.75)
        first = (await apply(nats_url, made))[0]
        assert (first.plan, first.outcome) == (PlanKind.SCALE_UP, Outcome.PENDING), first.detail
        assert "capacity requested" in first.detail

        placeholders = cluster.core.list_namespaced_pod(
            cluster.ns, label_selector="fracpilot.io/role=capacity"
        ).items
        assert len(placeholders) == 1
        placeholder = placeholders[0]
        assert placeholder.spec.priority_class_name == "fracpilot-capacity"
        assert placeholder.spec.priority == -1
        # One whole GPU, and the moving pod's CPU and memory requests (as KAI's scaling pod).
        assert placeholder.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
        assert placeholder.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1"
        assert placeholder.spec.node_name is None
        assert scheduling.read_priority_class("fracpilot-capacity").value == -1
        assert "CapacityRequested" in cluster.events("chat-0")
        assert await target_of(nats_url, made.workload) is not None

        await asyncio.sleep(1.0)  # several capacity checks: nothing may move yet
        assert not cluster.evicted("chat-0")
        assert await results(nats_url, made.decision_id) == [first]
        assert made.workload.key in service.backend.guards.in_flight  # type: ignore[union-attr]

        # In flight: another decision for the workload is turned away.
        again = decide(cluster, "chat", 0.5, 0.875)
        [busy] = await apply(nats_url, again)
        assert busy.outcome is Outcome.SKIPPED
        assert "in flight" in busy.detail

        new = cluster.node("new", gpus=1)  # the autoscaler's new node
        _, second = await apply(nats_url, made, count=2, publish=False)
        assert (second.plan, second.outcome) == (PlanKind.SCALE_UP, Outcome.PENDING)
        assert "capacity appeared" in second.detail
        assert cluster.evicted("chat-0")
        # Make before break: the placeholder holds the new GPU until the replacement is bound.
        assert cluster.read_pod(placeholder.metadata.name) is not None
        cluster.kai_pod("chat-1", new, owner, "0.75", "g2")
        *_, third = await apply(nats_url, made, count=3, publish=False)
        # The placeholder goes after the final result is out: waited for before the stop.
        await wait_for(lambda: not service.backend.recreates, timeout=10)  # type: ignore[union-attr]
    assert (third.plan, third.outcome) == (PlanKind.SCALE_UP, Outcome.APPLIED), third.detail
    assert third.node_after == f"new-{cluster.ns}"
    allocation = await allocation_of(nats_url, made.workload)
    assert allocation is not None
    assert (allocation.node, allocation.fraction) == (f"new-{cluster.ns}", 0.75)
    assert cluster.read_pod(placeholder.metadata.name) is None
    assert "FractionEvictionRequested" in cluster.events("chat-0")


# --- HAMi -----------------------------------------------------------------------------------------


async def test_hami_change_is_a_recreate_even_when_it_fits(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    gpu = f"GPU-{uuid.uuid4()}"
    owner = cluster.deployment("embed")
    cluster.hami_pod("embed-0", node, owner, 20480, gpu)
    cluster.hami_pod("embed-1", node, owner, 20480, gpu)

    async with actuator(nats_url, kube_admin, cluster, max_disruptions_per_namespace=5):
        made = decide(cluster, "embed", 0.25, 0.125, pod="embed-0")  # a downsize
        [evicted] = await apply(nats_url, made)
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert "HAMi cannot change a running pod" in evicted.detail
        assert cluster.evicted("embed-0")
        assert cluster.evicted("embed-1")
        # The ReplicaSet's new pods, as HAMi allocates them on the same GPU at 10240 MiB.
        cluster.hami_pod("embed-2", node, owner, 10240, gpu)
        cluster.hami_pod("embed-3", node, owner, 10240, gpu)
        _, result = await apply(nats_url, made, count=2, publish=False)
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
    assert (result.gpu_after, result.fraction_after) == (gpu, 0.125)
    target = await target_of(nats_url, made.workload)
    assert target is not None
    assert (target.backend, target.memory_mib) == (GpuSharing.HAMI, 10240)


# --- without the webhook: pod template patches ----------------------------------------------------


async def test_template_fallback_patches_the_kai_template_and_warns_of_a_rollout(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    cluster.reservation("g1", node, f"GPU-{uuid.uuid4()}")
    owner = cluster.deployment("chat", template_annotations={"gpu-fraction": "0.25"})
    cluster.kai_pod("chat-0", node, owner, "0.25", "g1")
    cluster.kai_pod("chat-1", node, owner, "0.25", "g1")

    with backend_logs() as records:
        async with actuator(nats_url, kube_admin, cluster, targets_via="template"):
            made = decide(cluster, "chat", 0.25, 0.37)
            [result] = await apply(nats_url, made)

    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result.detail
    assert "pod template patched (gpu-fraction 0.37)" in result.detail
    assert "a rollout replaces every pod" in result.detail
    template = cluster.apps.read_namespaced_deployment("chat", cluster.ns).spec.template
    assert template.metadata.annotations == {
        "gpu-fraction": "0.37",
        "fracpilot.io/target": made.decision_id,
    }
    for name in ("chat-0", "chat-1"):  # the running pods are still resized in place
        pod = cluster.read_pod(name)
        assert pod is not None
        assert pod.metadata.annotations["gpu-fraction"] == "0.37"
    rollouts = [
        r
        for r in records
        if r.levelno == logging.WARNING and "starts a rollout that replaces every pod" in r.msg
    ]
    assert len(rollouts) == 1
    assert getattr(rollouts[0], "workload", None) == made.workload.key
    target = await target_of(nats_url, made.workload)
    assert target is not None
    assert target.fraction == 0.37  # recorded as well, for pods the webhook would see


async def test_template_rollouts_count_against_the_disruption_budget(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    # KAI in place is not disruptive by itself, but with template patches each action starts
    # a rollout: the second one in the window is refused and its template left alone.
    node = cluster.node("gpu", gpus=1)
    cluster.reservation("g1", node, f"GPU-{uuid.uuid4()}")
    for name in ("chat", "code"):
        owner = cluster.deployment(name, template_annotations={"gpu-fraction": "0.25"})
        cluster.kai_pod(f"{name}-0", node, owner, "0.25", "g1")

    async with actuator(nats_url, kube_admin, cluster, targets_via="template", max_disruptions=1):
        [first] = await apply(nats_url, decide(cluster, "chat", 0.25, 0.37))
        [second] = await apply(nats_url, decide(cluster, "code", 0.25, 0.37))

    assert first.outcome is Outcome.APPLIED, first.detail
    assert (second.outcome, "rate" in second.detail) == (Outcome.SKIPPED, True), second.detail
    code = cluster.apps.read_namespaced_deployment("code", cluster.ns).spec.template
    assert code.metadata.annotations == {"gpu-fraction": "0.25"}


async def test_template_fallback_sizes_a_hami_statefulset_and_publishes_the_allocation(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    gpu = f"GPU-{uuid.uuid4()}"
    owner = cluster.statefulset("embed", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"})
    cluster.hami_pod("embed-0", node, owner, 20480, gpu)
    cluster.hami_pod("embed-1", node, owner, 20480, gpu)
    wl = WorkloadRef(
        cluster="test", namespace=cluster.ns, owner_kind="StatefulSet", owner_name="embed"
    )

    with backend_logs() as records:
        async with actuator(
            nats_url,
            kube_admin,
            cluster,
            targets_via="template",
            max_disruptions_per_namespace=5,
        ):
            made = decide(cluster, "embed", 0.25, 0.125, pod="embed-0", workload=wl)
            [evicted] = await apply(nats_url, made)
            assert evicted.outcome is Outcome.PENDING, evicted.detail
            assert "a rollout replaces every pod" in evicted.detail
            assert cluster.evicted("embed-0")
            assert cluster.evicted("embed-1")
            # The StatefulSet's pods come back under their names, from the patched template.
            for name in ("embed-0", "embed-1"):
                cluster.gone(name)
                cluster.hami_pod(name, node, owner, 10240, gpu)
            _, result = await apply(nats_url, made, count=2, publish=False)

    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
    template = cluster.apps.read_namespaced_stateful_set("embed", cluster.ns).spec.template
    limits = template.spec.containers[0].resources.limits
    assert limits["nvidia.com/gpumem"] == "10240"
    assert limits["nvidia.com/gpu"] == "1"
    assert template.metadata.annotations["fracpilot.io/target"] == made.decision_id
    assert any("rollout" in r.msg for r in records if r.levelno == logging.WARNING)
    allocation = await allocation_of(nats_url, wl)
    assert allocation is not None
    assert (allocation.workload, allocation.pod, allocation.node) == (wl, "embed-0", node)
    assert (allocation.gpu_uuid, allocation.fraction) == (gpu, 0.125)


# --- guardrails -----------------------------------------------------------------------------------


async def test_dry_run_plans_and_changes_nothing(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.5", "g1")
    cluster.kai_pod("chat-1", node, owner, "0.5", "g1")

    async with actuator(nats_url, kube_admin, cluster, dry_run=True):
        made = decide(cluster, "chat", 0.5, 0.25)
        [result] = await apply(nats_url, made)
    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.DRY_RUN)
    assert result.detail.startswith("dry-run: would in_place")
    assert result.fraction_after == 0.5
    pod = cluster.read_pod("chat-0")
    assert pod is not None
    assert pod.metadata.annotations["gpu-fraction"] == "0.5"
    assert cluster.events("chat-0") == {}
    assert await target_of(nats_url, made.workload) is None


async def test_rate_limit_denies_the_next_disruptive_action(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=3)
    for i, name in enumerate(("a", "b", "c")):
        owner = cluster.deployment(name)
        cluster.hami_pod(f"{name}-0", node, owner, 20480, f"GPU-{cluster.ns}-{i}")

    async with actuator(
        nats_url, kube_admin, cluster, max_disruptions=2, max_disruptions_per_namespace=5
    ):
        outcomes = []
        for name in ("a", "b", "c"):
            [result] = await apply(nats_url, decide(cluster, name, 0.25, 0.5))
            outcomes.append((result.outcome, result.detail))
    # Evicted (their replacements pending), then the third is held back by the rate.
    assert [o for o, _ in outcomes] == [Outcome.PENDING, Outcome.PENDING, Outcome.SKIPPED]
    assert "rate: 2 disruptive actions" in outcomes[2][1]
    assert cluster.evicted("a-0")
    assert cluster.evicted("b-0")
    assert not cluster.evicted("c-0")


async def test_single_replica_is_recreated_only_when_allowed(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    cluster.hami_pod("solo-0", node, cluster.deployment("solo"), 20480, f"GPU-{cluster.ns}")
    async with actuator(nats_url, kube_admin, cluster, allow_single_replica=False):
        [result] = await apply(nats_url, decide(cluster, "solo", 0.25, 0.5))
    assert result.outcome is Outcome.SKIPPED
    assert result.detail.startswith("single_replica:")
    assert not cluster.evicted("solo-0")


async def test_opted_out_workloads_are_skipped(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    by_owner = cluster.deployment("chat", labels={"fracpilot.io/opt-out": "true"})
    cluster.kai_pod("chat-0", node, by_owner, "0.25", "g1")
    by_pod = cluster.deployment("embed")
    cluster.pod(
        "embed-0",
        node,
        by_pod,
        annotations={"gpu-fraction": "0.25", "fracpilot.io/opt-out": "true"},
        labels={"runai-gpu-group": f"g1-{cluster.ns}"},
    )
    async with actuator(nats_url, kube_admin, cluster):
        [chat] = await apply(nats_url, decide(cluster, "chat", 0.25, 0.5))
        [embed] = await apply(nats_url, decide(cluster, "embed", 0.25, 0.5))
    assert chat.outcome is Outcome.SKIPPED
    assert f"Deployment {cluster.ns}/chat" in chat.detail
    assert embed.outcome is Outcome.SKIPPED
    assert f"pod {cluster.ns}/embed-0" in embed.detail
    for name in ("chat-0", "embed-0"):
        pod = cluster.read_pod(name)
        assert pod is not None
        assert pod.metadata.annotations["gpu-fraction"] == "0.25"
        assert cluster.events(name) == {}
    assert await target_of(nats_url, workload(cluster, "chat")) is None


async def test_a_decision_older_than_the_pods_is_stale(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    cluster.kai_pod("chat-0", node, cluster.deployment("chat"), "0.25", "g1")
    async with actuator(nats_url, kube_admin, cluster):
        old = decide(cluster, "chat", 0.25, 0.5, decided_at=utcnow() - timedelta(hours=1))
        [result] = await apply(nats_url, old)
    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.SKIPPED)
    assert result.detail.startswith("stale: decision made at")
    pod = cluster.read_pod("chat-0")
    assert pod is not None
    assert pod.metadata.annotations["gpu-fraction"] == "0.25"


async def test_a_bad_annotation_is_reported_and_the_actuator_carries_on(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    cluster.pod("chat-0", node, cluster.deployment("chat"), annotations={"gpu-fraction": "abc"})
    cluster.kai_pod("embed-0", node, cluster.deployment("embed"), "0.25", "g1")
    async with actuator(nats_url, kube_admin, cluster):
        [bad] = await apply(nats_url, decide(cluster, "chat", 0.25, 0.5))
        [good] = await apply(nats_url, decide(cluster, "embed", 0.25, 0.5))
    assert (bad.plan, bad.outcome) == (PlanKind.NONE, Outcome.SKIPPED)
    assert f"pod {cluster.ns}/chat-0: gpu-fraction 'abc' is not a number" in (bad.error or "")
    warning = cluster.events("chat-0")["FractionInvalid"]
    assert warning.type == "Warning"
    assert (good.plan, good.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED)


async def test_scale_up_resumes_after_a_restart_and_gives_up_without_capacity(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.5", "g1")
    cluster.kai_pod("big-0", node, None, "0.5", "g1")
    made = decide(cluster, "chat", 0.5, 0.75)
    async with actuator(nats_url, kube_admin, cluster, capacity={"poll_s": 30}):
        [first] = await apply(nats_url, made)
        assert first.plan is PlanKind.SCALE_UP
    # A new actuator finds the placeholder, carries the scale-up on and times it out.
    service = ActuatorService(
        settings_for(nats_url, cluster, capacity={"timeout_s": 0.5}), kube_api=kube_admin
    )
    async with running(service):
        await wait_for(lambda: not service.backend.pending, timeout=20)  # type: ignore[union-attr]
        _, last = await apply(nats_url, made, count=2, publish=False)
    assert (last.plan, last.outcome) == (PlanKind.SCALE_UP, Outcome.FAILED)
    assert "no GPU with 0.75 free appeared" in (last.error or "")
    assert not cluster.evicted("chat-0")
    assert (
        cluster.core.list_namespaced_pod(
            cluster.ns, label_selector="fracpilot.io/role=capacity"
        ).items
        == []
    )
    assert "CapacityNotAvailable" in cluster.events("chat-0")


# --- two replicas: only the Lease holder acts ---------------------------------------------


async def test_two_actuators_only_the_leader_acts_and_the_standby_takes_over(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    node = cluster.node("gpu", gpus=1)
    cluster.reservation("g1", node, f"GPU-{uuid.uuid4()}")
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.25", "g1")
    await reset_nats(nats_url)
    lease = {
        "duration_s": 2,
        "renew_deadline_s": 1.5,
        "renew_period_s": 0.5,
        "retry_period_s": 0.25,
    }
    first = ActuatorService(
        settings_for(nats_url, cluster, identity="replica-a", lease=lease), kube_api=kube_admin
    )
    second = ActuatorService(
        settings_for(nats_url, cluster, identity="replica-b", lease=lease), kube_api=kube_admin
    )
    async with running(first), running(second):
        electors = (first.elector, second.elector)
        assert None not in electors
        await wait_for(lambda: any(e.is_leader for e in electors if e), timeout=10)
        leader, standby = (
            (first, second) if first.elector and first.elector.is_leader else (second, first)
        )
        assert standby.elector is not None
        assert not standby.elector.is_leader
        [result] = await apply(nats_url, decide(cluster, "chat", 0.25, 0.37))
        assert result.outcome is Outcome.APPLIED
        handled = {
            svc: counter(
                svc.runtime.registry,
                "fracpilot_actuator_actions_total",
                plan="in_place",
                outcome="applied",
            )
            for svc in (first, second)
        }
        assert handled[leader] == 1
        assert handled[standby] == 0  # the standby does not even consume

        # The leader dies without handing the Lease back: it stops renewing.
        assert leader.elector is not None
        await leader.elector.stop(release=False)
        died = time.monotonic()
        await wait_for(
            lambda: standby.elector is not None and standby.elector.is_leader, timeout=10
        )
        takeover_s = time.monotonic() - died
        [result] = await apply(nats_url, decide(cluster, "chat", 0.37, 0.5))
        assert result.outcome is Outcome.APPLIED
        assert (
            counter(
                standby.runtime.registry,
                "fracpilot_actuator_actions_total",
                plan="in_place",
                outcome="applied",
            )
            == 1
        )
    assert takeover_s <= lease["duration_s"] + lease["retry_period_s"] + 0.5


# --- the watch-fed inventory cache ---------------------------------------------------------------


@pytest.mark.parametrize("inventory_cache", [True, False])
async def test_the_inventory_cache_sees_new_pods_and_our_own_last_write(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster, inventory_cache: bool
) -> None:
    async with actuator(nats_url, kube_admin, cluster, inventory_cache=inventory_cache) as service:
        from fracpilot_actuator.kube.backend import KubernetesBackend

        backend = service.backend
        assert isinstance(backend, KubernetesBackend)
        assert (backend.cache is not None) is inventory_cache
        # Leading, and what a new leader lists once (its placeholders) listed: count from here.
        await asyncio.wait_for(service.acting.wait(), 20)
        lists: list[str] = []
        for name in ("list_nodes", "list_pods", "list_owners"):
            call = getattr(backend.api, name)

            async def counted(
                *args: Any, _call: Any = call, _name: str = name, **kwargs: Any
            ) -> Any:
                lists.append(_name)
                return await _call(*args, **kwargs)

            setattr(backend.api, name, counted)

        # Everything the decisions need appears after the actuator (and its watches) started.
        node = cluster.node("gpu", gpus=1)
        gpu = f"GPU-{uuid.uuid4()}"
        cluster.reservation("g1", node, gpu)
        cluster.kai_pod("chat-0", node, cluster.deployment("chat"), "0.25", "g1")
        if (cache := backend.cache) is not None:  # the watches deliver them, no list

            def delivered() -> bool:
                snap = cache.snapshot()
                names = {
                    (kind, i["metadata"]["name"])
                    for kind, items in (("Node", snap.nodes), ("ReplicaSet", snap.replica_sets))
                    for i in items
                } | {
                    ("Pod", p["metadata"]["name"])
                    for p in snap.pods
                    if (p.get("status") or {}).get("phase") == "Running"
                }
                return {("Node", node), ("ReplicaSet", "chat-6b7f9c"), ("Pod", "chat-0")} <= names

            await wait_for(delivered)
            relists = cache.relists

        first = decide(cluster, "chat", 0.25, 0.37)
        [one] = await apply(nats_url, first)
        # At once: planned on the cache, which must hold the first decision's patch.
        second = decide(cluster, "chat", 0.37, 0.5)
        [two] = await apply(nats_url, second)

    assert (one.plan, one.outcome, one.gpu_after) == (PlanKind.IN_PLACE, Outcome.APPLIED, gpu)
    assert (one.fraction_before, one.fraction_after) == (0.25, 0.37), one.detail
    assert (two.plan, two.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), two.detail
    assert (two.fraction_before, two.fraction_after) == (0.37, 0.5), two.detail
    pod = cluster.read_pod("chat-0")
    assert pod is not None
    assert pod.metadata.annotations["gpu-fraction"] == "0.5"
    if inventory_cache:
        assert lists == []  # no list per decision
        assert backend.fresh_lists == 0  # the watch caught up with the patch in time
        assert cache is not None
        assert cache.relists == relists  # picked up by watch events, not by a list
    else:
        assert sorted(set(lists)) == ["list_nodes", "list_owners", "list_pods"]


# --- consolidation: a new leader goes on with the card being emptied ------------------------------


async def test_a_new_leader_resumes_the_card_being_emptied_and_verifies_its_move(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    """The first actuator starts emptying GPU A (chat-0 evicted; chat-1 on GPU B stays) and stops
    before the replacement exists; the next one reads the progress from the state bucket,
    verifies the move in flight (nothing evicted twice) and reports the card freed."""
    node = cluster.node("cards", gpus=2)
    gpu_a, gpu_b = f"GPU-a-{cluster.ns}", f"GPU-b-{cluster.ns}"
    cluster.reservation("g1", node, gpu_a)
    cluster.reservation("g2", node, gpu_b)
    owner = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, owner, "0.25", "g1")
    cluster.kai_pod("chat-1", node, owner, "0.25", "g2")
    cluster.pdb("chat", 1)
    auto = {"mode": "auto", "interval_s": 0.2, "move_timeout_s": 60}
    async with actuator(nats_url, kube_admin, cluster, consolidation=auto) as first:
        await wait_for(lambda: cluster.evicted("chat-0"), timeout=20)
        assert first.backend.consolidation.card == gpu_a  # type: ignore[union-attr]
    nc = await nats.connect(nats_url)
    try:
        state = await nc.jetstream().key_value(subjects.ACTUATOR_STATE_BUCKET)
        saved = json.loads((await state.get("consolidation.progress")).value or b"")
        assert (saved["card"], saved["node"]) == (gpu_a, node)
        assert saved["move"]["step"]["placement"]["pod"] == "chat-0"
        assert saved["move"]["step"]["to_gpu"] == gpu_b
        service = ActuatorService(
            settings_for(nats_url, cluster, consolidation=auto), kube_api=kube_admin
        )
        async with running(service):
            backend = service.backend
            await wait_for(lambda: backend.consolidation.card == gpu_a, timeout=10)  # type: ignore[union-attr]
            assert backend.consolidation.move is not None  # type: ignore[union-attr]
            cluster.gone("chat-0")  # the kubelet finishes the eviction
            cluster.kai_pod("chat-2", node, owner, "0.25", "g2")  # KAI binds it on GPU B
            core = client.CoreV1Api(kube_admin)

            def card_done() -> bool:
                listed = core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node}"
                )
                return any(e.reason == "ConsolidationCardDone" for e in listed.items)

            await wait_for(card_done, timeout=20)
            assert not cluster.evicted("chat-1")
            assert not cluster.evicted("chat-2")
        saved_after = await state.get("consolidation.progress")
        assert (saved_after.value or b"") == b""  # nothing in flight any more
    finally:
        await nc.close()
    moves = [
        ConsolidationMove.model_validate_json(data)
        for subject, data in await read_stream(nats_url, subjects.CONSOLIDATION_STREAM)
        if subject == subjects.consolidation_move_subject("test")
    ]
    assert [m.state for m in moves] == [MoveState.STARTED, MoveState.VERIFIED, MoveState.FREED]
    assert f"GPU {gpu_b} (as predicted)" in moves[1].detail
    events = cluster.events("chat-2")
    assert "ConsolidationMoveVerified" in events


# --- consolidation: owners from the cache, a Job's pod and its CronJob's forecast -----------------


async def test_consolidation_reads_owners_from_the_cache_and_a_jobs_pod_gets_its_forecast(
    nats_url: str, kube_admin: client.ApiClient, cluster: Cluster
) -> None:
    """GPU A: chat-0 (0.25) alone; GPU B: chat-1 (0.25) and big-0 (0.6) of CronJob big's Job.
    With big's forecast (need 0.3) the round shrinks big-0 in place to make room for chat-0:
    the pod reached its CronJob's decision through the Job. The rounds read the owners from
    the inventory cache: no ReplicaSet or Job is listed."""
    node = cluster.node("cron", gpus=2)
    cluster.reservation("g1", node, f"GPU-a-{cluster.ns}")
    cluster.reservation("g2", node, f"GPU-b-{cluster.ns}")
    chat = cluster.deployment("chat")
    cluster.kai_pod("chat-0", node, chat, "0.25", "g1")
    cluster.kai_pod("chat-1", node, chat, "0.25", "g2")
    cluster.kai_pod("big-0", node, cluster.cron_job("big", "big-29001"), "0.6", "g2")
    cluster.pdb("chat", 1)
    auto = {"mode": "auto", "interval_s": 0.2, "move_timeout_s": 60}
    async with actuator(nats_url, kube_admin, cluster, consolidation=auto) as service:
        from fracpilot_actuator.kube.backend import KubernetesBackend

        backend = service.backend
        assert isinstance(backend, KubernetesBackend)
        await asyncio.wait_for(service.acting.wait(), 20)
        lists: list[str] = []
        list_owners = backend.api.list_owners

        async def counted(namespace: str) -> tuple[list[Any], list[Any]]:
            lists.append(namespace)
            return await list_owners(namespace)

        backend.api.list_owners = counted  # type: ignore[method-assign]
        first = backend.consolidation.last_round
        await wait_for(lambda: backend.consolidation.last_round != first, timeout=10)
        assert backend.consolidation.card == ""  # without the forecast nothing fits
        ref = WorkloadRef(
            cluster="test", namespace=cluster.ns, owner_kind="CronJob", owner_name="big"
        )
        forecast = CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3)
        backend.cards.book.record(
            decision(0.6, 0.4, workload=ref, forecast=forecast, decided_at=utcnow())
        )

        def shrunk() -> bool:
            pod = cluster.read_pod("big-0")
            return pod is not None and pod.metadata.annotations["gpu-fraction"] != "0.6"

        await wait_for(shrunk, timeout=20)
        await wait_for(lambda: cluster.evicted("chat-0"), timeout=20)  # the move that needed it
    pod = cluster.read_pod("big-0")
    assert pod is not None
    assert 0.3 <= float(pod.metadata.annotations["gpu-fraction"]) <= 0.5
    assert "FractionRedivided" in cluster.events("big-0")
    assert lists == []  # every round read the owners from the cache
