"""HAMi in the actuator, from upstream's real formats (Project-HAMi/HAMi 4707fb02): GPUs from
``hami.io/node-nvidia-register`` (split count 10), plans HAMi's own fit rules accept (issue 15,
scenario 5, at unit level: HAMi is not served by the Go module proxy)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import decision
from fracpilot_actuator.admission.sizing import sizing_patch
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.hami import fit_rule
from fracpilot_actuator.kube.inventory import Inventory, build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan
from fracpilot_libs.contracts import MIB, GpuSharing, PlanKind, WorkloadTarget
from fracpilot_libs.hami.fit import DeviceRequest, device_request, misfit
from fracpilot_libs.hami.placement import accepts, usage
from fracpilot_libs.placement.planner import Placement, apply_pod_plan, plan_workload
from support.kube_objects import T0, hami, node

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
UUID_B = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
T4_MIB = 15360
OWNER = ("Deployment", "chat")
LATER, NOW = T0 + timedelta(minutes=5), T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings(allow_single_replica=True))


def register(*uuids: str, count: int = 10, memory: int = T4_MIB, health: bool = True) -> str:
    """What HAMi's device plugin writes (MarshalNodeDevices: struct order, zero values out)."""
    entries = []
    for i, uuid in enumerate(uuids):
        entry: dict[str, Any] = {"id": uuid, "index": i} if i else {"id": uuid}
        entry |= {"count": count, "devmem": memory, "devcore": 100, "type": "NVIDIA-Tesla T4"}
        entry |= {"mode": "hami-core"} | ({"health": True} if health else {})
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def hami_node(name: str = "n1", *uuids: str, count: int = 10, **kw: Any) -> dict[str, Any]:
    uuids = uuids or (UUID_A, UUID_B)
    raw: dict[str, Any] = node(name, gpus=len(uuids) * count, memory_mib=None)  # the slots
    raw["metadata"]["annotations"] = {
        "hami.io/node-nvidia-register": register(*uuids, count=count, **kw)
    }
    return raw


def allocated(uuid: str, memory: int, cores: int) -> str:
    return f"{uuid},NVIDIA,{memory},{cores}:;"  # EncodePodSingleDevice, one container


def inventory(nodes: list[dict[str, Any]], pods: list[Any], factor: int = 1) -> Inventory:
    return build_inventory(
        nodes, pods, cluster="test", default_gpu_memory_mib=81920, hami_memory_factor=factor
    )


def test_gpus_come_from_the_register_not_the_slot_count() -> None:
    inv = inventory([hami_node()], [])
    assert inv.problems == ()  # no "no label nvidia.com/gpu.memory" either
    assert [g.uuid for g in inv.state.gpus] == [UUID_A, UUID_B]  # 2 GPUs, not 20
    a = inv.state.gpus[0]
    assert (a.memory_bytes, a.slots, a.cores, a.healthy, a.type) == (
        T4_MIB * MIB,
        10,
        100,
        True,
        "NVIDIA-Tesla T4",
    )


def test_an_unreadable_register_is_a_node_problem_and_no_gpus() -> None:
    raw = hami_node()
    raw["metadata"]["annotations"]["hami.io/node-nvidia-register"] = '[{"id":1}]'
    inv = inventory([raw], [])
    assert inv.state.gpus == ()
    assert [p.subject for p in inv.problems] == ["node n1"]


def test_shares_hold_what_hami_recorded() -> None:
    pods = [hami("chat-0", allocated(UUID_B, 3840, 25), owner=OWNER)]
    inv = inventory([hami_node()], pods)
    [placement] = inv.state.placements
    assert (placement.gpu_uuid, placement.fraction) == (UUID_B, 0.25)
    assert (placement.memory_mib, placement.cores) == (3840, 25)
    unknown = hami("x-0", allocated("GPU-elsewhere", 3840, 25))
    assert "did not register" in str(inventory([hami_node()], [unknown]).problems[0])


