"""The Kubernetes inventory (Node and Pod objects -> ClusterState) and per-pod planning on it.

Objects are written as the API returns them (camelCase JSON); one test feeds the client's
models instead. Bad values must become problems that name the pod, never exceptions.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from fracpilot_actuator.kube.inventory import (
    Inventory,
    build_inventory,
    last_change,
    owner_parents,
)
from fracpilot_actuator.kube.object_values import (
    HamiDevice,
    is_opted_out,
    parse_hami_devices,
    parse_kai_fraction,
)
from fracpilot_libs.contracts import MIB, GpuSharing, PlanKind, WorkloadRef
from fracpilot_libs.placement.planner import ClusterState, apply_pod_plan, plan_workload
from support.kube_objects import MEM_MIB, T0, hami, kai, node, pod, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
UUID_B = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"


def inventory(nodes: list[Any], pods: list[Any]) -> Inventory:
    return build_inventory(nodes, pods, cluster="test", default_gpu_memory_mib=40960)


def shares(inv: Inventory) -> dict[str, tuple[str, float]]:
    return {p.pod: (p.gpu_uuid, p.fraction) for p in inv.state.placements}


# --- nodes ---------------------------------------------------------------------------------------


def test_node_gpus_and_memory_from_allocatable_and_label() -> None:
    inv = inventory([node("n1", gpus=2), node("cpu-only", gpus=0)], [])
    assert [(g.uuid, g.node) for g in inv.state.gpus] == [("n1/free-0", "n1"), ("n1/free-1", "n1")]
    assert {g.memory_bytes for g in inv.state.gpus} == {MEM_MIB * MIB}
    assert inv.problems == ()


def test_a_node_without_the_memory_label_uses_the_default_and_says_so() -> None:
    inv = inventory([node("n1", gpus=1, memory_mib=None)], [])
    assert inv.state.gpus[0].memory_bytes == 40960 * MIB
    assert [str(p) for p in inv.problems] == [
        "node n1: no label nvidia.com/gpu.memory; assuming 40960 MiB"
    ]


def test_gpu_count_falls_back_to_the_gfd_label() -> None:
    labelled = {
        "metadata": {
            "name": "n1",
            "labels": {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "24576"},
        }
    }
    inv = inventory([labelled], [])
    assert len(inv.state.gpus) == 4


# --- KAI -----------------------------------------------------------------------------------------


def test_kai_pods_sit_on_the_gpu_their_reservation_pod_names() -> None:
    inv = inventory(
        [node("n1", gpus=3)],
        [
            reservation("g1", UUID_A),
            kai("chat-0", "0.5", group="g1"),
            kai("embed-0", "0.25", group="g1"),
            reservation("g2", None),  # the reservation pod has not reported its GPU yet
            kai("rank-0", "0.125", group="g2"),
        ],
    )
    assert shares(inv) == {
        "chat-0": (UUID_A, 0.5),
        "embed-0": (UUID_A, 0.25),
        "rank-0": ("n1/group/g2", 0.125),
    }
    assert sorted(g.uuid for g in inv.state.gpus) == sorted([UUID_A, "n1/group/g2", "n1/free-0"])
    assert inv.state.used(UUID_A) == 0.75
    assert "gpu-reservation-g1" not in {p.split("/")[1] for p in inv.pods}  # not a workload pod
    assert inv.problems == ()


def test_kai_pod_without_a_group_gets_a_per_node_synthetic_gpu() -> None:
    inv = inventory([node("n1")], [kai("chat-0", "0.5")])
    assert shares(inv) == {"chat-0": ("n1/unknown", 0.5)}
    assert inv.pods["inference/chat-0"].share is not None
    assert inv.pods["inference/chat-0"].share.kai_key == "gpu-fraction"  # type: ignore[union-attr]


def test_kai_gpu_memory_is_the_fraction_kai_counts() -> None:
    # KAI floors the 81920 MiB label to 81900 and rounds 20480 / 81900 up to 0.26 (kai.py);
    # 20475 MiB is a quarter as KAI counts it.
    inv = inventory([node("n1")], [pod("chat-0", annotations={"gpu-memory": "20480"})])
    assert shares(inv) == {"chat-0": ("n1/unknown", 0.26)}
    quarter = inventory([node("n1")], [pod("chat-0", annotations={"gpu-memory": "20475"})])
    assert shares(quarter) == {"chat-0": ("n1/unknown", 0.25)}
    share = inv.pods["inference/chat-0"].share
    assert share is not None
    assert (share.backend, share.memory_mib, share.kai_key) == (GpuSharing.KAI, 20480, "gpu-memory")


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"gpu-fraction": "abc"}, "gpu-fraction 'abc' is not a number"),
        ({"gpu-fraction": "1.5"}, "gpu-fraction '1.5' is not a portion of a GPU"),
        ({"gpu-fraction": "-1"}, "gpu-fraction '-1' is not a portion of a GPU"),
        ({"gpu-fraction": "0"}, "is not a portion of a GPU"),
        ({"gpu-fraction": "1"}, "is not a portion of a GPU"),
        ({"gpu-fraction": "nan"}, "is not a portion of a GPU"),
        ({"gpu-fraction": ""}, "is not a number"),
        ({"gpu-memory": "2Gi"}, "gpu-memory '2Gi' is not a positive whole number of MiB"),
        ({"gpu-memory": "0"}, "is not a positive whole number"),
        ({"gpu-memory": "90000"}, "more than the GPU's 81920 MiB"),
        ({"gpu-fraction": "0.5", "gpu-memory": "100"}, "both gpu-fraction and gpu-memory"),
    ],
)
def test_bad_kai_annotations_are_problems_naming_the_pod(
    annotations: dict[str, str], message: str
) -> None:
    inv = inventory([node("n1")], [pod("chat-0", annotations=annotations), kai("ok-0", "0.25")])
    assert len(inv.problems) == 1
    problem = inv.problems[0]
    assert problem.subject == "pod inference/chat-0"
    assert message in problem.message
    assert shares(inv) == {"ok-0": ("n1/unknown", 0.25)}  # the rest is read as usual
    bad = inv.pods["inference/chat-0"]
    assert (bad.backend, bad.share) == (GpuSharing.KAI, None)
    assert inv.problems_of([bad]) == (problem,)
    assert inv.problems_of([inv.pods["inference/ok-0"]]) == ()


def test_a_kai_pod_on_a_node_without_gpus_is_a_problem() -> None:
    inv = inventory([node("cpu", gpus=0)], [kai("chat-0", "0.5", node_name="cpu")])
    assert [str(p) for p in inv.problems] == [
        "pod inference/chat-0: it runs on node cpu, which reports no GPUs"
    ]


def test_an_unscheduled_pod_holds_nothing_and_is_no_problem() -> None:
    inv = inventory([node("n1")], [kai("chat-1", "0.5", node_name=None, phase="Pending")])
    assert shares(inv) == {}
    assert inv.problems == ()
    assert "inference/chat-1" in inv.pods


# --- HAMi ----------------------------------------------------------------------------------------


def test_parse_hami_devices_per_container_and_device() -> None:
    text = f"{UUID_A},NVIDIA,3000,30:;{UUID_A},NVIDIA,5000,0:{UUID_B},NVIDIA,1000,0:;"
    assert parse_hami_devices(text) == (
        (HamiDevice(UUID_A, "NVIDIA", 3000, 30),),
        (HamiDevice(UUID_A, "NVIDIA", 5000, 0), HamiDevice(UUID_B, "NVIDIA", 1000, 0)),
    )
    assert parse_hami_devices("") == ()


@pytest.mark.parametrize(
    "text", ["GPU-x,NVIDIA,3000:;", "GPU-x,NVIDIA,lots,0:;", ",NVIDIA,3000,0:;", "GPU-x,N,-1,0:"]
)
def test_parse_hami_devices_rejects_malformed_devices(text: str) -> None:
    with pytest.raises(ValueError, match=r"hami\.io/vgpu-devices-allocated"):
        parse_hami_devices(text)


def test_hami_pods_from_the_allocated_annotation() -> None:
    inv = inventory(
        [node("n1", gpus=2)],
        [
            hami("chat-0", f"{UUID_A},NVIDIA,20480,30:;"),
            hami("embed-0", f"{UUID_A},NVIDIA,40960,0:;"),
        ],
    )
    assert shares(inv) == {"chat-0": (UUID_A, 0.25), "embed-0": (UUID_A, 0.5)}
    assert sorted(g.uuid for g in inv.state.gpus) == sorted([UUID_A, "n1/free-0"])
    assert inv.pods["inference/chat-0"].backend is GpuSharing.HAMI


def test_hami_pods_before_scheduling_read_their_limits() -> None:
    inv = inventory(
        [node("n1")],
        [
            hami("a-0", None, limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"}),
            hami("b-0", None, limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}),
        ],
    )
    assert shares(inv) == {"a-0": ("n1/unknown", 0.5), "b-0": ("n1/unknown", 0.25)}


@pytest.mark.parametrize(
    ("devices", "limits", "message"),
    [
        ("GPU-x,NVIDIA,lots,0:;", None, "non-integer"),
        (f"{UUID_A},NVIDIA,3000,0:{UUID_B},NVIDIA,3000,0:;", None, "lists 2 devices"),
        (f"{UUID_A},NVIDIA,0,0:;", None, "holds 0 MiB"),
        (None, {"nvidia.com/gpucores": "30"}, "no memory share"),
        (None, {"nvidia.com/gpumem-percentage": "150"}, "is not 1..100"),
    ],
)
def test_bad_hami_values_are_problems_naming_the_pod(
    devices: str | None, limits: dict[str, str] | None, message: str
) -> None:
    inv = inventory([node("n1")], [hami("chat-0", devices, limits=limits)])
    assert [p.subject for p in inv.problems] == ["pod inference/chat-0"]
    assert message in inv.problems[0].message
    assert inv.state.placements == ()


# --- whole GPUs, placeholders, phases ------------------------------------------------------------


def test_whole_gpu_pods_take_gpus_and_overcommit_is_reported() -> None:
    inv = inventory(
        [node("n1", gpus=2)],
        [pod("trainer-0", limits={"nvidia.com/gpu": "1"}), kai("chat-0", "0.5")],
    )
    assert sorted(g.uuid for g in inv.state.gpus) == ["n1/unknown"]  # 2 - 1 whole - 1 shared
    over = inventory([node("n1", gpus=1)], [pod("t-0", limits={"nvidia.com/gpu": "2"})])
    assert [str(p) for p in over.problems] == ["node n1: 2 GPUs are in use but it has 1"]


def test_finished_pods_are_ignored_and_a_bound_placeholder_holds_its_gpu() -> None:
    """Issue 26: a placeholder bound on a node is a used GPU in every inventory, so no other
    decision plans onto the capacity a scale-up waits to use; it is no workload's pod."""
    placeholder = {"fracpilot.io/role": "capacity"}
    inv = inventory(
        [node("n1", gpus=2)],
        [
            pod("done-0", phase="Succeeded", limits={"nvidia.com/gpu": "1"}),
            pod("fracpilot-capacity-x", labels=placeholder, limits={"nvidia.com/gpu": "1"}),
            pod(
                "fracpilot-capacity-y",
                node_name=None,  # pending: holds nothing yet
                labels=placeholder,
                limits={"nvidia.com/gpu": "1"},
            ),
        ],
    )
    held = "n1/placeholder/inference/fracpilot-capacity-x"
    assert [g.uuid for g in inv.state.gpus] == [held, "n1/free-0"]
    assert inv.state.free(held) == 0
    assert [p.name for p in inv.placeholders] == ["fracpilot-capacity-x", "fracpilot-capacity-y"]
    assert inv.pods == {}


