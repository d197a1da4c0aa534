"""A KAI-style GPU cluster written into the real apiserver, as controllers would leave it.

No scheduler, controllers or kubelet run (see tests/k8s_control_plane.py; the objects are
written by tests/support/kube.py): the test writes
nodes with GPU capacity, KAI's reservation pods (GPU group -> GPU UUID), Deployments with
their ReplicaSets, and each Deployment's pods bound to nodes, Running and Ready, holding a
``gpu-fraction``. Every node carries ``fracpilot.io/test=<namespace>`` so that an actuator
planning only on those stays apart from other tests sharing the control plane. An evicted
pod stays terminating (no kubelet finishes it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kubernetes import client

from fracpilot_libs.contracts import MIB, Allocation, WorkloadRef, utcnow
from support import kube
from support.kube import MEM_MIB


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
        kube.gpu_node(
            self.core, name, gpus, {"fracpilot.io/test": self.namespace}, cpu="64", memory="256Gi"
        )
        uuids = [f"GPU-{uuid.uuid4()}" for _ in range(gpus)]
        for gpu in uuids:
            self.gpus[gpu] = name
        return uuids

    def _group(self, gpu: str) -> str:
        return f"g-{gpu[4:12]}"

    def reserve(self, gpu: str) -> None:
        """KAI's reservation pod of the GPU's group, naming the GPU."""
        kube.kai_reservation(self.core, self._group(gpu), self.gpus[gpu], gpu)

    def deployment(self, name: str) -> client.V1OwnerReference:
        """A Deployment and its ReplicaSet; the owner reference for its pods."""
        return kube.deployment(self.apps, self.namespace, name, replicas=2)

    def kai_pod(self, name: str, owner: client.V1OwnerReference, gpu: str, fraction: float) -> None:
        kube.running_pod(
            self.core,
            self.namespace,
            name,
            self.gpus[gpu],
            labels={"app": owner.name.rsplit("-", 1)[0], kube.KAI_GROUP: self._group(gpu)},
            annotations={"gpu-fraction": f"{fraction:g}"},
            owner=owner,
        )
        self.pods[name] = (owner.name.rsplit("-", 1)[0], gpu, fraction)

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
        return kube.pod_is_evicted(self.core, self.namespace, pod)