def test_gpumem_limits_are_read_with_the_memory_factor() -> None:
    """Before HAMi scheduled the pod its limits count: gpumem is in memoryFactor units."""
    pending = hami("p-0", None, limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3"})
    inv = inventory([hami_node()], [pending], factor=1024)
    share = inv.pods["inference/p-0"].share
    assert share is not None
    assert share.memory_mib == 3072
    assert share.fraction == 3072 / T4_MIB


def chat_view(*pods: Any, nodes: list[dict[str, Any]] | None = None) -> ClusterView:
    inv = inventory(nodes or [hami_node()], list(pods))
    made = decision(name="chat")
    return ClusterView(inv, inv.pods_of(made.workload, {}), None, {"fracpilot.io/mode": "auto"})


def test_whole_percent_rounding_sends_the_pod_to_another_gpu() -> None:
    """A neighbour holds 0.625 (63 % cores): 0.375 fits in the free share of GPU A, but HAMi
    counts 38 % + 63 % cores, so the plan (and HAMi) put the pod on GPU B."""
    view = chat_view(
        hami("chat-0", allocated(UUID_A, 3840, 25), owner=OWNER),
        hami("other-0", allocated(UUID_A, 9600, 63)),
    )
    grow = decision(0.25, 0.375, name="chat", decided_at=LATER)
    plan = judge(grow, view, GUARDS, NOW)
    assert isinstance(plan, ActuationPlan), plan
    assert plan.gpu_backend is GpuSharing.HAMI
    [step] = plan.plan.steps
    assert (step.kind, step.gpu_after) == (PlanKind.RECREATE_ELSEWHERE, UUID_B)
    # The free-share model alone would have kept it on A.
    share_only = plan_workload(view.inventory.state, grow.workload, (), 0.375)
    assert share_only.kind is PlanKind.NONE
    state = apply_pod_plan(view.inventory.state, step)
    assert accepts(state) == ()


def test_the_slot_count_limits_sharing() -> None:
    """A GPU registered with count 2 takes two shares, however much memory is free."""
    nodes = [hami_node("n1", UUID_A, count=2)]
    view = chat_view(
        hami("chat-0", allocated(UUID_A, 1000, 5), owner=OWNER),
        hami("other-0", allocated(UUID_A, 1000, 5)),
        nodes=nodes,
    )
    gpu = view.inventory.state.gpus[0]
    assert misfit(usage(view.inventory.state, gpu), DeviceRequest(1)) == (
        "CardTimeSlicingExhausted"
    )
    plan = judge(decision(0.1, 0.2, name="chat", decided_at=LATER), view, GUARDS, NOW)
    assert isinstance(plan, ActuationPlan)
    [step] = plan.plan.steps
    # Its own slot is freed when it is recreated: it fits on its GPU again.
    assert (step.kind, step.gpu_after) == (PlanKind.RECREATE_ELSEWHERE, UUID_A)


def test_an_unhealthy_gpu_takes_nothing() -> None:
    nodes = [hami_node("n1", UUID_A), hami_node("n2", UUID_B, health=False)]
    view = chat_view(
        hami("chat-0", allocated(UUID_A, 3840, 25), owner=OWNER),
        hami("other-0", allocated(UUID_A, 11520, 75)),
        nodes=nodes,
    )
    plan = judge(decision(0.25, 0.5, name="chat", decided_at=LATER), view, GUARDS, NOW)
    assert isinstance(plan, ActuationPlan)
    assert plan.plan.kind is PlanKind.SCALE_UP


def test_an_overcommitted_cluster_fails_the_check() -> None:
    inv = inventory(
        [hami_node()],
        [
            hami("a-0", allocated(UUID_A, 5760, 38)),
            hami("b-0", allocated(UUID_A, 9600, 63)),  # 101 % cores
        ],
    )
    assert accepts(inv.state) == (f"inference/b-0: CardInsufficientCore on {UUID_A}",)


# --- property: whatever the planner plans, HAMi's fit rules accept ---------------------------

SHARE = st.integers(min_value=1, max_value=100)  # percent of a GPU


@settings(max_examples=150, deadline=None)
@given(
    existing=st.lists(st.tuples(st.sampled_from([UUID_A, UUID_B]), SHARE, SHARE), max_size=12),
    mine=st.lists(st.sampled_from([UUID_A, UUID_B]), min_size=1, max_size=3),
    target=SHARE,
    count=st.integers(min_value=1, max_value=10),
)
def test_plans_always_pass_hamis_fit(
    existing: list[tuple[str, int, int]], mine: list[str], target: int, count: int
) -> None:
    # A cluster HAMi could have made: pods bound one by one where HAMi's rules let them; a
    # neighbour's memory and cores are set apart (gpumem and gpucores are separate limits).
    pods: list[Any] = []
    names = [f"chat-{i}" for i in range(len(mine))] + [f"n-{i}" for i in range(len(existing))]
    shares = [(uuid, 10, 10) for uuid in mine] + existing
    for name, (uuid, mem_pct, cores) in zip(names, shares, strict=True):
        owner = OWNER if name.startswith("chat") else None
        candidate = hami(name, allocated(uuid, T4_MIB * mem_pct // 100, cores), owner=owner)
        trial = inventory([hami_node(count=count)], [*pods, candidate])
        if accepts(trial.state) == ():
            pods.append(candidate)
    view = chat_view(*pods, nodes=[hami_node(count=count)])
    assert accepts(view.inventory.state) == ()
    mine_now = view.inventory.placements_of(view.live)
    plan = plan_workload(
        view.inventory.state,
        decision(name="chat").workload,
        mine_now,
        target / 100,
        in_place=False,
        fit=fit_rule(GpuSharing.HAMI),
    )
    state = view.inventory.state
    for step in plan.steps:
        state = apply_pod_plan(state, step)
    # Steps that wait for a new GPU left their pod where it was: the rest must fit as planned.
    waiting = {s.pod for s in plan.steps if s.kind is PlanKind.SCALE_UP}
    planned = tuple(
        p for p in state.placements if p.pod not in waiting or not p.pod.startswith("chat")
    )
    assert accepts(state.model_copy(update={"placements": planned})) == ()
    assert all(isinstance(p, Placement) for p in planned)


# --- what the webhook writes for HAMi ---------------------------------------------------------


def test_the_webhook_writes_gpumem_in_hamis_units() -> None:
    """memoryFactor 1024: HAMi reads gpumem 30 as 30720 MiB; percents are whole, rounded up."""
    pod = {
        "metadata": {"name": "chat-0", "namespace": "inference"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": "1",
                            "nvidia.com/gpumem": "4",
                            "nvidia.com/gpucores": "10",
                        }
                    },
                }
            ]
        },
    }
    target = WorkloadTarget(
        workload=decision(name="chat").workload,
        fraction=0.375,
        memory_mib=30721,
        backend=GpuSharing.HAMI,
        decision_id="d-1",
        updated_at=NOW,
    )
    sizing = sizing_patch(pod, target, hami_memory_factor=1024)
    written = {
        op["path"].rsplit("/", 1)[1].replace("~1", "/"): op["value"] for op in sizing.builder.ops
    }
    assert written == {"nvidia.com/gpumem": "31", "nvidia.com/gpucores": "38"}
    request = device_request(
        gpumem=int(written["nvidia.com/gpumem"]), gpucores=38, memory_factor=1024
    )
    assert request.memory_mib >= target.memory_mib  # HAMi reserves at least the target
    assert sizing_patch(pod, target).builder.ops[0]["value"] == "30721"  # factor 1


def test_allocated_devices_with_more_fields_are_read_as_hami_does() -> None:
    """``DecodeContainerDevices`` reads the first four fields and ignores the rest."""
    inv = inventory([hami_node()], [hami("x-0", f"{UUID_A},NVIDIA,3840,25,extra:;")])
    assert inv.problems == ()
    assert inv.state.placements[0].fraction == 0.25
