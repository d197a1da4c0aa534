"""Scale-up placeholders: the pending pod that asks the autoscaler for a GPU. Pure.

A placeholder is shaped like KAI's own scaling pod (``createScalingPodSpec`` in
``pkg/nodescaleadjuster/scaler/scaling_pod.go``, kai-scheduler/KAI-Scheduler at d5bc503a): the
pending pod's node selector, affinity and tolerations, its containers' CPU and memory requests
summed, and one whole GPU as a node-allocatable resource, ``nvidia.com/gpu: 1``, so the
cluster-autoscaler, which simulates kube-scheduler's resource fit on node templates, adds a
node the moving pod fits on. Under HAMi too: ``nvidia.com/gpu`` is what HAMi's device plugin
registers on the node (sharing slots), while ``nvidia.com/gpumem*`` and ``gpucores`` are not
allocatable anywhere, so a pod asking for them never makes the autoscaler act; HAMi gives a
pod that asks for one slot and no memory its ``defaultMemory`` (0, the default: the GPU's
whole memory).

Its PriorityClass ``fracpilot-capacity`` has a priority above cluster-autoscaler's
``--expendable-pods-priority-cutoff`` (pods below it never cause a scale-up) and below every
real workload's, with ``preemptionPolicy: Never``; both the value and the cutoff it is checked
against are settings (:class:`~fracpilot_actuator.settings.CapacitySettings`). It carries the
decision, so a restarted actuator carries on where it was (:class:`PendingScaleUp` is rebuilt
from the placeholders it finds). It never goes to ``kai-scale-adjust``: KAI creates no
reservation pods while a pod there is pending.

A placeholder is kept until the pod it was made for has a replacement bound (make before
break); a bound one counts as a used GPU in every inventory (:mod:`.inventory`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.object_values import (
    CAPACITY_ROLE,
    GPU_RESOURCE,
    KAI_SCALE_ADJUST_NAMESPACE,
    ROLE,
)
from fracpilot_libs.contracts import FractionDecision, GpuSharing
from fracpilot_libs.placement.quantities import quantity

PRIORITY_CLASS = "fracpilot-capacity"
MANAGED_BY = "app.kubernetes.io/managed-by"
WORKLOAD = "fracpilot.io/workload"  # on a placeholder: the workload key it asks capacity for
FOR_POD = "fracpilot.io/for-pod"  # on a placeholder: the pod that moves once capacity exists
DECISION = "fracpilot.io/decision"  # on a placeholder: the decision, as JSON


@dataclass
class PendingScaleUp:
    """A scale-up waiting for capacity: placeholders by the pod each one is for."""

    decision: FractionDecision
    started_at: datetime
    placeholders: dict[str, tuple[str, str]]  # pod name -> (namespace, placeholder name)
    notes: list[str] = field(default_factory=list)


def placeholder_name(namespace: str, pod: str) -> str:
    digest = hashlib.sha256(f"{namespace}/{pod}".encode()).hexdigest()[:12]
    return f"fracpilot-capacity-{digest}"


def copied_requests(containers: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The containers' CPU and memory requests summed, as KAI's scaling pod takes them
    (``addCpuResourceRequest`` / ``addMemoryResourceRequest``: requests only, regular
    containers only); CPU in millicores and memory in bytes, rounded up; a zero sum is left out.
    A value that does not parse raises ValueError."""
    cpu, memory = Decimal(0), Decimal(0)
    for container in containers:
        requests = (container.get("resources") or {}).get("requests") or {}
        if "cpu" in requests:
            cpu += quantity(requests["cpu"])
        if "memory" in requests:
            memory += quantity(requests["memory"])
    copied = {}
    if cpu > 0:
        copied["cpu"] = f"{math.ceil(cpu * 1000)}m"
    if memory > 0:
        copied["memory"] = str(math.ceil(memory))
    return copied


def whole_gpu(backend: GpuSharing | None) -> dict[str, str]:
    """One whole GPU as a node-allocatable resource, for either backend (module docstring)."""
    return {GPU_RESOURCE: "1"}


def placeholder_pod(
    *,
    name: str,
    namespace: str,
    decision: FractionDecision,
    pod: PodInfo,
    image: str,
) -> dict[str, Any]:
    """A pod that asks for one whole GPU where the moving pod may run, and does nothing.

    It copies the pod's node selector, affinity, tolerations and CPU and memory requests (as
    KAI's node-scale-adjuster does), so the autoscaler adds a node the pod can use;
    ``preemptionPolicy: Never`` and its low priority (above the autoscaler's expendable
    cutoff) keep it from pushing any real pod aside. Raises ValueError for
    ``kai-scale-adjust`` or a request that does not parse.
    """
    if namespace == KAI_SCALE_ADJUST_NAMESPACE:
        raise ValueError(f"a placeholder may not go to {KAI_SCALE_ADJUST_NAMESPACE}")
    spec = pod.raw.get("spec") or {}
    copied = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)}
    gpu = whole_gpu(pod.backend)
    requests = {**gpu, **copied_requests(spec.get("containers") or ())}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {ROLE: CAPACITY_ROLE, MANAGED_BY: "fracpilot"},
            "annotations": {
                WORKLOAD: decision.workload.key,
                FOR_POD: pod.name,
                DECISION: decision.model_dump_json(),
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
            },
        },
        "spec": {
            **copied,
            "priorityClassName": PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "capacity",
                    "image": image,
                    "resources": {"requests": requests, "limits": gpu},
                }
            ],
        },
    }


def pending_of(raw: dict[str, Any]) -> tuple[FractionDecision, str] | None:
    """A placeholder's decision and the pod it is for; None when it carries none."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    try:
        return FractionDecision.model_validate_json(annotations[DECISION]), annotations[FOR_POD]
    except (KeyError, ValueError):
        return None