def test_client_models_read_like_api_dicts() -> None:
    model_node = client.V1Node(
        metadata=client.V1ObjectMeta(name="n1", labels={"nvidia.com/gpu.memory": "81920"}),
        status=client.V1NodeStatus(allocatable={"nvidia.com/gpu": "1"}),
    )
    model_pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="chat-0",
            namespace="inference",
            annotations={"gpu-fraction": "0.5"},
            creation_timestamp=T0,
        ),
        spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(name="main")]),
        status=client.V1PodStatus(phase="Running"),
    )
    inv = inventory([model_node], [model_pod])
    assert shares(inv) == {"chat-0": ("n1/unknown", 0.5)}
    assert inv.pods["inference/chat-0"].created_at == T0


# --- owners, opt-out, last change ----------------------------------------------------------------


def test_pods_of_a_workload_follow_owner_references() -> None:
    inv = inventory(
        [node("n1", gpus=4)],
        [
            kai("llm-a", "0.25", owner=("ReplicaSet", "chat-6b7f9c")),
            kai("llm-b", "0.25", owner=("ReplicaSet", "chat-6b7f9c")),
            kai("chat-old", "0.25", owner=("ReplicaSet", "chat-5a1")),
            kai("db-0", "0.25", owner=("StatefulSet", "db")),
            kai("shell", "0.25"),
            kai("chat-x", "0.25", namespace="other", owner=("ReplicaSet", "chat-6b7f9c")),
        ],
    )
    replica_sets = [
        {
            "metadata": {
                "name": rs,
                "namespace": "inference",
                "ownerReferences": [{"kind": "Deployment", "name": "chat", "controller": True}],
            }
        }
        for rs in ("chat-6b7f9c", "chat-5a1")
    ]
    parents = owner_parents(replica_sets, "ReplicaSet")
    chat = WorkloadRef(cluster="test", namespace="inference", owner_name="chat")
    assert [p.name for p in inv.pods_of(chat, parents)] == ["chat-old", "llm-a", "llm-b"]
    db = chat.model_copy(update={"owner_kind": "StatefulSet", "owner_name": "db"})
    assert [p.name for p in inv.pods_of(db, parents)] == ["db-0"]
    bare = chat.model_copy(update={"owner_kind": "Pod", "owner_name": "shell"})
    assert [p.name for p in inv.pods_of(bare, parents)] == ["shell"]
    # Without the ReplicaSets, the pods belong to the ReplicaSet itself.
    assert inv.pods_of(chat, {}) == ()


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [
        ("labels", "true", True),
        ("annotations", "True", True),
        ("labels", "false", False),
        ("annotations", "", False),
    ],
)
def test_opt_out_by_label_or_annotation(where: str, value: str, expected: bool) -> None:
    obj = {"metadata": {where: {"fracpilot.io/opt-out": value}}}
    assert is_opted_out({"metadata": {}}, obj) is expected


