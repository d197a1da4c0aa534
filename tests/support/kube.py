"""A GPU cluster written into a real kube-apiserver, as controllers would leave it.

No scheduler, controllers or kubelet run (see tests/k8s_control_plane.py): these write nodes
with GPU capacity, KAI's reservation pods (GPU group -> GPU UUID), Deployments with their
ReplicaSets, pods bound to nodes, Running and Ready, and PodDisruptionBudgets with the status
the disruption controller would have written. Used by the integration tests
(tests/integration/k8s), the chaos suite (tests/chaos/kube_cluster.py) and bench/actuator.py.
An evicted pod stays terminating (no kubelet finishes it): see :func:`pod_is_evicted`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"
MEM_MIB = 81920  # GPU memory on every node's nvidia.com/gpu.memory label
RESERVATION_NS = "kai-resource-reservation"  # where KAI's reservation pods live
KAI_GROUP = "runai-gpu-group"  # label: the GPU group a KAI pod shares
KAI_RESERVED_GPU = "run.ai/reserve_for_gpu_index"  # on a reservation pod: the GPU's UUID
REPLICA_SET_SUFFIX = "6b7f9c"  # a Deployment's ReplicaSet is <deployment>-<this>
RUNNING_AND_READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def ensure_namespace(core: client.CoreV1Api, name: str) -> None:
    """Create the namespace; one that exists already is fine."""
    with contextlib.suppress(ApiException):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))


def label_namespace(core: client.CoreV1Api, name: str, labels: dict[str, str | None]) -> None:
    """Set (or, with None, remove) labels of a namespace, as `kubectl label namespace` does."""
    core.patch_namespace(name, {"metadata": {"labels": labels}})


def gpu_node(
    core: client.CoreV1Api,
    name: str,
    gpus: int,
    labels: dict[str, str],
    *,
    memory_mib: int = MEM_MIB,
    cpu: str = "16",
    memory: str = "64Gi",
) -> str:
    """A node with ``gpus`` allocatable ``nvidia.com/gpu`` and its GPU memory label."""
    all_labels = {**labels, "nvidia.com/gpu.memory": str(memory_mib)}
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=all_labels)))
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
    core.patch_node_status(
        name,
        {"status": {"capacity": resources, "allocatable": resources}},
        _content_type=MERGE_PATCH,
    )
    # Created NotReady (admission taints it); no kubelet or node controller here lifts it,
    # and a recreated pod may go only where kube-scheduler would put it.
    core.patch_node(name, {"spec": {"taints": []}}, _content_type=MERGE_PATCH)
    return name


def owner_ref(kind: str, obj: Any, api_version: str = "apps/v1") -> client.V1OwnerReference:
    """The controller owner reference to ``obj`` (an object as the API answered it)."""
    return client.V1OwnerReference(
        api_version=api_version,
        kind=kind,
        name=obj.metadata.name,
        uid=obj.metadata.uid,
        controller=True,
    )


def pod_template(
    app: str,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
) -> client.V1PodTemplateSpec:
    """A pod template labelled ``app=<app>`` with one container."""
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": app}, annotations=annotations),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main", image="x", resources=client.V1ResourceRequirements(limits=limits)
                )
            ]
        ),
    )


def deployment(
    apps: client.AppsV1Api,
    namespace: str,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    template: client.V1PodTemplateSpec | None = None,
    replicas: int | None = None,
) -> client.V1OwnerReference:
    """A Deployment and its ReplicaSet; the owner reference (to the ReplicaSet) for its pods."""
    selector = client.V1LabelSelector(match_labels={"app": name})
    template = template or pod_template(name)
    made = apps.create_namespaced_deployment(
        namespace,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name=name, labels=labels),
            spec=client.V1DeploymentSpec(selector=selector, template=template, replicas=replicas),
        ),
    )
    rs = apps.create_namespaced_replica_set(
        namespace,
        client.V1ReplicaSet(
            metadata=client.V1ObjectMeta(
                name=f"{name}-{REPLICA_SET_SUFFIX}",
                owner_references=[owner_ref("Deployment", made)],
            ),
            spec=client.V1ReplicaSetSpec(selector=selector, template=template),
        ),
    )
    return owner_ref("ReplicaSet", rs)


def running_pod(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    node: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str] | None,
    limits: dict[str, str] | None = None,
    owner: client.V1OwnerReference | None = None,
    scheduler_name: str | None = None,
) -> None:
    """A pod bound to ``node``, Running and Ready, as the kubelet would report it."""
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels=labels,
                annotations=annotations,
                owner_references=[owner] if owner else None,
            ),
            spec=client.V1PodSpec(
                node_name=node,
                scheduler_name=scheduler_name,
                termination_grace_period_seconds=30,
                containers=[
                    client.V1Container(
                        name="main",
                        image="registry.invalid/inference:1",
                        resources=client.V1ResourceRequirements(limits=limits),
                    )
                ],
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": RUNNING_AND_READY}, _content_type=MERGE_PATCH
    )


def kai_reservation(core: client.CoreV1Api, group: str, node: str, gpu_uuid: str) -> None:
    """KAI's reservation pod of a GPU group on ``node``, naming the GPU it reserved."""
    ensure_namespace(core, RESERVATION_NS)
    running_pod(
        core,
        RESERVATION_NS,
        f"gpu-reservation-{group}",
        node,
        labels={KAI_GROUP: group, "app": "kai-resource-reservation"},
        annotations={KAI_RESERVED_GPU: gpu_uuid},
        limits={"nvidia.com/gpu": "1"},
    )


def pdb(policy: client.PolicyV1Api, namespace: str, app: str, disruptions_allowed: int) -> None:
    """A PodDisruptionBudget over ``app=<app>`` (min 1 of 2) with the status the disruption
    controller would write: ``disruptionsAllowed`` decides whether an eviction gets a 429."""
    with contextlib.suppress(ApiException):
        policy.create_namespaced_pod_disruption_budget(
            namespace,
            client.V1PodDisruptionBudget(
                metadata=client.V1ObjectMeta(name=app),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=1,
                    selector=client.V1LabelSelector(match_labels={"app": app}),
                ),
            ),
        )
    generation = policy.read_namespaced_pod_disruption_budget(app, namespace).metadata
    status = {
        "observedGeneration": generation.generation,
        "disruptionsAllowed": disruptions_allowed,
        "currentHealthy": 2,
        "desiredHealthy": 2 - disruptions_allowed,
        "expectedPods": 2,
    }
    policy.patch_namespaced_pod_disruption_budget_status(
        app, namespace, {"status": status}, _content_type=MERGE_PATCH
    )


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pod_is_evicted(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Gone, or marked for deletion (no kubelet finishes a graceful deletion)."""
    pod = read_pod(core, namespace, name)
    return pod is None or pod.metadata.deletion_timestamp is not None
