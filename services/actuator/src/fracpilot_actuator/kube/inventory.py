"""The cluster's GPUs and who holds how much of each, derived from Node and Pod objects. Pure.

Input is what the API returns (JSON dicts in the API's camelCase, or the client's models,
which :func:`as_api_dict` turns into the same dicts); time is passed in, nothing is read.

- A node's GPUs: ``status.allocatable["nvidia.com/gpu"]`` (or capacity, or the label
  ``nvidia.com/gpu.count``); their memory: the label ``nvidia.com/gpu.memory`` (MiB), else a
  default, reported as a problem.
- KAI Scheduler pods hold a share through the annotation ``gpu-fraction`` (portion of one
  GPU, 0 < f < 1) or ``gpu-memory`` (MiB, an integer). Which GPU: the reservation pod of the
  pod's ``runai-gpu-group`` (namespace and app label: the binder's flags, :mod:`.kai`) names
  it in its annotation ``run.ai/reserve_for_gpu_index``; until it does, the GPU is the
  synthetic ``<node>/group/<group>`` (``<node>/unknown`` without a group). A ``gpu-memory``
  share is the fraction KAI counts (:func:`~.kai.memory_fraction`); a pod KAI chose a node for
  but did not bind yet counts there (its BindRequest); a multi-device fraction pod counts on
  each of its GPUs.
- HAMi pods hold a share through the limits ``nvidia.com/gpumem`` (MiB),
  ``nvidia.com/gpumem-percentage`` or ``nvidia.com/gpucores``; once scheduled, the annotation
  ``hami.io/vgpu-devices-allocated`` (``UUID,type,memMiB,cores:`` per device, ``;`` per
  container) says which GPU and how much memory: fraction = memMiB / device memory.
  A node with HAMi's ``hami.io/node-nvidia-register`` has the GPUs it lists (its
  ``nvidia.com/gpu`` counts sharing slots, not GPUs): :mod:`fracpilot_actuator.kube.hami`.
- Pods asking for whole ``nvidia.com/gpu`` (and no share) take whole GPUs of their node; the
  node's GPUs nobody is known to hold are ``<node>/free-<i>``.
- fracpilot's own capacity placeholders are no workload's pods, but a bound one holds its GPU
  whole (:func:`placeholder_gpu`, or the GPU HAMi gave it) and its CPU and memory, so no other
  decision plans onto the capacity a scale-up is waiting to use.
- What kube-scheduler's predicates need to say where a recreated pod may go (labels, taints,
  allocatable CPU and memory of every node; requests, selectors, affinity and tolerations of
  every other pod): :attr:`Inventory.facts`, :mod:`fracpilot_libs.placement.predicates`.

A value that cannot be right (``gpu-fraction: "abc"``, ``"1.5"``, ``"-1"``, a HAMi annotation
that does not parse) is a :class:`Problem` naming the pod; that pod holds no placement, and
the rest of the cluster is read as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fracpilot_actuator.kube.gpu_shares import (
    GpuShare,
    NodeGpus,
    Problem,
    backend_of,
    hami_gpu_share,
    hami_held,
    kai_share,
    node_gpus,
    pod_limits,
)
from fracpilot_actuator.kube.hami import registered_gpus
from fracpilot_actuator.kube.kai import (
    BindTarget,
    is_multi_device,
    is_reservation,
    multi_device_gpus,
)
from fracpilot_actuator.kube.object_values import (
    CAPACITY_ROLE,
    GPU_RESOURCE,
    KAI_GROUP,
    KAI_RESERVED_GPU,
    RESIZED_AT,
    ROLE,
    as_api_dict,
    as_strings,
    get_path,
    parse_quantity_int,
    parse_time,
)
from fracpilot_libs.contracts import MIB, GpuSharing, WorkloadRef
from fracpilot_libs.kai import KaiSettings
from fracpilot_libs.owners import Controller, OwnerKey, top_owner
from fracpilot_libs.placement.planner import ClusterState, Gpu, NodeOkFor, Placement
from fracpilot_libs.placement.predicates import node_ok_for
from fracpilot_libs.placement.scheduling_facts import (
    ClusterFacts,
    NodeFacts,
    PodFacts,
    node_facts,
    pod_facts,
    pods_by_node,
)

# --- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    terminating: bool
    created_at: datetime | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    controller: Controller | None
    backend: GpuSharing | None  # what the pod uses, even when its value is bad
    share: GpuShare | None  # None: no share, or a bad value (see problems)
    whole_gpus: int
    resource_version: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def resized_at(self) -> datetime | None:
        return parse_time(self.annotations.get(RESIZED_AT))

    @property
    def last_change(self) -> datetime | None:
        """When the pod last changed as far as sizing goes: created, or resized in place."""
        times = [t for t in (self.created_at, self.resized_at) if t is not None]
        return max(times) if times else None


@dataclass(frozen=True)
class Inventory:
    state: ClusterState
    pods: Mapping[str, PodInfo]  # by namespace/name, workload pods only
    problems: tuple[Problem, ...]
    placeholders: tuple[PodInfo, ...] = ()
    hami_memory_factor: int = 1  # HAMi's memoryFactor: nvidia.com/gpumem is in its units
    facts: ClusterFacts | None = None  # for the placement predicates; None: not read

    def node_ok_for(self, backend: GpuSharing | None) -> NodeOkFor | None:
        """Where each pod's replacement may go (kube-scheduler's predicates on what was read;
        KAI-Scheduler v0.12 runs no topology spread filter); None: anywhere."""
        if self.facts is None:
            return None
        return node_ok_for(self.facts, spread=backend is not GpuSharing.KAI)

    def problems_of(self, pods: Iterable[PodInfo]) -> tuple[Problem, ...]:
        subjects = {f"pod {p.key}" for p in pods}
        return tuple(p for p in self.problems if p.subject in subjects)

    def placements_of(self, pods: Iterable[PodInfo]) -> tuple[Placement, ...]:
        keys = {p.key for p in pods}
        return tuple(p for p in self.state.placements if p.pod_key in keys)

    def gpu_node(self, gpu_uuid: str) -> str:
        gpu = self.state.gpu(gpu_uuid)
        return gpu.node if gpu else ""

    def pods_of(
        self, workload: WorkloadRef, parents: Mapping[OwnerKey, Controller]
    ) -> tuple[PodInfo, ...]:
        """The workload's pods (owner references through ReplicaSets and Jobs), by name."""
        wanted = (workload.owner_kind, workload.owner_name)
        return tuple(
            sorted(
                (
                    p
                    for p in self.pods.values()
                    if p.namespace == workload.namespace
                    and top_owner(p.namespace, p.controller, parents, p.name) == wanted
                ),
                key=lambda p: p.name,
            )
        )