def test_last_change_is_the_newest_pod_or_in_place_resize() -> None:
    resized = (T0 + timedelta(hours=2)).isoformat()
    inv = inventory(
        [node("n1")],
        [
            kai("a", "0.25", created=T0),
            kai("b", "0.25", created=T0 + timedelta(hours=1)),
        ],
    )
    assert last_change(inv.pods.values()) == T0 + timedelta(hours=1)
    inv2 = inventory(
        [node("n1")],
        [pod("a", annotations={"gpu-fraction": "0.25", "fracpilot.io/resized-at": resized})],
    )
    assert last_change(inv2.pods.values()) == T0 + timedelta(hours=2)
    assert last_change([]) is None


# --- planning on the inventory: per pod, KAI and HAMi --------------------------------------------


CHAT = WorkloadRef(cluster="test", namespace="inference", owner_kind="ReplicaSet", owner_name="c")


def chat_plan(inv: Inventory, new: float, in_place: bool = True) -> Any:
    pods = tuple(p for p in inv.state.placements if p.workload.owner_name == "c")
    return plan_workload(inv.state, CHAT, pods, new, in_place=in_place)


def test_kai_replicas_resize_in_place_when_each_fits() -> None:
    inv = inventory(
        [node("n1", gpus=2)],
        [
            reservation("g1", UUID_A),
            reservation("g2", UUID_B),
            kai("c-0", "0.25", group="g1", owner=("ReplicaSet", "c")),
            kai("c-1", "0.25", group="g2", owner=("ReplicaSet", "c")),
            kai("other", "0.5", group="g1"),
        ],
    )
    plan = chat_plan(inv, 0.5)
    assert plan.kind is PlanKind.IN_PLACE
    assert [(s.pod, s.kind, s.gpu_after) for s in plan.steps] == [
        ("c-0", PlanKind.IN_PLACE, UUID_A),
        ("c-1", PlanKind.IN_PLACE, UUID_B),
    ]
    assert not plan.disruptive


