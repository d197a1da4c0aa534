"""fracpilot's actuator (Kubernetes backend, KAI) and its admission webhook on the real GPU stack.

:func:`actuator_on_stack` runs :class:`~fracpilot_actuator.app.ActuatorService` in-process, as
tests/integration/k8s/test_kube_backend.py does, but against a :class:`GpuStack`'s apiserver:
backend ``kubernetes``, a real NATS for decisions, results, targets and allocations, and its
admission webhook served on loopback with a certificate for 127.0.0.1 and registered in the
stack's apiserver as ``fracpilot-targets-<namespace>`` (limited to the test's namespace). The
apiserver calls mutating configurations in name order (see test_webhook_order.py), so it runs
before KAI's ``mutating-kai-admission``: KAI's webhook sees the fraction fracpilot set.

The webhook is served from the test's event loop: every blocking Kubernetes call a test makes
while the actuator runs must go through :func:`in_thread`, or a pod creation (by the test or
by kube-controller-manager) would wait for the loop it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nats
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from factories import decision
from fracpilot_actuator.admission import webhook_configuration
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    FractionDecision,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running
from support.gpu_stack import (
    DEFAULT_QUEUE,
    GPU_FRACTION,
    GPU_PORTION,
    KAI_SCHEDULER,
    KWOK_TAINT,
    QUEUE_LABEL,
    GpuStack,
    issue_loopback_serving_cert,
)

CLUSTER = "test"
OPT_IN = {"fracpilot.io/mode": "auto"}
QUEUES = "scheduling.run.ai/v2"  # KAI's Queue apiVersion
T = TypeVar("T")


async def in_thread(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking call off the event loop that serves the webhook."""
    return await asyncio.to_thread(call, *args, **kwargs)


def settings_for(nats_url: str, namespace: str, workdir: Path, **changes: Any) -> ActuatorSettings:
    cert = issue_loopback_serving_cert(dt.datetime.now(dt.UTC))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tls.crt").write_bytes(cert.cert_pem)
    (workdir / "tls.key").write_bytes(cert.key_pem)
    (workdir / "ca.crt").write_bytes(cert.ca_pem)
    fields: dict[str, Any] = {
        "nats": {"url": nats_url},
        "backend": "kubernetes",
        "cluster": CLUSTER,
        "allow_single_replica": True,
        "leader_election": False,
        "policysync": {"enabled": False},  # no FractionPolicy CRDs in the stack
        "eviction": {"attempts": 3, "backoff_s": 0.05, "backoff_max_s": 0.1},
        # longer than the stack's cluster-autoscaler --max-node-provision-time (gpu_stack.py)
        "capacity": {"poll_s": 0.5, "timeout_s": 300, "autoscaler_max_node_provision_s": 240},
        "verify": {"timeout_s": 240},
        "namespace": namespace,
        "webhook": {
            "enabled": True,
            "host": "127.0.0.1",
            "port": 0,
            "cert_file": str(workdir / "tls.crt"),
            "key_file": str(workdir / "tls.key"),
        },
    }
    for name, value in changes.items():
        group = fields.get(name)
        fields[name] = {**group, **value} if isinstance(group, dict) else value
    return ActuatorSettings(**fields)


def _admissions(service: ActuatorService) -> float:
    registry = service.runtime.registry
    total = 0.0
    for metric in registry.collect():
        if metric.name == "fracpilot_webhook_admissions":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def _register_webhook(stack: GpuStack, service: ActuatorService, namespace: str, ca: bytes) -> str:
    assert service.webhook is not None
    config = webhook_configuration(
        ca_bundle=ca, url=service.webhook.url, name=f"fracpilot-targets-{namespace}"
    )
    for hook in config["webhooks"]:  # the stack's apiserver is shared by the session
        hook["namespaceSelector"]["matchLabels"] = {"kubernetes.io/metadata.name": namespace}
    stack.create(config)
    name: str = config["metadata"]["name"]
    return name


def _wait_called(stack: GpuStack, service: ActuatorService, namespace: str) -> None:
    """The apiserver picks a new configuration up from an informer: dry-run a pod until our
    webhook has seen one (dry-run calls webhooks with sideEffects None; nothing is stored)."""
    core = client.CoreV1Api(stack.api)
    before = _admissions(service)
    probe = kai_pod_body("webhook-probe", "0.1")

    def called() -> bool | None:
        core.create_namespaced_pod(namespace, probe, dry_run="All")  # type: ignore[arg-type]
        return True if _admissions(service) > before else None

    stack.wait(called, "the apiserver to call fracpilot's webhook", timeout=30)


