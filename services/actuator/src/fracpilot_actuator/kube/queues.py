"""KAI Queues and how far an upsize may take them, on every path (in place, recreate,
scale-up). Pure.

KAI checks a queue's quota and limit only when it allocates a pod
(``pkg/scheduler/plugins/proportion/capacity_policy/capacity_policy.go``
``IsTaskAllocationOnNodeOverCapacity``), never when a running pod's ``gpu-fraction`` grows, so
an in-place upsize would take a queue past its limit unnoticed; and a recreate past the limit
evicts a pod whose replacement KAI then refuses to place, leaving the workload without a
running pod. :func:`check_upsize` does the check KAI would do for a new pod:

- the limit (``max_allowed_check.go`` ``resultsOverLimit``: the pod's queue and every parent,
  ``spec.resources.gpu.limit``, -1 unlimited): past it the upsize, whatever its path, is a
  recommendation only, and the workload keeps its pods (a recreated pod would stay pending:
  KAI would not place it either);
- the quota (``quota_check.go``; ``spec.resources.gpu.quota``), with ``queue_bound=quota``:
  an in-place upsize past it, but within the limit, is a recreate instead, so that KAI's own
  quota check (a preemptible pod may run over quota, reclaimable) decides about the new pod.

What a queue holds (:func:`effective_queues`): the larger of ``status.allocated`` (KAI's
queuecontroller writes it some time after a pod is bound; a new queue has none) and the sum
over the pods fracpilot sees in the queue and its children, each counted as KAI counts it
(:func:`~fracpilot_actuator.kube.kai.quota_portion`, whole GPUs as they are).

A Queue (``scheduling.run.ai/v2``, cluster-scoped, ``deployments/kai-scheduler/crds/
scheduling.run.ai_queues.yaml``): ``spec.parentQueue``, ``spec.resources.gpu.{quota,limit}``
in GPUs (0.7 = 70 % of a GPU), ``status.allocated`` a ResourceList whose key ending in ``gpu``
holds the GPUs allocated (``pkg/queuecontroller/metrics/metrics.go`` ``getAllocatedGpus``).
A pod's queue is its PodGroup's ``spec.queue`` when the group is known (:mod:`.gangs`), else
the queue label of its top owner, else of the pod, else ``default-queue``
(``pkg/podgrouper/podgrouper/plugins/defaultgrouper/default_grouper.go`` ``CalcPodGroupQueue``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from fracpilot_actuator.kube.gangs import PodGroup, group_of
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.kai import fraction_devices, quota_portion
from fracpilot_actuator.kube.object_values import as_api_dict, get_path
from fracpilot_libs.contracts import GpuSharing, PlanKind
from fracpilot_libs.kai import KaiSettings, QueueBound
from fracpilot_libs.placement.planner import SEVERITY, WorkloadPlan

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
    status: float | None = None  # status.allocated, when ``allocated`` also counts the pods


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
    group_queue: str = "",
) -> str:
    """The workload's queue: its PodGroup's ``spec.queue`` (what KAI charges), else the top
    owner's queue label, else a pod's, else the default."""
    if group_queue:
        return group_queue
    if owner_labels and (name := owner_labels.get(settings.queue_label)):
        return str(name)
    for labels in pod_labels:
        if name := labels.get(settings.queue_label):
            return name
    return settings.default_queue


def workload_queue(
    owner: Mapping[str, Any] | None,
    pods: Iterable[PodInfo],
    groups: Mapping[str, PodGroup] | None,
    settings: KaiSettings,
) -> str:
    """:func:`queue_of` for a workload's pods: the first known PodGroup's queue wins."""
    pods = tuple(pods)
    group_queue = next(
        (
            g.queue
            for p in pods
            if (g := group_of(p.namespace, p.annotations, groups)) is not None and g.queue
        ),
        "",
    )
    owner_labels = get_path(owner, "metadata", "labels") if owner is not None else None
    return queue_of(owner_labels, [p.labels for p in pods], settings, group_queue)


def pod_queue(
    pod: PodInfo, groups: Mapping[str, PodGroup] | None, settings: KaiSettings
) -> str | None:
    """The queue KAI charges for a pod; None: not a KAI pod (another scheduler, no label)."""
    group = group_of(pod.namespace, pod.annotations, groups)
    if group is not None and group.queue:
        return group.queue
    if name := pod.labels.get(settings.queue_label):
        return name
    scheduler = get_path(pod.raw, "spec", "schedulerName")
    return settings.default_queue if scheduler == settings.scheduler_name else None


def pod_gpus(pod: PodInfo) -> float:
    """The GPUs KAI's queue accounting counts for a pod: a share on hundredths (each of a
    multi-device pod's GPUs), else its whole GPUs."""
    if pod.backend is GpuSharing.KAI and pod.share is not None:
        try:
            devices = fraction_devices(pod.annotations)
        except ValueError:
            devices = 1
        return quota_portion(pod.share.fraction) * devices
    return float(pod.whole_gpus)