def test_replicas_are_planned_on_the_cluster_the_earlier_steps_leave() -> None:
    # Both replicas share one GPU: 0.25 + 0.25 -> 0.5 + 0.5 fits exactly, 0.625 each does not.
    inv = inventory(
        [node("n1", gpus=1)],
        [
            kai("c-0", "0.25", group="g1", owner=("ReplicaSet", "c")),
            kai("c-1", "0.25", group="g1", owner=("ReplicaSet", "c")),
            reservation("g1", UUID_A),
        ],
    )
    assert chat_plan(inv, 0.5).kind is PlanKind.IN_PLACE
    plan = chat_plan(inv, 0.625)
    assert [s.kind for s in plan.steps] == [PlanKind.IN_PLACE, PlanKind.SCALE_UP]
    assert plan.kind is PlanKind.SCALE_UP
    assert plan.disruptive
    assert [s.pod for s in plan.steps_of(PlanKind.SCALE_UP)] == ["c-1"]


def test_hami_fit_on_its_own_gpu_is_still_a_recreate() -> None:
    inv = inventory(
        [node("n1", gpus=1)], [hami("c-0", f"{UUID_A},NVIDIA,20480,0:;", owner=("ReplicaSet", "c"))]
    )
    plan = chat_plan(inv, 0.5, in_place=False)
    assert plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert plan.steps[0].gpu_after == UUID_A
    assert "cannot change a running pod" in plan.reason
    down = chat_plan(inv, 0.125, in_place=False)  # a downsize too: paced by the PDB
    assert down.kind is PlanKind.RECREATE_ELSEWHERE


