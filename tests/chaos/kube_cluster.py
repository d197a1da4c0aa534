"""A KAI-style GPU cluster written into the real apiserver, as controllers would leave it.

No scheduler, controllers or kubelet run (see tests/k8s_control_plane.py): the test writes
nodes with GPU capacity, KAI's reservation pods (GPU group -> GPU UUID), Deployments with
their ReplicaSets, and each Deployment's pods bound to nodes, Running and Ready, holding a
``gpu-fraction``. Every node carries ``fracpilot.io/test=<namespace>`` so that an actuator
planning only on those stays apart from other tests sharing the control plane. An evicted
pod stays terminating (no kubelet finishes it).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_libs.contracts import MIB, Allocation, WorkloadRef, utcnow

MERGE_PATCH = "application/merge-patch+json"
MEM_MIB = 81920
RESERVATION_NS = "kai-resource-reservation"


@dataclass
class GpuCluster:
    api: client.ApiClient
    namespace: str
    cluster: str = "chaos"
    gpus: dict[str, str] = field(default_factory=dict)  # GPU UUID -> node
    pods: dict[str, tuple[str, str, float]] = field(default_factory=dict)  # pod -> (wl, gpu, f)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)

    @property
    def selector(self) -> str:
        return f"fracpilot.io/test={self.namespace}"

    def workload(self, name: str) -> WorkloadRef:
        return WorkloadRef(cluster=self.cluster, namespace=self.namespace, owner_name=name)

    def node(self, name: str, gpus: int) -> list[str]:
        """A node with ``gpus`` GPUs; returns their UUIDs (KAI learns them from reservations)."""
        name = f"{name}-{self.namespace}"
        labels = {"fracpilot.io/test": self.namespace, "nvidia.com/gpu.memory": str(MEM_MIB)}
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        self.core.patch_node_status(
            name,
            {"status": {"capacity": resources, "allocatable": resources}},
            _content_type=MERGE_PATCH,
        )
        uuids = [f"GPU-{uuid.uuid4()}" for _ in range(gpus)]
        for gpu in uuids:
            self.gpus[gpu] = name
        return uuids

    def _group(self, gpu: str) -> str:
        return f"g-{gpu[4:12]}"

    def reserve(self, gpu: str) -> None:
        """KAI's reservation pod of the GPU's group, naming the GPU."""
        with contextlib.suppress(ApiException):
            self.core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=RESERVATION_NS))
            )
        group = self._group(gpu)
        self._pod(
            f"gpu-reservation-{group}",
            self.gpus[gpu],
            RESERVATION_NS,
            labels={"runai-gpu-group": group, "app": "kai-resource-reservation"},
            annotations={"run.ai/reserve_for_gpu_index": gpu},
            limits={"nvidia.com/gpu": "1"},
        )

    def deployment(self, name: str) -> client.V1OwnerReference:
        """A Deployment and its ReplicaSet; the owner reference for its pods."""
        selector = client.V1LabelSelector(match_labels={"app": name})
        template = client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels={"app": name}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="x")]),
        )
        deploy = self.apps.create_namespaced_deployment(
            self.namespace,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name=name),
                spec=client.V1DeploymentSpec(selector=selector, template=template, replicas=2),
            ),
        )
        rs = self.apps.create_namespaced_replica_set(
            self.namespace,
            client.V1ReplicaSet(
                metadata=client.V1ObjectMeta(
                    name=f"{name}-6b7f9c", owner_references=[_owner("Deployment", deploy)]
                ),
                spec=client.V1ReplicaSetSpec(selector=selector, template=template),
            ),
        )
        return _owner("ReplicaSet", rs)

    def kai_pod(self, name: str, owner: client.V1OwnerReference, gpu: str, fraction: float) -> None:
        self._pod(
            name,
            self.gpus[gpu],
            self.namespace,
            labels={"app": owner.name.rsplit("-", 1)[0], "runai-gpu-group": self._group(gpu)},
            annotations={"gpu-fraction": f"{fraction:g}"},
            owner=owner,
        )
        self.pods[name] = (owner.name.rsplit("-", 1)[0], gpu, fraction)

    def _pod(
        self,
        name: str,
        node: str,
        namespace: str,
        *,
        labels: dict[str, str],
        annotations: dict[str, str],
        limits: dict[str, str] | None = None,
        owner: client.V1OwnerReference | None = None,
    ) -> None:
        self.core.create_namespaced_pod(
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
        self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
            _content_type=MERGE_PATCH,
        )

    def allocations(self) -> list[Allocation]:
        """What the actuator would have published for the pods as they start (one per
        workload), so that the fractions are known from the first decision on."""
        seen: dict[str, Allocation] = {}
        for pod, (wl, gpu, fraction) in sorted(self.pods.items()):
            seen.setdefault(
                wl,
                Allocation(
                    workload=self.workload(wl),
                    pod=pod,
                    node=self.gpus[gpu],
                    gpu_uuid=gpu,
                    fraction=fraction,
                    device_memory_bytes=MEM_MIB * MIB,
                    updated_at=utcnow(),
                ),
            )
        return list(seen.values())

    def decision_of_evicted_pods(self) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> the decision its FractionEvictionRequested Events name."""
        found: dict[tuple[str, str], str] = {}
        for event in self.core.list_namespaced_event(self.namespace).items:
            if event.reason != "FractionEvictionRequested":
                continue
            marker = "(decision "
            message = event.message or ""
            if marker in message:
                decision = message.split(marker, 1)[1].split(":", 1)[0]
                found[(self.namespace, event.involved_object.name)] = decision
        return found

    def evicted(self, pod: str) -> bool:
        try:
            found = self.core.read_namespaced_pod(pod, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return found.metadata.deletion_timestamp is not None


def _owner(kind: str, obj: client.V1Deployment | client.V1ReplicaSet) -> client.V1OwnerReference:
    return client.V1OwnerReference(
        api_version="apps/v1",
        kind=kind,
        name=obj.metadata.name,
        uid=obj.metadata.uid,
        controller=True,
    )
