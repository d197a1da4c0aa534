"""KAI-Scheduler's set-up as fracpilot reads it, one copy for the ingest and the actuator: the
``FRACPILOT_KAI_*`` settings group and where KAI's binder puts its GPU reservation pods. Pure.

Written from NVIDIA/KAI-scheduler v0.12.0 (Go module ``github.com/NVIDIA/KAI-scheduler``): the
binder puts reservation pods in ``--resource-reservation-namespace`` with the label
``app=<--resource-reservation-app-label>``, both defaulting to ``kai-resource-reservation``
(``cmd/binder/app/options.go``, ``pkg/common/constants/constants.go``
``DefaultResourceReservationName``, ``AppLabelName = "app"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

KAI_APP_LABEL = "app"  # constants.AppLabelName
DEFAULT_RESERVATION = "kai-resource-reservation"  # constants.DefaultResourceReservationName
DEFAULT_QUEUE_LABEL = "kai.scheduler/queue"  # constants.DefaultQueueLabel
# KAI's nodescaleadjuster puts its scaling pods here; KAI creates no reservation pods while one
# is pending (so fracpilot's placeholders never go there).
SCALE_ADJUST_NAMESPACE = "kai-scale-adjust"
DEFAULT_QUEUE = "default-queue"  # pkg/podgrouper/podgrouper/plugins/constants DefaultQueueName
DEFAULT_SCHEDULER = "kai-scheduler"  # the scheduler name the podgrouper groups pods of
POD_GROUP_ANNOTATION = "pod-group-name"  # constants.PodGroupAnnotationForPod, set by the podgrouper

QueueBound = Literal["limit", "quota"]


@dataclass(frozen=True, slots=True)
class KaiReservation:
    """Where KAI's binder puts its GPU reservation pods (its flags' values)."""

    namespace: str = DEFAULT_RESERVATION
    app_label: str = DEFAULT_RESERVATION

    def holds(self, pod: Mapping[str, Any]) -> bool:
        """A reservation pod: in the namespace, with the app label (its GPU group and the GPU
        it reserved are read by the caller)."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        return (
            meta.get("namespace") == self.namespace
            and isinstance(labels, Mapping)
            and labels.get(KAI_APP_LABEL) == self.app_label
        )


class KaiSettings(BaseModel):
    """``FRACPILOT_KAI_*``: how KAI-Scheduler is set up in the cluster (its binder's flags),
    read by both services, and how far the actuator's in-place upsize may take a KAI queue (the
    queue fields: the ingest does not read them)."""

    reservation_namespace: str = Field(
        default=DEFAULT_RESERVATION,
        description="KAI binder's --resource-reservation-namespace (where its GPU reservation "
        "pods are)",
    )
    reservation_app_label: str = Field(
        default=DEFAULT_RESERVATION,
        description="KAI's --resource-reservation-app-label: the value of the label app on "
        "its reservation pods",
    )
    queue_label: str = Field(
        default=DEFAULT_QUEUE_LABEL,
        description="actuator: the label naming a workload's KAI queue (on the workload or its "
        "pods)",
    )
    default_queue: str = Field(
        default=DEFAULT_QUEUE,
        description="actuator: the queue of workloads without the queue label",
    )
    queue_bound: QueueBound = Field(
        default="limit",
        description="actuator: how far an in-place upsize may take a KAI queue's GPUs: limit "
        "(its spec.resources.gpu.limit; past it the upsize is only recommended) or quota (past "
        "the quota but within the limit the pod is recreated, so KAI's own quota check admits "
        "it)",
    )
    read_queues: bool = Field(
        default=True, description="actuator: read KAI Queues for quota-aware upsizing"
    )
    read_bind_requests: bool = Field(
        default=True,
        description="actuator: count pods on their KAI BindRequest's node before binding",
    )
    read_pod_groups: bool = Field(
        default=True,
        description="actuator: read KAI PodGroups (a gang's minMember, a workload's queue)",
    )
    scheduler_name: str = Field(
        default=DEFAULT_SCHEDULER,
        description="actuator: KAI's scheduler name; its pods without a queue label count in "
        "the default queue",
    )

    @property
    def reservation(self) -> KaiReservation:
        return KaiReservation(self.reservation_namespace, self.reservation_app_label)