@contextlib.asynccontextmanager
async def actuator_on_stack(
    stack: GpuStack, nats_url: str, namespace: str, workdir: Path, **changes: Any
) -> AsyncIterator[ActuatorService]:
    """The actuator and its webhook on the stack, for the workloads of ``namespace`` (labelled
    opted in here). Every node of the stack is a GPU node it may plan on."""
    await in_thread(
        client.CoreV1Api(stack.api).patch_namespace, namespace, {"metadata": {"labels": OPT_IN}}
    )
    await reset_nats(nats_url)
    settings = settings_for(nats_url, namespace, workdir, **changes)
    api = stack.control_plane.admin_client()
    service = ActuatorService(settings, kube_api=api)
    try:
        async with running(service):
            ca = (workdir / "ca.crt").read_bytes()
            name = await in_thread(_register_webhook, stack, service, namespace, ca)
            try:
                await in_thread(_wait_called, stack, service, namespace)
                yield service
            finally:
                with contextlib.suppress(client.ApiException):
                    await in_thread(
                        client.AdmissionregistrationV1Api(
                            stack.api
                        ).delete_mutating_webhook_configuration,
                        name,
                    )
    finally:
        api.close()  # type: ignore[no-untyped-call]


# --- workloads as users write them ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KaiScenario:
    """What a scenario of fracpilot on the real KAI stack starts from (the ``kai`` fixture):
    the stack, the test's namespace, NATS, the actuator's working directory and a way to add
    kwok GPU nodes."""

    stack: GpuStack
    ns: str
    nats_url: str
    workdir: Path
    make_gpu_node: Callable[[int], str]

    async def add_gpu_node(self, gpus: int = 1) -> str:
        return await in_thread(self.make_gpu_node, gpus)

    def actuator(self, **changes: Any) -> contextlib.AbstractAsyncContextManager[ActuatorService]:
        """:func:`actuator_on_stack` for the scenario's namespace."""
        return actuator_on_stack(self.stack, self.nats_url, self.ns, self.workdir, **changes)


def kai_pod_body(name: str, fraction: str, queue: str = DEFAULT_QUEUE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {QUEUE_LABEL: queue, "app": name},
            "annotations": {GPU_FRACTION: fraction},
        },
        "spec": _kai_spec(),
    }


def _kai_spec() -> dict[str, Any]:
    return {
        "schedulerName": KAI_SCHEDULER,
        "tolerations": [{**KWOK_TAINT, "operator": "Equal"}],
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "example.invalid/gpu-job",
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            }
        ],
    }


def kai_deployment(
    name: str, fraction: str, replicas: int = 1, queue: str = DEFAULT_QUEUE
) -> dict[str, Any]:
    """A Deployment of ``replicas`` KAI fraction pods (kube-controller-manager makes them)."""
    labels = {"app": name, QUEUE_LABEL: queue}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels, "annotations": {GPU_FRACTION: fraction}},
                "spec": _kai_spec(),
            },
        },
    }


def pdb(name: str, max_unavailable: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": name}}},
    }


# --- the stack's answers -------------------------------------------------------------------------