def usage_by_queue(
    pods: Iterable[PodInfo], groups: Mapping[str, PodGroup] | None, settings: KaiSettings
) -> dict[str, float]:
    """GPUs held by the pods fracpilot sees, by the queue KAI charges: pods on a node (bound,
    or chosen by a BindRequest), terminating ones too (they hold their GPU until gone)."""
    usage: dict[str, float] = {}
    for pod in pods:
        if not pod.node or (queue := pod_queue(pod, groups, settings)) is None:
            continue
        if gpus := pod_gpus(pod):
            usage[queue] = usage.get(queue, 0.0) + gpus
    return usage


def effective_queues(queues: Mapping[str, Queue], usage: Mapping[str, float]) -> dict[str, Queue]:
    """Each queue with ``allocated`` the larger of its status and the pods' usage in it and
    its children (a parent holds what its children hold)."""
    counted = dict.fromkeys(queues, 0.0)
    for name, gpus in usage.items():
        seen: set[str] = set()
        while name in queues and name not in seen:
            seen.add(name)
            counted[name] += gpus
            name = queues[name].parent
    return {
        name: replace(q, allocated=max(q.allocated, counted[name]), status=q.allocated)
        for name, q in queues.items()
    }


QueueAction = Literal["apply", "recreate", "recommend"]


@dataclass(frozen=True)
class QueueVerdict:
    """What an upsize may do to its queue: apply it, recreate instead (in place past the
    quota), or only recommend it; ``reason`` says why (empty for apply)."""

    action: QueueAction
    reason: str = ""


def upsize_of(steps: Iterable[tuple[float, float]]) -> float:
    """The GPUs a plan adds to the queue, as KAI counts each pod (``quota_portion``);
    ``steps``: (fraction before, after) of each pod resized."""
    return sum(quota_portion(after) - quota_portion(before) for before, after in steps)


def _held(q: Queue) -> str:
    if q.status is None or abs(q.status - q.allocated) <= EPS:
        return f"allocated {q.allocated:g}"
    return f"allocated {q.allocated:g} by the pods seen; its status says {q.status:g}"


def check_upsize(
    queues: Mapping[str, Queue],
    queue: str,
    added: float,
    bound: QueueBound,
    how: str = "an in-place upsize",
) -> QueueVerdict:
    """Whether ``added`` GPUs more in ``queue`` stay within its (and its parents') limit and,
    with ``bound="quota"`` for an in-place upsize, its quota. An unknown queue is not checked
    (KAI makes no default queue object: the podgrouper's default may not exist)."""
    if added <= EPS:
        return QueueVerdict("apply")
    in_place = how == "an in-place upsize"
    seen: set[str] = set()
    name: str = queue
    over_quota = ""
    while name in queues and name not in seen:
        seen.add(name)
        q = queues[name]
        after = q.allocated + added
        if q.limit is not None and after > q.limit + EPS:
            why = (
                "KAI checks limits only when it places a pod"
                if in_place
                else "KAI would not place the new pod, and the workload would have none running"
            )
            return QueueVerdict(
                "recommend",
                f"{how} of {added:g} GPU would take KAI queue {name} to {after:g} GPU, past "
                f"its limit {q.limit:g} ({_held(q)}); {why}, so it is only recommended",
            )
        over = in_place and bound == "quota" and q.quota is not None and after > q.quota + EPS
        if over and not over_quota:
            over_quota = (
                f"{how} of {added:g} GPU would take KAI queue {name} to "
                f"{after:g} GPU, past its quota {q.quota:g} ({_held(q)}): "
                "recreated instead, so that KAI's quota check admits the new pod"
            )
        name = q.parent
    return QueueVerdict("recreate", over_quota) if over_quota else QueueVerdict("apply")


_HOW = {
    PlanKind.IN_PLACE: "an in-place upsize",
    PlanKind.RECREATE_ELSEWHERE: "an upsize by recreate",
    PlanKind.SCALE_UP: "an upsize by scale-up",
}


def queue_verdict(
    plan: WorkloadPlan, queues: Mapping[str, Queue], queue: str, settings: KaiSettings
) -> QueueVerdict:
    """:func:`check_upsize` for every step of a plan, in the workload's queue: the limit for
    all of them together, the quota (``queue_bound=quota``) for the in-place ones."""
    moved = [s for s in plan.steps if s.kind in _HOW]
    added = upsize_of((s.fraction_before or 0.0, s.fraction_after) for s in moved)
    kinds = {s.kind for s in moved if s.fraction_after > (s.fraction_before or 0.0)}
    how = _HOW[max(kinds, key=SEVERITY.__getitem__)] if kinds else _HOW[PlanKind.IN_PLACE]
    verdict = check_upsize(queues, queue, added, "limit", how)
    if verdict.action != "apply" or settings.queue_bound != "quota":
        return verdict
    in_place = upsize_of(
        (s.fraction_before or 0.0, s.fraction_after) for s in plan.steps_of(PlanKind.IN_PLACE)
    )
    return check_upsize(queues, queue, in_place, "quota")
