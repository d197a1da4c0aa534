"""KAI-Scheduler's shapes: its reservation pods, multi-device fraction pods, BindRequests, and
the numbers it derives from a fraction. Pure.

Written from NVIDIA/KAI-scheduler v0.12.0 (Go module ``github.com/NVIDIA/KAI-scheduler``);
paths below are upstream's.

- Reservation pods: the binder puts them in ``--resource-reservation-namespace`` with the label
  ``app=<--resource-reservation-app-label>`` (:class:`fracpilot_libs.kai.KaiSettings`, the
  ``FRACPILOT_KAI_*`` settings the ingest reads too); the scheduler tells them by that label
  (``pkg/scheduler/api/pod_info/utility_pods.go`` ``IsResourceReservationTask``).
- Multi-device fraction pods: ``gpu-fraction-num-devices`` (``GpuFractionsNumDevices``) asks
  for that many GPUs, each with the pod's fraction or ``gpu-memory``
  (``pod_info.go`` ``updatePodAdditionalFields``); their groups are the labels
  ``runai-gpu-group/<g>=<g>`` (``MultiGpuGroupLabelPrefix``; ``pkg/common/resources/
  gpu_sharing.go`` ``GetGpuGroups``). fracpilot resizes a share of one GPU: such a pod is
  refused (:func:`multi_device_refusal`), and counted on every GPU it holds.
- BindRequests (``scheduling.run.ai/v1alpha2``, named after the pod, in its namespace;
  ``pkg/scheduler/cache/cache.go`` ``createBindRequest``): until the pod is bound, KAI counts it
  on ``spec.selectedNode`` and its ``spec.selectedGPUGroups``
  (``pod_info.go`` ``NewTaskInfoWithBindRequest``), unless the request failed for good
  (``bindrequest_info`` ``IsFailed``).
- Numbers: the container gets ``GPU_PORTION`` formatted ``%.2f`` (``cache.go``), quota counts
  ``round(portion * 100) / 100`` (``pkg/scheduler/api/resource_info/
  gpu_resource_requirment.go`` ``getNonMigGpus``); a node's GPU memory is its label floored to
  100 MiB (``pkg/scheduler/api/node_info/node_info.go`` ``getNodeGpuMemory``) and a
  ``gpu-memory`` request is the fraction ``ceil(MiB / that * 100) / 100``
  (``gpu_sharing_node_info.go`` ``getGpuMemoryFractionalOnNode``). :func:`kai_fraction` and
  :func:`kai_memory_mib` choose values these formulas turn back into the planned fraction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fracpilot_actuator.kube.object_values import KAI_GROUP, as_api_dict, get_path
from fracpilot_libs.kai import KAI_APP_LABEL, KaiSettings

KAI_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_MULTI_GROUP_PREFIX = f"{KAI_GROUP}/"

BIND_REQUEST_GROUP, BIND_REQUEST_VERSION, BIND_REQUEST_PLURAL = (
    "scheduling.run.ai",
    "v1alpha2",
    "bindrequests",
)

PORTION_STEPS = 100  # gpuPortionsAsDecimalsRoundingFactor; GPU_PORTION "%.2f"
MEMORY_FLOOR_MIB = 100  # getNodeGpuMemory floors the node's label to 100 MiB
EPS = 1e-9


def is_reservation(namespace: str, labels: Mapping[str, str], settings: KaiSettings) -> bool:
    """A KAI GPU reservation pod (its namespace, its app label, its GPU group)."""
    return (
        namespace == settings.reservation_namespace
        and labels.get(KAI_APP_LABEL) == settings.reservation_app_label
        and KAI_GROUP in labels
    )


# --- multi-device fraction pods ---------------------------------------------------------------


def fraction_devices(annotations: Mapping[str, str]) -> int:
    """How many GPUs a fraction pod asks for (``gpu-fraction-num-devices``, default 1)."""
    text = annotations.get(KAI_NUM_DEVICES, "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{KAI_NUM_DEVICES} {text!r} is not a positive whole number")
    return int(text)


def multi_groups(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The ``runai-gpu-group/<g>`` groups of a multi-device pod, sorted."""
    return tuple(sorted(v for k, v in labels.items() if k.startswith(KAI_MULTI_GROUP_PREFIX) and v))


