"""KAI-Scheduler's objects written into a real kube-apiserver, as KAI would leave them, for the
tests that run no KAI (tests/integration/k8s): its CRDs (vendored from NVIDIA/KAI-scheduler
v0.12.0 in tests/integration/k8s/crds), Queues with the status its queue controller writes,
the BindRequest its scheduler writes for a pod it chose a node and GPU group for, and a
Deployment's two pods sharing one GPU group.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml
from kubernetes import client

from fracpilot_libs.contracts import WorkloadRef
from support import kube
from support.policy_crds import install_crds

CRD_DIR = Path(__file__).resolve().parents[1] / "integration" / "k8s" / "crds"
CRDS = ("scheduling.run.ai_queues.yaml", "scheduling.run.ai_bindrequests.yaml")
QUEUE_LABEL = "kai.scheduler/queue"
GROUP, QUEUE_VERSION, BIND_REQUEST_VERSION = "scheduling.run.ai", "v2", "v1alpha2"


def install_kai_crds(api: client.ApiClient) -> None:
    """Apply KAI's Queue and BindRequest CRDs and wait until they are served."""
    install_crds(api, [yaml.safe_load((CRD_DIR / name).read_text()) for name in CRDS])


def queue(
    api: client.ApiClient, name: str, *, quota: float, limit: float, allocated: Mapping[str, str]
) -> None:
    """A Queue with a GPU quota and limit, and ``allocated`` in its status (resource name ->
    quantity) as KAI's queue controller would write it."""
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": f"{GROUP}/{QUEUE_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"resources": {"gpu": {"quota": quota, "limit": limit, "overQuotaWeight": 1}}},
    }
    custom.create_cluster_custom_object(GROUP, QUEUE_VERSION, "queues", body)
    custom.patch_cluster_custom_object_status(
        GROUP, QUEUE_VERSION, "queues", name, {"status": {"allocated": dict(allocated)}}
    )


def bind_request(api: client.ApiClient, ns: str, pod: str, node: str, group: str) -> None:
    """What KAI's scheduler writes for a pod it chose a node and GPU group for (half a GPU)."""
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP,
        BIND_REQUEST_VERSION,
        ns,
        "bindrequests",
        {
            "apiVersion": f"{GROUP}/{BIND_REQUEST_VERSION}",
            "kind": "BindRequest",
            "metadata": {"name": pod},
            "spec": {
                "podName": pod,
                "selectedNode": node,
                "selectedGPUGroups": [group],
                "receivedResourceType": "Fraction",
                "receivedGPU": {"count": 1, "portion": "0.50"},
            },
        },
    )


def pending_pod(
    core: client.CoreV1Api, ns: str, name: str, labels: Mapping[str, str] | None = None
) -> None:
    """A pod asking KAI for half a GPU, not bound yet."""
    core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                annotations={"gpu-fraction": "0.5"},
                labels=dict(labels) if labels is not None else None,
            ),
            spec=client.V1PodSpec(
                scheduler_name="kai-scheduler",
                containers=[client.V1Container(name="main", image="registry.invalid/x")],
            ),
        ),
    )


def chat_sharing_a_gpu(
    api: client.ApiClient, ns: str, queue_name: str
) -> tuple[str, str, WorkloadRef]:
    """One GPU node (labelled ``fracpilot.io/test=<ns>``), a reserved GPU group ``g-<ns>`` and
    Deployment ``chat`` with two KAI pods at 0.25 in it, in ``queue_name``: the node, the GPU's
    UUID and the workload."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    node = kube.gpu_node(core, f"gpu-{ns}", 2, {"fracpilot.io/test": ns})
    group, gpu = f"g-{ns}", f"GPU-{ns}"
    kube.kai_reservation(core, group, node, gpu)
    owner = kube.deployment(apps, ns, "chat", labels={QUEUE_LABEL: queue_name})
    for i in range(2):
        kube.running_pod(
            core,
            ns,
            f"chat-{i}",
            node,
            labels={"app": "chat", kube.KAI_GROUP: group, QUEUE_LABEL: queue_name},
            annotations={"gpu-fraction": "0.25"},
            owner=owner,
        )
    workload = WorkloadRef(cluster="test", namespace=ns, owner_kind="Deployment", owner_name="chat")
    return node, gpu, workload