def running_pods(stack: GpuStack, namespace: str, app: str) -> list[dict[str, Any]]:
    """The pods of ``app`` bound and Running, not being deleted."""
    return [
        p
        for p in stack.items("Pod", namespace, selector=f"app={app}")
        if p["spec"].get("nodeName")
        and p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def wait_running(
    stack: GpuStack, namespace: str, app: str, count: int = 1, timeout: float = 120
) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        pods = running_pods(stack, namespace, app)
        return pods if len(pods) >= count else None

    pods: list[dict[str, Any]] = stack.wait(found, f"{count} pod(s) of {app} Running", timeout)
    return pods


def replacement(stack: GpuStack, namespace: str, app: str, old_uid: str) -> dict[str, Any] | None:
    """The pod of ``app`` Running that is not the one with ``old_uid`` (None while none is)."""
    pods = [p for p in running_pods(stack, namespace, app) if p["metadata"]["uid"] != old_uid]
    return pods[0] if pods else None


async def wait_replacement(
    stack: GpuStack, namespace: str, app: str, old: dict[str, Any], what: str, timeout: float = 120
) -> dict[str, Any]:
    """The pod of ``app`` that replaced ``old``, once Running (``what`` names it in a timeout)."""
    uid = old["metadata"]["uid"]
    new: dict[str, Any] = await in_thread(
        stack.wait, lambda: replacement(stack, namespace, app, uid), what, timeout
    )
    return new


async def chat_and_other_sharing_a_gpu(
    stack: GpuStack, namespace: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Deployment ``chat`` and pod ``other`` at 0.5 GPU each, both Running: their pods (KAI
    puts them on one GPU when a node has only one free).

    ``other`` is created once ``chat`` runs: two pods bound at once into one new GPU group race
    in KAI v0.12.0's binder, which can delete the group's reservation pod and later the
    co-tenant (kai-scheduler/KAI-Scheduler#1103, fixed after v0.12.0;
    test_actuator_placement_on_kai.py says how)."""
    await in_thread(stack.create, kai_deployment("chat", "0.5"), namespace)
    [chat] = await in_thread(wait_running, stack, namespace, "chat")
    await in_thread(stack.create, kai_pod_body("other", "0.5"), namespace)
    [other] = await in_thread(wait_running, stack, namespace, "other")
    return chat, other


def gpu_portions(stack: GpuStack, pod: dict[str, Any]) -> list[str]:
    """GPU_PORTION in the ConfigMaps KAI's binder made for ``pod`` (owned by it; the other one,
    ``<name>-evar``, holds no GPU_PORTION)."""
    uid = pod["metadata"]["uid"]
    return [
        cm["data"][GPU_PORTION]
        for cm in stack.items("ConfigMap", pod["metadata"]["namespace"])
        if any(ref["uid"] == uid for ref in cm["metadata"].get("ownerReferences") or [])
        and GPU_PORTION in (cm.get("data") or {})
    ]


def kai_queue(name: str, gpu_limit: float) -> dict[str, Any]:
    """A leaf queue under scripts/gpu-stack/manifests/kai-setup.yaml's default-parent-queue,
    limited to ``gpu_limit`` GPUs."""
    unbounded = {"quota": 0, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": QUEUES,
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {
                "cpu": unbounded,
                "memory": unbounded,
                "gpu": {"quota": 0, "limit": gpu_limit, "overQuotaWeight": 1},
            },
        },
    }


def queue_allocated(stack: GpuStack, name: str, gpus: float) -> bool | None:
    """True once KAI's queuecontroller wrote ``gpus`` allocated into the Queue's status."""
    queue = stack.get("Queue", name, api_version=QUEUES)
    allocated = (queue.get("status") or {}).get("allocated") or {}
    gpu = [v for k, v in allocated.items() if k.endswith("gpu")]
    found = [float(parse_quantity(v)) for v in gpu]  # type: ignore[no-untyped-call]
    return True if found == [gpus] else None


async def wait_queue_allocated(stack: GpuStack, name: str, gpus: float) -> None:
    """Until KAI's queuecontroller has written ``gpus`` allocated into Queue ``name``'s status."""
    what = f"queue {name} status allocated {gpus:g} GPU"
    await in_thread(stack.wait, lambda: queue_allocated(stack, name, gpus), what, 60)


@contextlib.contextmanager
def limited_queue(stack: GpuStack, name: str, gpu_limit: float) -> Iterator[str]:
    """Queue ``name`` (:func:`kai_queue`) and KAI's controllers that fill its status, for the
    block: the queue is deleted and the controllers stopped after it."""
    stack.start_queue_controllers()
    try:
        stack.create(kai_queue(name, gpu_limit))
        yield name
    finally:
        stack.stop_queue_controllers()
        with contextlib.suppress(ApiException):
            stack.dynamic.resources.get(api_version=QUEUES, kind="Queue").delete(name=name)


def unschedulable(stack: GpuStack, namespace: str, name: str) -> dict[str, Any] | None:
    pod = stack.get("Pod", name, namespace)
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return pod
    return None


# --- decisions over NATS -------------------------------------------------------------------------


def decide(namespace: str, name: str, pod: str, current: float, new: float) -> FractionDecision:
    wl = WorkloadRef(cluster=CLUSTER, namespace=namespace, owner_name=name)
    return decision(
        current=current,
        new=new,
        name=name,
        workload=wl,
        decision_id=f"d-{uuid.uuid4().hex[:12]}",
        decided_at=utcnow(),
        pod=pod,
        explanation=f"real stack: {name} {current:g} -> {new:g}",
    )


async def results(nats_url: str, decision_id: str) -> list[ActuationResult]:
    found = [
        ActuationResult.model_validate_json(data)
        for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM)
    ]
    return [r for r in found if r.decision_id == decision_id]


async def publish(nats_url: str, made: FractionDecision) -> float:
    """Publish the decision; the monotonic time it went out."""
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
    finally:
        await nc.close()
    return time.monotonic()


async def apply(
    nats_url: str, made: FractionDecision, count: int = 1, timeout: float = 60
) -> list[ActuationResult]:
    """Publish the decision and wait for ``count`` results of it."""
    await publish(nats_url, made)
    return await wait_results(nats_url, made, count, timeout)


async def wait_results(
    nats_url: str, made: FractionDecision, count: int = 1, timeout: float = 60
) -> list[ActuationResult]:
    deadline = time.monotonic() + timeout
    while True:
        seen = await results(nats_url, made.decision_id)
        if len(seen) >= count:
            return seen
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(seen)} of {count} results for {made.decision_id}")
        await asyncio.sleep(0.2)


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