def is_multi_device(annotations: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    try:
        devices = fraction_devices(annotations)
    except ValueError:
        return True  # a value KAI would not read as one device: never one share
    return devices > 1 or bool(multi_groups(labels))


def multi_device_gpus(
    node: str,
    pod_uid: str,
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    reserved: Mapping[str, str],
    bound_groups: Iterable[str] = (),
) -> tuple[str, ...]:
    """Every GPU a multi-device pod holds on ``node``: its groups' reserved GPUs (or the
    synthetic ``<node>/group/<g>``), and ``<node>/pod/<uid>/<i>`` for devices whose group is
    not known yet, so the capacity they take is counted."""
    try:
        count = fraction_devices(annotations)
    except ValueError:
        count = 1
    groups = list(dict.fromkeys([*bound_groups, *multi_groups(labels)]))
    ids = [reserved.get(g, f"{node}/group/{g}") for g in groups]
    ids += [f"{node}/pod/{pod_uid}/{i}" for i in range(len(ids), count)]
    return tuple(ids)


def multi_device_refusal(
    pods: Iterable[tuple[str, Mapping[str, str], Mapping[str, str]]],
) -> str:
    """Why the workload cannot be resized ("" when it can): a pod asks for fractions of more
    than one GPU. ``pods``: (``ns/name``, annotations, labels)."""
    for key, values, labels in pods:
        if is_multi_device(values, labels):
            asked = values.get(KAI_NUM_DEVICES, "")
            groups = ", ".join(multi_groups(labels))
            return (
                f"pod {key} is a KAI multi-device fraction pod ({KAI_NUM_DEVICES}={asked!r}"
                + (f", GPU groups {groups}" if groups else "")
                + "): fracpilot resizes a share of one GPU, so it leaves this workload alone"
            )
    return ""


# --- BindRequests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BindTarget:
    """Where KAI decided to bind a pod that is not bound yet."""

    node: str
    groups: tuple[str, ...] = ()


def bind_targets(objects: Iterable[Any]) -> dict[str, BindTarget]:
    """BindRequests -> ``ns/pod`` -> their node and GPU groups; failed ones are left out."""
    targets: dict[str, BindTarget] = {}
    for raw in objects:
        obj = as_api_dict(raw)
        spec = obj.get("spec") or {}
        node = str(spec.get("selectedNode") or "")
        pod = str(spec.get("podName") or get_path(obj, "metadata", "name") or "")
        if not node or not pod or _failed(obj):
            continue
        namespace = str(get_path(obj, "metadata", "namespace") or "")
        groups = tuple(str(g) for g in spec.get("selectedGPUGroups") or ())
        targets[f"{namespace}/{pod}"] = BindTarget(node, groups)
    return targets


def _failed(obj: Mapping[str, Any]) -> bool:
    """``BindRequestInfo.IsFailed``: phase Failed and no attempts left."""
    status = obj.get("status") or {}
    if status.get("phase") != "Failed":
        return False
    limit = get_path(obj, "spec", "backoffLimit")
    return limit is None or int(status.get("failedAttempts") or 0) >= int(limit)


# --- the numbers KAI derives from a fraction --------------------------------------------------


def kai_fraction(planned: float) -> float:
    """The fraction to write for a planned one: on hundredths, never below it (up to 1), so
    that ``GPU_PORTION`` ("%.2f"), KAI's quota count and the plan agree."""
    steps = math.ceil(planned * PORTION_STEPS - EPS * PORTION_STEPS)
    return min(PORTION_STEPS, max(1, steps)) / PORTION_STEPS


def gpu_portion(fraction: float) -> str:
    """The container's ``GPU_PORTION`` for a ``gpu-fraction`` (``cache.go``: ``%.2f``)."""
    return f"{fraction:.2f}"


def quota_portion(fraction: float) -> float:
    """What KAI's queue accounting counts for a fraction (``getNonMigGpus``: Go's
    ``math.Round``, half away from zero)."""
    return math.floor(fraction * PORTION_STEPS + 0.5) / PORTION_STEPS


def node_memory_mib(label_mib: int) -> int:
    """A node's GPU memory as KAI counts it: the label floored to 100 MiB."""
    return label_mib - label_mib % MEMORY_FLOOR_MIB


def memory_fraction(memory_mib: int, label_mib: int) -> float:
    """The fraction KAI counts for ``gpu-memory: memory_mib`` on a GPU labelled ``label_mib``
    (``getGpuMemoryFractionalOnNode``, in float64 as Go computes it)."""
    floored = node_memory_mib(label_mib)
    if floored <= 0:  # a label under 100 MiB (KAI would divide by zero)
        return math.ceil(memory_mib / label_mib * 100) / 100
    return math.ceil(memory_mib / floored * 100) / 100


def kai_memory_mib(fraction: float, label_mib: int) -> int:
    """The largest ``gpu-memory`` (MiB) that KAI counts as ``kai_fraction(fraction)`` of a GPU
    labelled ``label_mib``."""
    wanted = kai_fraction(fraction)
    if node_memory_mib(label_mib) <= 0:  # a label under 100 MiB: KAI would divide by zero
        return max(1, round(wanted * label_mib))
    memory = round(wanted * node_memory_mib(label_mib))
    while memory > 1 and memory_fraction(memory, label_mib) > wanted + EPS:
        memory -= 1  # float noise in KAI's division: one MiB less keeps the fraction
    return memory
