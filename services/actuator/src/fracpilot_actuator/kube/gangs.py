"""KAI PodGroups (gangs): which group a pod is in, its queue, and never taking it below its
``minMember``. Pure.

Written from NVIDIA/KAI-scheduler v0.12.0: a PodGroup (``scheduling.run.ai/v2alpha2``,
namespaced, ``deployments/kai-scheduler/crds/scheduling.run.ai_podgroups.yaml``;
``pkg/apis/scheduling/v2alpha2/podgroup_types.go``) has ``spec.minMember`` ("the minimal number
of members to run the PodGroup", at least 1) and ``spec.queue``. KAI's podgrouper makes one for
each pod it schedules and writes its name into the pod's annotation ``pod-group-name``
(``pkg/podgrouper/pod_controller.go`` ``addPodGroupAnnotationToPod``); a pod without owners
that carries the annotation already keeps the group its author made
(``isOrphanPodWithPodGroup``). The group's ``spec.queue`` is the queue KAI charges, so it wins
over the pod's queue label (:func:`fracpilot_actuator.kube.queues.queue_of`).

An eviction that leaves a gang with fewer running members than ``minMember`` strands the rest
(they wait for a member KAI may not place), so :func:`gang_refusal` refuses it. A group of
``minMember`` 1 is one pod's own (KAI's default for a Deployment's pods): recreating that pod
is what any recreate is, so it is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fracpilot_actuator.kube.object_values import as_api_dict, get_path
from fracpilot_libs.kai import POD_GROUP_ANNOTATION

POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL = "scheduling.run.ai", "v2alpha2", "podgroups"


@dataclass(frozen=True)
class PodGroup:
    namespace: str
    name: str
    min_member: int = 1
    queue: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_pod_groups(objects: Iterable[Any]) -> dict[str, PodGroup]:
    """PodGroups by ``ns/name``; a ``minMember`` that is not a number reads as 1 (KAI's
    CRD validates it, so only a hand-made object can hold one)."""
    groups: dict[str, PodGroup] = {}
    for raw in objects:
        obj = as_api_dict(raw)
        spec = obj.get("spec") or {}
        try:
            min_member = max(1, int(spec.get("minMember") or 1))
        except (TypeError, ValueError):
            min_member = 1
        group = PodGroup(
            namespace=str(get_path(obj, "metadata", "namespace") or ""),
            name=str(get_path(obj, "metadata", "name") or ""),
            min_member=min_member,
            queue=str(spec.get("queue") or ""),
        )
        groups[group.key] = group
    return groups


def group_name(annotations: Mapping[str, str]) -> str:
    """The pod's PodGroup name (KAI's podgrouper's annotation), "" when it has none yet."""
    return annotations.get(POD_GROUP_ANNOTATION, "")


def group_of(
    namespace: str, annotations: Mapping[str, str], groups: Mapping[str, PodGroup] | None
) -> PodGroup | None:
    """The pod's PodGroup when it is known."""
    name = group_name(annotations)
    if not name or groups is None:
        return None
    return groups.get(f"{namespace}/{name}")


@dataclass(frozen=True)
class Member:
    """A pod as the gang check sees it."""

    namespace: str
    name: str
    annotations: Mapping[str, str]
    running: bool  # bound to a node (or being bound) and not terminating


def gang_refusal(
    evicted: Iterable[tuple[str, str]],
    members: Iterable[Member],
    groups: Mapping[str, PodGroup] | None,
) -> str:
    """Why evicting ``evicted`` (``(namespace, pod)``) must not happen ("" when it may): a
    PodGroup with ``minMember`` > 1 would keep fewer running members than that.
    ``members``: every pod the inventory holds (the gang may span workloads)."""
    if groups is None:
        return ""
    going = set(evicted)
    running: dict[str, int] = {}
    leaving: dict[str, list[str]] = {}
    for pod in members:
        group = group_of(pod.namespace, pod.annotations, groups)
        if group is None or not pod.running:
            continue
        running[group.key] = running.get(group.key, 0) + 1
        if (pod.namespace, pod.name) in going:
            leaving.setdefault(group.key, []).append(pod.name)
    for key, names in sorted(leaving.items()):
        group = groups[key]
        left = running[key] - len(names)
        if group.min_member > 1 and left < group.min_member:
            return (
                f"evicting {', '.join(sorted(names))} would leave KAI PodGroup {key} with "
                f"{left} running pod(s), below its minMember {group.min_member}: the gang's "
                "other pods would wait for members KAI may not place, so it is refused"
            )
    return ""
