"""KAI Queues and how far an in-place upsize may take them. Pure.

KAI checks a queue's quota and limit only when it allocates a pod
(``pkg/scheduler/plugins/proportion/capacity_policy/capacity_policy.go``
``IsTaskAllocationOnNodeOverCapacity``), never when a running pod's ``gpu-fraction`` grows, so
an in-place upsize would take a queue past its limit unnoticed. :func:`check_upsize` does the
check KAI would do for a new pod:

- the limit (``max_allowed_check.go`` ``resultsOverLimit``: the pod's queue and every parent,
  ``spec.resources.gpu.limit``, -1 unlimited): past it the upsize is a recommendation only
  (a recreated pod would stay pending: KAI would not place it either);
- the quota (``quota_check.go``; ``spec.resources.gpu.quota``), with ``queue_bound=quota``:
  past it, but within the limit, the pod is recreated instead, so that KAI's own quota check
  (a preemptible pod may run over quota, reclaimable) decides about the new one.

A Queue (``scheduling.run.ai/v2``, cluster-scoped, ``deployments/kai-scheduler/crds/
scheduling.run.ai_queues.yaml``): ``spec.parentQueue``, ``spec.resources.gpu.{quota,limit}``
in GPUs (0.7 = 70 % of a GPU), ``status.allocated`` a ResourceList whose key ending in ``gpu``
holds the GPUs allocated (``pkg/queuecontroller/metrics/metrics.go`` ``getAllocatedGpus``).
A workload's queue is the queue label of its top owner, else of the pod, else
``default-queue`` (``pkg/podgrouper/podgrouper/plugins/defaultgrouper/default_grouper.go``
``CalcPodGroupQueue``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from fracpilot_actuator.kube.kai import quota_portion
from fracpilot_actuator.kube.object_values import as_api_dict, get_path
from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.kai import KaiSettings, QueueBound
from fracpilot_libs.placement.planner import WorkloadPlan

QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL = "scheduling.run.ai", "v2", "queues"
UNLIMITED = -1.0  # constants.UnlimitedResourceQuantity
EPS = 1e-9


@dataclass(frozen=True)
class Queue:
    """A KAI queue's GPUs: quota and limit (None: not set or unlimited), allocated now."""

    name: str
    parent: str = ""
    quota: float | None = None
    limit: float | None = None
    allocated: float = 0.0


def _bound(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if number == UNLIMITED else number


_SUFFIXES = {
    **{k: Decimal(1024) ** i for i, k in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{k: Decimal(1000) ** i for i, k in enumerate(("", "k", "M", "G", "T", "P", "E"))},
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]{0,2})$")


def _quantity(value: Any) -> float:
    """A ResourceList quantity ("1500m", "2", 1.5; Kubernetes' resource.Quantity) as a
    number."""
    match = _QUANTITY.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"quantity {value!r} is not a number")
    try:
        return float(Decimal(match.group(1)) * _SUFFIXES[match.group(2)])
    except InvalidOperation:
        raise ValueError(f"quantity {value!r} is not a number") from None


def parse_queue(raw: Any) -> Queue:
    """A Queue object (API dict or client model) -> its GPU figures; bad values raise."""
    obj = as_api_dict(raw)
    gpu = get_path(obj, "spec", "resources", "gpu") or {}
    allocated = get_path(obj, "status", "allocated") or {}
    gpus = next((v for k, v in allocated.items() if str(k).endswith("gpu")), 0)
    return Queue(
        name=str(get_path(obj, "metadata", "name") or ""),
        parent=str(get_path(obj, "spec", "parentQueue") or ""),
        quota=_bound(gpu.get("quota")),
        limit=_bound(gpu.get("limit")),
        allocated=_quantity(gpus),
    )


def parse_queues(objects: Iterable[Any]) -> tuple[dict[str, Queue], list[str]]:
    """Queues by name, and a message for each that could not be read (left out)."""
    queues: dict[str, Queue] = {}
    problems: list[str] = []
    for raw in objects:
        try:
            queue = parse_queue(raw)
        except (ValueError, TypeError) as exc:
            name = get_path(as_api_dict(raw), "metadata", "name")
            problems.append(f"queue {name}: {exc}")
            continue
        queues[queue.name] = queue
    return queues, problems


def queue_of(
    owner_labels: Mapping[str, Any] | None,
    pod_labels: Iterable[Mapping[str, str]],
    settings: KaiSettings,
) -> str:
    """The workload's queue: the top owner's queue label, else a pod's, else the default."""
    if owner_labels and (name := owner_labels.get(settings.queue_label)):
        return str(name)
    for labels in pod_labels:
        if name := labels.get(settings.queue_label):
            return name
    return settings.default_queue


QueueAction = Literal["apply", "recreate", "recommend"]


@dataclass(frozen=True)
class QueueVerdict:
    """What an in-place upsize may do to its queue: apply it, recreate instead, or only
    recommend it; ``reason`` says why (empty for apply)."""

    action: QueueAction
    reason: str = ""


def upsize_of(steps: Iterable[tuple[float, float]]) -> float:
    """The GPUs an in-place plan adds to the queue, as KAI counts each pod
    (``quota_portion``); ``steps``: (fraction before, after) of each pod resized in place."""
    return sum(quota_portion(after) - quota_portion(before) for before, after in steps)


def check_upsize(
    queues: Mapping[str, Queue], queue: str, added: float, bound: QueueBound
) -> QueueVerdict:
    """Whether ``added`` GPUs more in ``queue`` stay within its (and its parents') limit and,
    with ``bound="quota"``, its quota. An unknown queue is not checked (KAI makes no
    default queue object: the podgrouper's default may not exist)."""
    if added <= EPS:
        return QueueVerdict("apply")
    seen: set[str] = set()
    name: str = queue
    over_quota = ""
    while name in queues and name not in seen:
        seen.add(name)
        q = queues[name]
        after = q.allocated + added
        if q.limit is not None and after > q.limit + EPS:
            return QueueVerdict(
                "recommend",
                f"an in-place upsize of {added:g} GPU would take KAI queue {name} to "
                f"{after:g} GPU, past its limit {q.limit:g} (allocated {q.allocated:g}); KAI "
                "checks limits only when it places a pod, so it is only recommended",
            )
        over = bound == "quota" and q.quota is not None and after > q.quota + EPS
        if over and not over_quota:
            over_quota = (
                f"an in-place upsize of {added:g} GPU would take KAI queue {name} to "
                f"{after:g} GPU, past its quota {q.quota:g} (allocated {q.allocated:g}): "
                "recreated instead, so that KAI's quota check admits the new pod"
            )
        name = q.parent
    return QueueVerdict("recreate", over_quota) if over_quota else QueueVerdict("apply")


def queue_verdict(
    plan: WorkloadPlan,
    queues: Mapping[str, Queue],
    owner: Mapping[str, Any] | None,
    pod_labels: Iterable[Mapping[str, str]],
    settings: KaiSettings,
) -> QueueVerdict:
    """:func:`check_upsize` for a plan's in-place steps, in the workload's queue."""
    added = upsize_of(
        (s.fraction_before or 0.0, s.fraction_after) for s in plan.steps_of(PlanKind.IN_PLACE)
    )
    owner_labels = get_path(owner, "metadata", "labels") if owner is not None else None
    queue = queue_of(owner_labels, pod_labels, settings)
    return check_upsize(queues, queue, added, settings.queue_bound)
