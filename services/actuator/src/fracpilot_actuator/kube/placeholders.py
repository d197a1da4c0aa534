"""Scale-up placeholders: the pending pod that asks the autoscaler for a GPU. Pure.

A placeholder asks for a whole ``nvidia.com/gpu`` with the low PriorityClass
``fracpilot-capacity`` and carries the decision, so a restarted actuator carries on where it
was (:class:`PendingScaleUp` is rebuilt from the placeholders it finds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.object_values import CAPACITY_ROLE, GPU_RESOURCE, ROLE
from fracpilot_libs.contracts import FractionDecision

PRIORITY_CLASS = "fracpilot-capacity"
PRIORITY_VALUE = -10
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


def placeholder_pod(
    *,
    name: str,
    namespace: str,
    decision: FractionDecision,
    pod: PodInfo,
    image: str,
) -> dict[str, Any]:
    """A pod that asks for one whole GPU where the moving pod may run, and does nothing.

    It copies the pod's node selector, affinity and tolerations (as KAI's node-scale-adjuster
    does), so the autoscaler adds a node the pod can use; ``preemptionPolicy: Never`` and the
    negative priority keep it from pushing any real pod aside.
    """
    spec = pod.raw.get("spec") or {}
    copied = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)}
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
                    "resources": {
                        "requests": {GPU_RESOURCE: "1", "cpu": "10m", "memory": "16Mi"},
                        "limits": {GPU_RESOURCE: "1", "memory": "16Mi"},
                    },
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
