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

from fracpilot_actuator.kube.hami import hami_share, node_register, registered_gpus
from fracpilot_actuator.kube.kai import (
    BindTarget,
    is_multi_device,
    is_reservation,
    memory_fraction,
    multi_device_gpus,
)
from fracpilot_actuator.kube.object_values import (
    CAPACITY_ROLE,
    GPU_RESOURCE,
    HAMI_ALLOCATED,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    KAI_FRACTION,
    KAI_GROUP,
    KAI_MEMORY,
    KAI_RESERVED_GPU,
    NODE_GPU_COUNT,
    NODE_GPU_MEMORY,
    RESIZED_AT,
    ROLE,
    as_api_dict,
    as_strings,
    get_path,
    parse_kai_fraction,
    parse_mib,
    parse_quantity_int,
    parse_time,
)
from fracpilot_libs.contracts import MIB, GpuSharing, WorkloadRef
from fracpilot_libs.hami.register import RegisteredGpu
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
class Problem:
    """Something in the cluster that cannot be right; ``subject`` is ``pod ns/name``/``node n``."""

    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass(frozen=True)
class GpuShare:
    backend: GpuSharing
    fraction: float
    gpu_uuid: str  # real UUID, or a synthetic id when the pod's GPU is not known
    memory_mib: int | None = None
    kai_key: str | None = None  # the KAI annotation the pod uses: gpu-fraction or gpu-memory
    cores: int | None = None  # HAMi: the cores HAMi counts for it (allocated annotation)


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


@dataclass(frozen=True)
class _Node:
    name: str
    gpus: int
    memory_mib: int
    registered: tuple[RegisteredGpu, ...] = ()  # HAMi's register: the real GPUs


def _node(obj: Mapping[str, Any], default_memory_mib: int, problems: list[Problem]) -> _Node:
    name = str(get_path(obj, "metadata", "name"))
    labels = as_strings(get_path(obj, "metadata", "labels"))
    try:
        register = node_register(as_strings(get_path(obj, "metadata", "annotations")))
    except ValueError as exc:  # HAMi registers no GPU there either; its slots are not GPUs
        problems.append(Problem(f"node {name}", f"{exc}; no GPUs read"))
        return _Node(name, 0, 0)
    if register is not None:  # HAMi: nvidia.com/gpu counts slots; the register has the GPUs
        problems += [Problem(f"node {name}", p) for p in register.problems]
        gpus = register.gpus
        return _Node(name, len(gpus), gpus[0].memory_mib if gpus else 0, gpus)
    count_text = (
        (get_path(obj, "status", "allocatable") or {}).get(GPU_RESOURCE)
        or (get_path(obj, "status", "capacity") or {}).get(GPU_RESOURCE)
        or labels.get(NODE_GPU_COUNT)
        or "0"
    )
    try:
        count = parse_quantity_int(count_text)
    except ValueError as exc:
        problems.append(Problem(f"node {name}", f"GPU count: {exc}"))
        count = 0
    memory = default_memory_mib
    if count:
        if NODE_GPU_MEMORY in labels:
            try:
                memory = parse_mib(labels[NODE_GPU_MEMORY], f"label {NODE_GPU_MEMORY}")
            except ValueError as exc:
                problems.append(Problem(f"node {name}", f"{exc}; assuming {memory} MiB"))
        else:
            problems.append(
                Problem(f"node {name}", f"no label {NODE_GPU_MEMORY}; assuming {memory} MiB")
            )
    return _Node(name, count, memory)


def _limits(pod: Mapping[str, Any]) -> dict[str, str]:
    """Extended resources of the pod's containers, summed (requests equal limits for them)."""
    total: dict[str, str] = {}
    for container in get_path(pod, "spec", "containers") or ():
        resources = container.get("resources") or {}
        merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in merged.items():
            if name.startswith("nvidia.com/"):
                if name in total and name == GPU_RESOURCE:
                    total[name] = str(parse_quantity_int(total[name]) + parse_quantity_int(value))
                else:
                    total.setdefault(name, str(value))
    return total


def _kai_share(
    annotations: Mapping[str, str],
    group: str | None,
    node: _Node,
    reserved: Mapping[str, str],
) -> GpuShare:
    if KAI_FRACTION in annotations and KAI_MEMORY in annotations:
        raise ValueError(f"both {KAI_FRACTION} and {KAI_MEMORY} are set (KAI allows one)")
    if KAI_FRACTION in annotations:
        fraction, memory, key = parse_kai_fraction(annotations[KAI_FRACTION]), None, KAI_FRACTION
    else:
        memory = parse_mib(annotations[KAI_MEMORY], KAI_MEMORY)
        if memory > node.memory_mib:
            raise ValueError(
                f"{KAI_MEMORY} {memory} MiB is more than the GPU's {node.memory_mib} MiB"
            )
        fraction, key = min(1.0, memory_fraction(memory, node.memory_mib)), KAI_MEMORY
    if group and group in reserved:
        uuid = reserved[group]
    elif group:
        uuid = f"{node.name}/group/{group}"
    else:
        uuid = f"{node.name}/unknown"
    return GpuShare(GpuSharing.KAI, fraction, uuid, memory, key)


def _hami_share(
    annotations: Mapping[str, str], limits: Mapping[str, str], node: _Node, memory_factor: int
) -> GpuShare:
    share = hami_share(
        annotations,
        limits,
        node=node.name,
        gpus={g.uuid: g for g in node.registered},
        default_memory_mib=node.memory_mib,
        memory_factor=memory_factor,
    )
    return GpuShare(
        GpuSharing.HAMI, share.fraction, share.gpu_uuid, share.memory_mib, cores=share.cores
    )


def backend_of(annotations: Mapping[str, str], limits: Mapping[str, str]) -> GpuSharing | None:
    """KAI when a KAI annotation is there, HAMi when a HAMi limit or annotation is."""
    if KAI_FRACTION in annotations or KAI_MEMORY in annotations:
        return GpuSharing.KAI
    if HAMI_ALLOCATED in annotations or any(
        r in limits for r in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)
    ):
        return GpuSharing.HAMI
    return None


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
    node_by_name: dict[str, _Node] = {}
    facts_of_nodes: dict[str, NodeFacts] = {}
    for raw in nodes:
        obj = as_api_dict(raw)
        parsed = _node(obj, default_gpu_memory_mib, problems)
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
            limits = _limits(pod)
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
                    share = _kai_share(annotations, group, node, reserved)
                else:
                    share = _hami_share(annotations, limits, node, hami_memory_factor)
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
                        **(_hami_held(share) if share is not None else {}),
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
                        **_hami_held(share),
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


def _hami_held(share: GpuShare) -> dict[str, int]:
    """What HAMi counts against the GPU for a scheduled HAMi share (its allocated annotation)."""
    if share.backend is not GpuSharing.HAMI or share.cores is None or share.memory_mib is None:
        return {}
    return {"memory_mib": share.memory_mib, "cores": share.cores}


def last_change(pods: Iterable[PodInfo]) -> datetime | None:
    """The workload's last change: its newest pod, or its latest in-place resize."""
    times = [t for p in pods if (t := p.last_change) is not None]
    return max(times) if times else None