def controller_of(obj: Mapping[str, Any]) -> Controller | None:
    for ref in get_path(obj, "metadata", "ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def owner_parents(objects: Iterable[Any], kind: str) -> dict[OwnerKey, Controller]:
    """ReplicaSets or Jobs (``kind``) -> their own controller (Deployment, CronJob)."""
    parents: dict[OwnerKey, Controller] = {}
    for raw in objects:
        obj = as_api_dict(raw)
        parent = controller_of(obj)
        if parent is not None:
            meta = obj.get("metadata") or {}
            parents[(str(meta.get("namespace")), kind, str(meta.get("name")))] = parent
    return parents


def build_inventory(
    nodes: Sequence[Any],
    pods: Sequence[Any],
    *,
    cluster: str,
    default_gpu_memory_mib: int,
    hami_memory_factor: int = 1,
    kai: KaiSettings | None = None,
    bound: Mapping[str, BindTarget] | None = None,
) -> Inventory:
    """Everything the planner and the guardrails need, from one listing of nodes and pods.

    ``kai``: where KAI's reservation pods are (its binder's flags); ``bound``: KAI's
    BindRequests by ``ns/pod`` (:func:`~fracpilot_actuator.kube.kai.bind_targets`): a pod not
    bound yet counts on the node (and GPU group) KAI chose for it, as KAI counts it."""
    kai, bound = kai or KaiSettings(), bound or {}
    problems: list[Problem] = []
    node_by_name: dict[str, NodeGpus] = {}
    facts_of_nodes: dict[str, NodeFacts] = {}
    for raw in nodes:
        obj = as_api_dict(raw)
        parsed = node_gpus(obj, default_gpu_memory_mib, problems)
        if parsed.gpus:
            node_by_name[parsed.name] = parsed
        try:
            facts_of_nodes[parsed.name] = node_facts(obj)
        except ValueError as exc:  # the predicates then refuse the node for a recreate
            problems.append(Problem(f"node {parsed.name}", f"allocatable: {exc}"))

    live = [
        p
        for p in map(as_api_dict, pods)
        if get_path(p, "status", "phase") not in ("Succeeded", "Failed")
    ]
    reserved: dict[str, str] = {}  # KAI gpu group -> GPU UUID
    for pod in live:
        meta = pod.get("metadata") or {}
        labels = as_strings(meta.get("labels"))
        uuid = (meta.get("annotations") or {}).get(KAI_RESERVED_GPU)
        if is_reservation(str(meta.get("namespace", "")), labels, kai) and uuid:
            reserved[labels[KAI_GROUP]] = str(uuid)

    infos: dict[str, PodInfo] = {}
    placeholders: list[PodInfo] = []
    facts_of_pods: list[PodFacts] = []
    placements: list[Placement] = []
    held: dict[str, set[str]] = {}  # node -> GPU ids with shares on them
    whole: dict[str, int] = {}  # node -> whole GPUs held by pods without a share
    for pod in live:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        labels, annotations = as_strings(meta.get("labels")), as_strings(meta.get("annotations"))
        target = bound.get(f"{namespace}/{name}") or BindTarget("")  # KAI's choice, unbound
        node_name = str(get_path(pod, "spec", "nodeName") or "") or target.node
        node = node_by_name.get(node_name)
        subject = f"pod {namespace}/{name}"
        try:
            limits = pod_limits(pod)
        except ValueError as exc:
            problems.append(Problem(subject, str(exc)))
            limits = {}
        backend = backend_of(annotations, limits)
        reservation = is_reservation(namespace, labels, kai)
        share: GpuShare | None = None
        whole_gpus = 0
        try:
            if backend is not None and node is not None:
                if backend is GpuSharing.KAI:
                    group = labels.get(KAI_GROUP) or next(iter(target.groups), None)
                    share = kai_share(annotations, group, node, reserved)
                else:
                    share = hami_gpu_share(annotations, limits, node, hami_memory_factor)
            elif backend is not None and node_name:
                raise ValueError(f"it runs on node {node_name}, which reports no GPUs")
            elif backend is None and not reservation and GPU_RESOURCE in limits:
                whole_gpus = parse_quantity_int(limits[GPU_RESOURCE])
        except ValueError as exc:
            problems.append(Problem(subject, str(exc)))
        info = PodInfo(
            namespace=namespace,
            name=name,
            uid=str(meta.get("uid", "")),
            node=node_name,
            phase=str(get_path(pod, "status", "phase") or "Pending"),
            terminating=meta.get("deletionTimestamp") is not None,
            created_at=parse_time(meta.get("creationTimestamp")),
            labels=labels,
            annotations=annotations,
            controller=controller_of(pod),
            backend=backend,
            share=share,
            whole_gpus=whole_gpus,
            resource_version=str(meta.get("resourceVersion", "")),
            raw=pod,
        )
        if labels.get(ROLE) == CAPACITY_ROLE:
            placeholders.append(info)
            if node is not None:  # bound: its GPU is taken for the pod it was made for
                with contextlib.suppress(ValueError):
                    facts_of_pods.append(pod_facts(pod))
                gpu_id = share.gpu_uuid if share is not None else placeholder_gpu(info)
                held.setdefault(node.name, set()).add(gpu_id)
                placements.append(
                    Placement(
                        workload=WorkloadRef(
                            cluster=cluster, namespace=namespace, owner_kind="Pod", owner_name=name
                        ),
                        pod=name,
                        gpu_uuid=gpu_id,
                        fraction=share.fraction if share is not None else 1.0,
                        **(hami_held(share) if share is not None else {}),
                    )
                )
            continue
        # The API validated its quantities: only a fake's pod can have no facts.
        with contextlib.suppress(ValueError):
            facts_of_pods.append(pod_facts(pod))
        if reservation:
            if node is not None and (group := labels.get(KAI_GROUP)):
                held.setdefault(node.name, set()).add(
                    reserved.get(group, f"{node.name}/group/{group}")
                )
            continue
        infos[info.key] = info
        if node is not None and whole_gpus:
            whole[node.name] = whole.get(node.name, 0) + whole_gpus
        if share is not None and node is not None:
            gpu_ids: tuple[str, ...] = (share.gpu_uuid,)
            if backend is GpuSharing.KAI and is_multi_device(annotations, labels):
                # A share of each of several GPUs (kai.py): counted on all, never resized.
                gpu_ids = multi_device_gpus(
                    node.name, info.uid, annotations, labels, reserved, target.groups
                )
            kind, owner = info.controller or ("Pod", name)
            for gpu_id in gpu_ids:
                held.setdefault(node.name, set()).add(gpu_id)
                placements.append(
                    Placement(
                        workload=WorkloadRef(
                            cluster=cluster, namespace=namespace, owner_kind=kind, owner_name=owner
                        ),
                        pod=name,
                        gpu_uuid=gpu_id,
                        fraction=share.fraction,
                        **hami_held(share),
                    )
                )

    gpus: list[Gpu] = []
    for node in node_by_name.values():
        if node.registered:  # HAMi: its GPUs, and any share on a GPU it did not register
            gpus += registered_gpus(node.name, node.registered)
            others = sorted(held.get(node.name, set()) - {g.uuid for g in node.registered})
            memory = node.memory_mib * MIB
            gpus += [Gpu(uuid=u, node=node.name, memory_bytes=memory) for u in others]
            continue
        ids = sorted(held.get(node.name, ()))
        taken = len(ids) + whole.get(node.name, 0)
        if taken > node.gpus:
            problems.append(
                Problem(f"node {node.name}", f"{taken} GPUs are in use but it has {node.gpus}")
            )
        ids += [f"{node.name}/free-{i}" for i in range(max(0, node.gpus - taken))]
        gpus += [Gpu(uuid=u, node=node.name, memory_bytes=node.memory_mib * MIB) for u in ids]
    return Inventory(
        state=ClusterState(gpus=tuple(gpus), placements=tuple(placements)),
        pods=infos,
        problems=tuple(problems),
        placeholders=tuple(placeholders),
        hami_memory_factor=hami_memory_factor,
        facts=ClusterFacts(facts_of_nodes, pods_by_node(facts_of_pods)),
    )


def placeholder_gpu(pod: PodInfo) -> str:
    """The GPU a bound placeholder holds whole (KAI: kube-scheduler counts nvidia.com/gpu and
    names no GPU), as the inventory lists it."""
    return f"{pod.node}/placeholder/{pod.namespace}/{pod.name}"


def last_change(pods: Iterable[PodInfo]) -> datetime | None:
    """The workload's last change: its newest pod, or its latest in-place resize."""
    times = [t for p in pods if (t := p.last_change) is not None]
    return max(times) if times else None
