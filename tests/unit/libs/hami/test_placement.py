"""HAMi's fit rules as the planner's fit rule, over a plain ClusterState."""

from __future__ import annotations

from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.hami.placement import accepts, hami_fit
from fracpilot_libs.placement.planner import ClusterState, Gpu, Placement, plan_workload

MIB = 2**20
CHAT = WorkloadRef(cluster="c", namespace="ns", owner_kind="Deployment", owner_name="chat")
OTHER = WorkloadRef(cluster="c", namespace="ns", owner_kind="Deployment", owner_name="other")


def gpu(uuid: str, slots: int | None = 10) -> Gpu:
    return Gpu(uuid=uuid, node="n1", memory_bytes=15360 * MIB, slots=slots)


def test_rounded_cores_move_the_share_where_free_shares_would_not() -> None:
    chat = Placement(workload=CHAT, pod="chat-0", gpu_uuid="A", fraction=0.25)
    other = Placement(
        workload=OTHER, pod="o-0", gpu_uuid="A", fraction=0.625, memory_mib=9600, cores=63
    )
    state = ClusterState(gpus=(gpu("A"), gpu("B")), placements=(chat, other))
    by_share = plan_workload(state, CHAT, (chat,), 0.375)
    assert (by_share.kind, by_share.steps[0].gpu_after) == (PlanKind.IN_PLACE, "A")
    by_hami = plan_workload(state, CHAT, (chat,), 0.375, in_place=False, fit=hami_fit())
    assert (by_hami.kind, by_hami.steps[0].gpu_after) == (PlanKind.RECREATE_ELSEWHERE, "B")


def test_gpus_hami_did_not_register_keep_the_share_rule() -> None:
    chat = Placement(workload=CHAT, pod="chat-0", gpu_uuid="A", fraction=0.5)
    state = ClusterState(gpus=(gpu("A", slots=None),), placements=(chat,))
    assert accepts(state) == ()
    plan = plan_workload(state, CHAT, (chat,), 1.0, in_place=False, fit=hami_fit())
    assert plan.steps[0].gpu_after == "A"


def test_accepts_names_each_refusal() -> None:
    shares = tuple(
        Placement(workload=CHAT, pod=f"chat-{i}", gpu_uuid="A", fraction=0.1) for i in range(3)
    )
    state = ClusterState(gpus=(gpu("A", slots=2),), placements=shares)
    assert accepts(state) == ("ns/chat-2: CardTimeSlicingExhausted on A",)