def test_recreate_elsewhere_and_scale_up_on_the_inventory() -> None:
    inv = inventory(
        [node("n1", gpus=1), node("n2", gpus=1)],
        [
            reservation("g1", UUID_A),
            kai("c-0", "0.25", group="g1", owner=("ReplicaSet", "c")),
            kai("big", "0.75", group="g1"),
        ],
    )
    moved = chat_plan(inv, 0.5)
    assert moved.kind is PlanKind.RECREATE_ELSEWHERE
    assert moved.steps[0].gpu_after == "n2/free-0"
    assert inv.gpu_node(moved.steps[0].gpu_after) == "n2"
    full = inventory(
        [node("n1", gpus=1)],
        [
            reservation("g1", UUID_A),
            kai("c-0", "0.25", group="g1", owner=("ReplicaSet", "c")),
            kai("big", "0.75", group="g1"),
        ],
    )
    assert chat_plan(full, 0.5).kind is PlanKind.SCALE_UP


def test_a_pod_already_at_the_fraction_is_left_alone() -> None:
    inv = inventory([node("n1")], [kai("c-0", "0.5", owner=("ReplicaSet", "c"))])
    plan = chat_plan(inv, 0.5)
    assert plan.kind is PlanKind.NONE
    assert "already holds 0.5" in plan.reason
    assert plan_workload(ClusterState(), CHAT, (), 0.5).kind is PlanKind.NONE


# --- properties ----------------------------------------------------------------------------------


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_parse_kai_fraction_accepts_exactly_the_portions_of_a_gpu(value: float) -> None:
    if 0.0 < value < 1.0:
        assert parse_kai_fraction(repr(value)) == value
    else:
        with pytest.raises(ValueError, match="gpu-fraction"):
            parse_kai_fraction(repr(value))


@settings(max_examples=200, deadline=None)
@given(
    fraction=st.text(max_size=12),
    memory=st.one_of(st.none(), st.text(max_size=8)),
    hami_text=st.text(alphabet="GPU-abc0123,:;NVIDIA ", max_size=40),
)
def test_any_annotation_text_is_read_or_reported_never_raised(
    fraction: str, memory: str | None, hami_text: str
) -> None:
    annotations = {"gpu-fraction": fraction}
    if memory is not None:
        annotations = {"gpu-memory": memory}
    inv = inventory(
        [node("n1", gpus=2)],
        [pod("k-0", annotations=annotations), hami("h-0", hami_text or None)],
    )
    for name in ("k-0", "h-0"):
        placed = any(p.pod == name for p in inv.state.placements)
        reported = any(p.subject == f"pod inference/{name}" for p in inv.problems)
        assert placed != reported
    for gpu in inv.state.gpus:
        assert gpu.memory_bytes > 0


@settings(max_examples=150, deadline=None)
@given(
    neighbours=st.lists(st.integers(1, 8), max_size=6),
    replicas=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    new=st.integers(1, 8),
    gpus=st.integers(1, 3),
)
def test_planned_steps_never_overcommit_a_gpu(
    neighbours: list[int], replicas: list[int], new: int, gpus: int
) -> None:
    """Place pods first-fit on groups g0..; plan the replicas; apply; no GPU above 1."""
    pods: list[dict[str, Any]] = [reservation(f"g{i}", f"GPU-{i}") for i in range(gpus)]
    used = [0] * gpus
    for i, eighths in enumerate([*replicas, *neighbours]):
        slot = next((g for g in range(gpus) if used[g] + eighths <= 8), None)
        if slot is None:
            continue
        used[slot] += eighths
        owner = ("ReplicaSet", "c") if i < len(replicas) else ("ReplicaSet", f"n{i}")
        pods.append(kai(f"p{i}", str(eighths / 8) if eighths < 8 else "0.999", group=f"g{slot}",
                        owner=owner))  # fmt: skip
    inv = inventory([node("n1", gpus=gpus)], pods)
    assert inv.problems == ()
    plan = chat_plan(inv, new / 8)
    state = inv.state
    for step in plan.steps:  # each step holds on the cluster the earlier steps left
        if step.kind is PlanKind.SCALE_UP:
            key = f"inference/{step.pod}"
            assert all(state.free(g.uuid, excluding_pod=key) + 1e-9 < new / 8 for g in state.gpus)
        state = apply_pod_plan(state, step)
        for gpu in state.gpus:
            assert state.used(gpu.uuid) <= 1.0 + 1e-9
