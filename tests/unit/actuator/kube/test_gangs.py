"""Gangs: KAI PodGroups read as KAI's podgrouper writes them, and no eviction that takes a
group below its minMember (kube/gangs.py, the judge)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from factories import decision
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.gangs import Member, PodGroup, gang_refusal, parse_pod_groups
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_libs.contracts import Outcome, PlanKind, WorkloadRef
from support.kube_objects import MEM_MIB, T0, kai, node, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Job", "train")
NOW = T0 + timedelta(minutes=6)
OPTED_IN = {"fracpilot.io/mode": "auto"}
TRAIN = WorkloadRef(cluster="test", namespace="inference", owner_kind="Job", owner_name="train")
GUARDS = Guards(GuardState(), GuardrailSettings(allow_single_replica=True))


def pod_group(name: str, min_member: Any, queue: str = "team") -> dict[str, Any]:
    """A PodGroup as KAI v0.12.0's podgrouper writes it (scheduling.run.ai/v2alpha2)."""
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "inference"},
        "spec": {"minMember": min_member, "queue": queue, "priorityClassName": "train"},
    }


def test_pod_groups_are_read_as_kai_writes_them() -> None:
    groups = parse_pod_groups(
        [pod_group("pg-a", 4), pod_group("pg-b", None, ""), pod_group("pg-c", "x")]
    )
    assert groups["inference/pg-a"] == PodGroup("inference", "pg-a", 4, "team")
    assert groups["inference/pg-b"] == PodGroup("inference", "pg-b", 1, "")
    assert groups["inference/pg-c"].min_member == 1


def member(name: str, group: str, running: bool = True) -> Member:
    return Member("inference", name, {"pod-group-name": group}, running)


def test_an_eviction_below_min_member_is_refused() -> None:
    groups = parse_pod_groups([pod_group("gang", 2), pod_group("solo", 1)])
    gang = [member("w-0", "gang"), member("w-1", "gang")]
    refusal = gang_refusal([("inference", "w-0")], gang, groups)
    assert "PodGroup inference/gang with 1 running pod(s), below its minMember 2" in refusal
    # A third running member keeps the gang at its minMember: allowed.
    assert gang_refusal([("inference", "w-0")], [*gang, member("w-2", "gang")], groups) == ""
    # A member not running does not count towards it.
    spare = member("w-2", "gang", running=False)
    assert gang_refusal([("inference", "w-0")], [*gang, spare], groups) != ""
    # minMember 1 (KAI's default, one pod's own group): recreating it is any recreate.
    assert gang_refusal([("inference", "s")], [member("s", "solo")], groups) == ""
    # PodGroups not read, or a group not known: nothing to check.
    assert gang_refusal([("inference", "w-0")], gang, None) == ""
    assert gang_refusal([("inference", "x")], [member("x", "other")], groups) == ""


def gang_view(min_member: int | None) -> ClusterView:
    """Two pods of Job train (0.5 each) fill n1's only GPU; n2 is empty, so 0.75 is a recreate
    of both. With ``min_member`` they are one KAI PodGroup."""
    pods = [kai(f"train-{i}", "0.5", group="g1", owner=OWNER) for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"]["pod-group-name"] = "pg-train"
    inv = build_inventory(
        [node("n1", gpus=1), node("n2", gpus=2)],
        [reservation("g1", UUID_A), *pods],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    groups = None if min_member is None else parse_pod_groups([pod_group("pg-train", min_member)])
    return ClusterView(inv, inv.pods_of(TRAIN, {}), None, OPTED_IN, pod_groups=groups)


def test_the_judge_never_takes_a_gang_below_its_min_member() -> None:
    made = decision(0.5, 0.75, name="train", workload=TRAIN, decided_at=T0 + timedelta(minutes=5))
    result = judge(made, gang_view(2), GUARDS, NOW)
    assert isinstance(result, Skip), "today: both pods of the gang are evicted"
    assert result.actuation.outcome is Outcome.SKIPPED
    assert result.actuation.held_back == "gang"
    assert "below its minMember 2" in result.actuation.detail
    # Not a gang (minMember 1), or PodGroups not read: the recreate goes ahead.
    for view in (gang_view(1), gang_view(None)):
        plan = judge(made, view, GUARDS, NOW)
        assert isinstance(plan, ActuationPlan)
        assert plan.plan.kind is PlanKind.RECREATE_ELSEWHERE
