"""A node's GPUs and a pod's GPU share, each read from its one object (API JSON). Pure.

:func:`node_gpus`: how many GPUs a node has and their memory (``nvidia.com/gpu``, the
``nvidia.com/gpu.*`` labels, or HAMi's register); :func:`backend_of`: which GPU-sharing
scheduler a pod uses; :func:`kai_share` and :func:`hami_gpu_share`: the share it holds and on
which GPU. A new way of holding a share changes these; how the cluster is assembled from them
is :func:`fracpilot_actuator.kube.inventory.build_inventory`. A value that cannot be right
raises ``ValueError`` or is a :class:`Problem`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fracpilot_actuator.kube.hami import hami_share, node_register
from fracpilot_actuator.kube.kai import memory_fraction
from fracpilot_actuator.kube.object_values import (
    GPU_RESOURCE,
    HAMI_ALLOCATED,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    KAI_FRACTION,
    KAI_MEMORY,
    NODE_GPU_COUNT,
    NODE_GPU_MEMORY,
    as_strings,
    get_path,
    parse_kai_fraction,
    parse_mib,
    parse_quantity_int,
)
from fracpilot_libs.contracts import GpuSharing
from fracpilot_libs.hami.register import RegisteredGpu


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
class NodeGpus:
    """A node's GPUs: how many, the memory of each, and HAMi's register of them."""

    name: str
    gpus: int
    memory_mib: int
    registered: tuple[RegisteredGpu, ...] = ()  # HAMi's register: the real GPUs


def node_gpus(obj: Mapping[str, Any], default_memory_mib: int, problems: list[Problem]) -> NodeGpus:
    name = str(get_path(obj, "metadata", "name"))
    labels = as_strings(get_path(obj, "metadata", "labels"))
    try:
        register = node_register(as_strings(get_path(obj, "metadata", "annotations")))
    except ValueError as exc:  # HAMi registers no GPU there either; its slots are not GPUs
        problems.append(Problem(f"node {name}", f"{exc}; no GPUs read"))
        return NodeGpus(name, 0, 0)
    if register is not None:  # HAMi: nvidia.com/gpu counts slots; the register has the GPUs
        problems += [Problem(f"node {name}", p) for p in register.problems]
        gpus = register.gpus
        return NodeGpus(name, len(gpus), gpus[0].memory_mib if gpus else 0, gpus)
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
    return NodeGpus(name, count, memory)


def pod_limits(pod: Mapping[str, Any]) -> dict[str, str]:
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


def kai_share(
    annotations: Mapping[str, str],
    group: str | None,
    node: NodeGpus,
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


def hami_gpu_share(
    annotations: Mapping[str, str], limits: Mapping[str, str], node: NodeGpus, memory_factor: int
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


def hami_held(share: GpuShare) -> dict[str, int]:
    """What HAMi counts against the GPU for a scheduled HAMi share (its allocated annotation)."""
    if share.backend is not GpuSharing.HAMI or share.cores is None or share.memory_mib is None:
        return {}
    return {"memory_mib": share.memory_mib, "cores": share.cores}
