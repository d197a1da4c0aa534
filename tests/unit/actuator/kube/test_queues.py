"""Quota-aware upsizing: KAI Queues (kube/queues.py) read and checked before an in-place upsize,
which KAI itself never checks (it checks quota and limit only when it places a pod)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from factories import decision
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.gangs import PodGroup
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_actuator.kube.kai_objects import KaiReader
from fracpilot_actuator.kube.queues import (
    Queue,
    check_upsize,
    parse_queue,
    parse_queues,
    pod_queue,
    queue_of,
    upsize_of,
    usage_by_queue,
)
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind
from fracpilot_libs.kai import KaiSettings
from support.kube_objects import MEM_MIB, T0, kai, node, pod, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
NOW = T0 + timedelta(minutes=6)
OPTED_IN = {"fracpilot.io/mode": "auto"}


def queue_object(name: str, quota: float, limit: float, allocated: Any, parent: str = "") -> Any:
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"parentQueue": parent, "resources": {"gpu": {"quota": quota, "limit": limit}}},
        "status": {"allocated": {"nvidia.com/gpu": allocated, "cpu": "4"}},
    }


# --- the pure check --------------------------------------------------------------------------


def test_a_queue_object_is_read_as_kai_writes_it() -> None:
    q = parse_queue(queue_object("team", 1, 2, "1500m", parent="org"))
    assert q == Queue("team", "org", quota=1.0, limit=2.0, allocated=1.5)
    unlimited = parse_queue(queue_object("free", -1, -1, 0))
    assert (unlimited.quota, unlimited.limit, unlimited.allocated) == (None, None, 0.0)
    for allocated, gpus in (("2", 2.0), (1.25, 1.25), ("250m", 0.25), ("1e0", 1.0)):
        assert parse_queue(queue_object("q", 1, 2, allocated)).allocated == gpus
    empty = parse_queue({"metadata": {"name": "new"}})
    assert empty == Queue("new")
    queues, problems = parse_queues([queue_object("ok", 1, 1, "1"), queue_object("bad", 1, 1, "x")])
    assert set(queues) == {"ok"}
    assert len(problems) == 1
    assert "queue bad" in problems[0]


def test_past_the_limit_is_a_recommendation_whatever_the_bound() -> None:
    queues = {"team": Queue("team", quota=1.0, limit=1.0, allocated=0.9)}
    for bound in ("limit", "quota"):
        verdict = check_upsize(queues, "team", 0.2, bound)  # type: ignore[arg-type]
        assert verdict.action == "recommend"
        assert "past its limit 1" in verdict.reason
    assert check_upsize(queues, "team", 0.1, "limit").action == "apply"  # exactly at it


def test_a_parents_limit_counts_too() -> None:
    queues = {
        "team": Queue("team", parent="org", limit=None, allocated=0.5),
        "org": Queue("org", limit=2.0, allocated=1.9),
    }
    verdict = check_upsize(queues, "team", 0.2, "limit")
    assert verdict.action == "recommend"
    assert "queue org" in verdict.reason


def test_past_the_quota_is_a_recreate_only_with_the_quota_bound() -> None:
    queues = {"team": Queue("team", quota=1.0, limit=3.0, allocated=1.0)}
    assert check_upsize(queues, "team", 0.5, "limit").action == "apply"
    verdict = check_upsize(queues, "team", 0.5, "quota")
    assert verdict.action == "recreate"
    assert "past its quota 1" in verdict.reason


def test_downsizes_unknown_queues_and_loops_are_not_held() -> None:
    queues = {"a": Queue("a", parent="b", limit=0.0, allocated=1.0), "b": Queue("b", parent="a")}
    assert check_upsize(queues, "a", -0.5, "limit").action == "apply"
    assert check_upsize(queues, "nowhere", 5.0, "limit").action == "apply"
    assert check_upsize({"b": Queue("b", parent="b")}, "b", 1.0, "quota").action == "apply"


def test_the_upsize_is_counted_as_kai_counts_each_pod() -> None:
    assert upsize_of([(0.25, 0.38), (0.25, 0.38)]) == pytest.approx(0.26)
    assert upsize_of([(0.125, 0.13)]) == pytest.approx(0.0)  # KAI counted 0.125 as 0.13


def test_the_workloads_queue_is_the_owners_label_then_a_pods_then_the_default() -> None:
    s = KaiSettings()
    label = "kai.scheduler/queue"
    assert queue_of({label: "a"}, [{label: "b"}], s) == "a"
    assert queue_of({}, [{}, {label: "b"}], s) == "b"
    assert queue_of(None, [{}], s) == "default-queue"
    assert queue_of({"q": "c"}, [], KaiSettings(queue_label="q")) == "c"


# --- in the judge ----------------------------------------------------------------------------


def grow(current: float, new: float) -> FractionDecision:
    return decision(current, new, name="chat", decided_at=T0 + timedelta(minutes=5))


def view(queues: dict[str, Queue] | None, fraction: str = "0.25") -> ClusterView:
    labels = {"kai.scheduler/queue": "team"}
    pods = [kai(f"chat-{i}", fraction, group="g1", owner=OWNER) for i in range(2)]
    for p in pods:
        p["metadata"]["labels"].update(labels)
    inv = build_inventory(
        [node("n1", gpus=2)],
        [reservation("g1", UUID_A), *pods],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    made = grow(0.25, 0.5)
    return ClusterView(inv, inv.pods_of(made.workload, {}), None, OPTED_IN, queues=queues)


def guards(bound: str = "limit") -> Guards:
    kai_settings = KaiSettings(queue_bound=bound)  # type: ignore[arg-type]
    return Guards(GuardState(), GuardrailSettings(), kai=kai_settings)


def test_an_in_place_upsize_past_the_queue_limit_is_only_recommended() -> None:
    # Two pods 0.25 -> 0.5 add 0.5 GPU to a queue at 0.8 of its 1.0 limit.
    queues = {"team": Queue("team", quota=1.0, limit=1.0, allocated=0.8)}
    result = judge(grow(0.25, 0.5), view(queues), guards(), NOW)
    assert isinstance(result, Skip)
    assert (result.actuation.outcome, result.actuation.held_back) == (
        Outcome.DRY_RUN,
        "queue_limit",
    )
    assert "past its limit 1" in result.actuation.detail
    assert "would in_place" in result.actuation.detail
    # Room in the queue: in place, as before.
    roomy = {"team": Queue("team", quota=1.0, limit=2.0, allocated=0.8)}
    applied = judge(grow(0.25, 0.5), view(roomy), guards(), NOW)
    assert isinstance(applied, ActuationPlan)
    assert applied.plan.kind is PlanKind.IN_PLACE
    # Queues not read (a cluster without KAI's CRDs): not checked.
    assert isinstance(judge(grow(0.25, 0.5), view(None), guards(), NOW), ActuationPlan)


def test_past_the_quota_with_the_quota_bound_the_upsize_is_a_recreate() -> None:
    queues = {"team": Queue("team", quota=1.0, limit=4.0, allocated=0.8)}
    assert isinstance(judge(grow(0.25, 0.5), view(queues), guards("limit"), NOW), ActuationPlan)
    result = judge(grow(0.25, 0.5), view(queues), guards("quota"), NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert result.disruptive  # so the disruption budget and the PDBs apply
    assert "past its quota 1" in result.plan.reason


def test_a_downsize_is_never_held_by_the_queue() -> None:
    full = {"team": Queue("team", quota=0.1, limit=0.1, allocated=5.0)}
    result = judge(grow(0.5, 0.25), view(full, fraction="0.5"), guards("quota"), NOW)
    # (Other rules may hold a downsize, e.g. the memory floor; the queue never does.)
    actuation = result.result(Outcome.APPLIED, "") if isinstance(result, ActuationPlan) else None
    held = result.actuation if isinstance(result, Skip) else actuation
    assert held is not None
    assert held.held_back != "queue_limit"
    assert "queue team" not in held.detail
    if isinstance(result, ActuationPlan):
        assert result.plan.kind is PlanKind.IN_PLACE


# --- the reader's I/O half, with an in-memory API ----------------------------------------------


class FakeKaiApi:
    def __init__(self, objects: dict[str, list[dict[str, Any]] | None]) -> None:
        self.objects = objects
        self.calls: list[str] = []

    async def list_kai_objects(
        self, group: str, version: str, plural: str
    ) -> list[dict[str, Any]] | None:
        self.calls.append(f"{group}/{version}/{plural}")
        return self.objects.get(plural)


def test_the_kai_reader_reads_queues_and_bind_requests_and_tolerates_their_absence() -> None:
    request = {
        "metadata": {"name": "chat-1", "namespace": "inference"},
        "spec": {"podName": "chat-1", "selectedNode": "n1"},
    }
    api = FakeKaiApi({"queues": [queue_object("team", 1, 2, "1")], "bindrequests": [request]})
    read = asyncio.run(KaiReader(api, KaiSettings()).read())
    assert read.queues is not None
    assert read.queues["team"].limit == 2.0
    assert set(read.bound) == {"inference/chat-1"}
    assert sorted(api.calls) == [
        "scheduling.run.ai/v1alpha2/bindrequests",
        "scheduling.run.ai/v2/queues",
        "scheduling.run.ai/v2alpha2/podgroups",
    ]
    absent = asyncio.run(KaiReader(FakeKaiApi({}), KaiSettings()).read())
    assert (absent.queues, dict(absent.bound), absent.pod_groups) == (None, {}, None)
    off = FakeKaiApi({"queues": []})
    settings = KaiSettings(read_queues=False, read_bind_requests=False, read_pod_groups=False)
    assert asyncio.run(KaiReader(off, settings).read()).queues is None
    assert off.calls == []


# --- every upsize path, and what the queue really holds (issue 26) ----------------------------

TEAM = {"kai.scheduler/queue": "team"}


def in_team(p: dict[str, Any], queue: str = "team") -> dict[str, Any]:
    p["metadata"]["labels"]["kai.scheduler/queue"] = queue
    return p


def full_gpu_view(
    queues: dict[str, Queue] | None,
    *,
    spare_gpus: int = 1,
    others: tuple[Any, ...] = (),
    group: str = "",
) -> ClusterView:
    """chat (0.5) shares n1's only GPU with other (0.5); n2 has ``spare_gpus`` empty GPUs: an
    upsize to 0.75 is a recreate onto n2 (a scale-up without n2). ``group``: chat's
    PodGroup (KAI's podgrouper's annotation)."""
    chat = in_team(kai("chat-0", "0.5", group="g1", owner=OWNER))
    if group:
        chat["metadata"]["annotations"]["pod-group-name"] = group
    other = in_team(kai("other", "0.5", group="g1"))
    nodes = [node("n1", gpus=1)] + ([node("n2", gpus=spare_gpus)] if spare_gpus else [])
    inv = build_inventory(
        nodes,
        [reservation("g1", UUID_A), chat, other, *others],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    made = grow(0.5, 0.75)
    return ClusterView(inv, inv.pods_of(made.workload, {}), None, OPTED_IN, queues=queues)


def moving() -> Guards:
    """Guards that let a single replica be recreated (the plans below move one pod)."""
    return Guards(GuardState(), GuardrailSettings(allow_single_replica=True))


def test_an_upsize_by_recreate_past_the_queue_limit_is_only_recommended_and_keeps_the_pod() -> None:
    queues = {"team": Queue("team", limit=1.0, allocated=1.0)}
    result = judge(grow(0.5, 0.75), full_gpu_view(queues), moving(), NOW)
    assert isinstance(result, Skip), "today: the pod is evicted and KAI refuses its replacement"
    assert (result.actuation.outcome, result.actuation.held_back) == (
        Outcome.DRY_RUN,
        "queue_limit",
    )
    assert result.actuation.plan is PlanKind.RECREATE_ELSEWHERE
    assert "an upsize by recreate of 0.25 GPU" in result.actuation.detail
    assert "past its limit 1" in result.actuation.detail
    roomy = {"team": Queue("team", limit=2.0, allocated=1.0)}
    moved = judge(grow(0.5, 0.75), full_gpu_view(roomy), moving(), NOW)
    assert isinstance(moved, ActuationPlan)
    assert moved.plan.kind is PlanKind.RECREATE_ELSEWHERE


def test_an_upsize_by_scale_up_past_the_queue_limit_is_only_recommended() -> None:
    queues = {"team": Queue("team", limit=1.0, allocated=1.0)}
    result = judge(grow(0.5, 0.75), full_gpu_view(queues, spare_gpus=0), moving(), NOW)
    assert isinstance(result, Skip)
    assert (result.actuation.plan, result.actuation.held_back) == (
        PlanKind.SCALE_UP,
        "queue_limit",
    )
    assert "an upsize by scale-up" in result.actuation.detail


def test_a_queue_whose_status_lags_counts_the_pods_fracpilot_sees() -> None:
    # No status yet (a new queue, or the queuecontroller behind): the pods hold 1.0 GPU.
    lagging = {"team": Queue("team", limit=1.0)}
    result = judge(grow(0.5, 0.75), full_gpu_view(lagging), moving(), NOW)
    assert isinstance(result, Skip), "today: a queue without status reads as 0 allocated"
    assert result.actuation.held_back == "queue_limit"
    assert "allocated 1 by the pods seen; its status says 0" in result.actuation.detail


def test_a_parent_queue_counts_the_pods_of_all_its_children() -> None:
    # team has no limit; its parent org (limit 2, no status yet) also holds sibling's GPU.
    sibling = in_team(pod("trainer", node_name="n2", limits={"nvidia.com/gpu": "1"}), "sibling")
    queues = {
        "team": Queue("team", parent="org"),
        "sibling": Queue("sibling", parent="org"),
        "org": Queue("org", limit=2.0),
    }
    result = judge(
        grow(0.5, 0.75), full_gpu_view(queues, spare_gpus=2, others=(sibling,)), moving(), NOW
    )
    assert isinstance(result, Skip), "today: org reads as 0 allocated"
    assert "queue org to 2.25 GPU, past its limit 2" in result.actuation.detail


def test_the_pods_in_a_queue_are_those_kai_charges_for_it() -> None:
    pods = [
        in_team(kai("a", "0.25", group="g1")),  # bound: 0.25
        in_team(kai("b", "0.125", group="g1")),  # KAI counts 0.13
        in_team(kai("pending", "0.5", node_name=None)),  # not allocated yet
        in_team(pod("whole", limits={"nvidia.com/gpu": "2"})),  # whole GPUs count
        pod("elsewhere", limits={"nvidia.com/gpu": "1"}),  # not KAI's: no queue
    ]
    kai_pod = pod("unlabelled", annotations={"gpu-fraction": "0.5"})
    kai_pod["spec"]["schedulerName"] = "kai-scheduler"  # KAI's: the default queue
    inv = build_inventory(
        [node("n1", gpus=4)],
        [reservation("g1", UUID_A), *pods, kai_pod],
        cluster="t",
        default_gpu_memory_mib=MEM_MIB,
    )
    usage = usage_by_queue(inv.pods.values(), None, KaiSettings())
    assert usage == pytest.approx({"team": 2.38, "default-queue": 0.5})
    group = {"inference/pg": PodGroup("inference", "pg", queue="research")}
    a = inv.pods["inference/a"]
    assert pod_queue(a, group, KaiSettings()) == "team"
    grouped = replace(a, annotations={**a.annotations, "pod-group-name": "pg"})
    assert pod_queue(grouped, group, KaiSettings()) == "research"  # the PodGroup's spec.queue


def test_the_pod_groups_queue_is_the_one_checked() -> None:
    queues = {
        "team": Queue("team", limit=10.0),
        "capped": Queue("capped", limit=0.5),
    }
    base = full_gpu_view(queues, group="pg-chat")
    groups = {"inference/pg-chat": PodGroup("inference", "pg-chat", 1, "capped")}
    result = judge(grow(0.5, 0.75), replace(base, pod_groups=groups), moving(), NOW)
    assert isinstance(result, Skip), "today: the queue label (team) is read, not the PodGroup"
    assert "KAI queue capped" in result.actuation.detail
