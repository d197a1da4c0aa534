"""The pure placement planner (the actuator's, and ``fracpilot replay --pack``'s)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import GIB, decision, workload
from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.placement.planner import (
    ClusterState,
    Gpu,
    Placement,
    add_node,
    apply_plan,
    fits,
    plan_resize,
)

MEM = 80 * GIB


def cluster(*gpus: tuple[str, list[tuple[str, float]]]) -> ClusterState:
    """GPUs named ``GPU-<name>`` on node ``node-<name>``, each with (workload, fraction) pods."""
    state = ClusterState(
        gpus=tuple(Gpu(uuid=f"GPU-{g}", node=f"node-{g}", memory_bytes=MEM) for g, _ in gpus)
    )
    placements = tuple(
        Placement(workload=workload(name), pod=f"{name}-0", gpu_uuid=f"GPU-{g}", fraction=f)
        for g, pods in gpus
        for name, f in pods
    )
    return state.model_copy(update={"placements": placements})


def fraction_of(state: ClusterState, name: str) -> float:
    placement = state.placement(workload(name))
    assert placement is not None
    return placement.fraction


# --- plan_resize -----------------------------------------------------------------------------


def test_in_place_when_the_new_fraction_fits_on_the_current_gpu() -> None:
    state = cluster(("a", [("chat", 0.25), ("other", 0.5)]), ("b", []))
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="chat"))
    assert plan.kind is PlanKind.IN_PLACE
    assert (plan.gpu_before, plan.gpu_after) == ("GPU-a", "GPU-a")
    assert (plan.fraction_before, plan.fraction_after) == (0.25, 0.5)


def test_downsize_is_always_in_place() -> None:
    state = cluster(("a", [("chat", 0.75), ("other", 0.25)]))
    plan = plan_resize(state, decision(current=0.75, new=0.375, name="chat"))
    assert plan.kind is PlanKind.IN_PLACE
    assert plan.gpu_after == "GPU-a"


def test_own_fraction_does_not_count_against_itself() -> None:
    # 0.5 used by chat itself + 0.5 by other: chat may grow to 0.5 but not beyond.
    state = cluster(("a", [("chat", 0.25), ("other", 0.5)]))
    assert fits(state, "GPU-a", 0.5, workload("chat"))
    assert not fits(state, "GPU-a", 0.625, workload("chat"))
    assert not fits(state, "GPU-a", 0.5, workload("newcomer"))


def test_recreate_elsewhere_picks_the_fullest_gpu_that_still_fits() -> None:
    state = cluster(
        ("a", [("chat", 0.25), ("big", 0.75)]),  # current GPU: no room to grow
        ("b", []),  # 1.0 free: fits, but a large hole worth keeping
        ("c", [("x", 0.5)]),  # 0.5 free: fits, fullest that fits
        ("d", [("y", 0.75)]),  # 0.25 free: too small
    )
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="chat"))
    assert plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert (plan.gpu_before, plan.gpu_after) == ("GPU-a", "GPU-c")
    assert "GPU-c" in plan.reason


def test_recreate_ties_break_on_gpu_uuid() -> None:
    state = cluster(("a", [("chat", 0.25), ("big", 0.75)]), ("z", []), ("m", []))
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="chat"))
    assert plan.gpu_after == "GPU-m"


def test_scale_up_when_nothing_fits() -> None:
    state = cluster(
        ("a", [("chat", 0.5), ("big", 0.5)]),
        ("b", [("x", 0.5)]),
        ("c", [("y", 0.625)]),
    )
    plan = plan_resize(state, decision(current=0.5, new=0.75, name="chat"))
    assert plan.kind is PlanKind.SCALE_UP
    assert plan.gpu_after == ""
    assert plan.gpu_before == "GPU-a"
    assert apply_plan(state, plan) == state  # nothing moves until capacity exists


def test_none_for_an_unknown_workload() -> None:
    state = cluster(("a", [("chat", 0.25)]))
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="ghost"))
    assert plan.kind is PlanKind.NONE
    assert plan.fraction_before is None
    assert "ghost" in plan.reason
    assert apply_plan(state, plan) == state


def test_workloads_are_matched_by_full_key_not_name() -> None:
    state = cluster(("a", [("chat", 0.25)]))
    other_ns = decision(current=0.25, new=0.5, workload=workload("chat", namespace="batch"))
    assert plan_resize(state, other_ns).kind is PlanKind.NONE


@pytest.mark.parametrize(
    ("neighbours", "new"),
    [
        ([0.125, 0.125, 0.125], 0.625),  # the brief's case: 3 * 0.125 + 0.625 = 1.0
        ([0.8], 0.2),  # decimal grid: 1.0 - 0.8 = 0.19999999999999996 < 0.2
        ([0.2, 0.4], 0.4),  # 1.0 - (0.2 + 0.4) = 0.3999999999999999 < 0.4
        ([0.1, 0.1, 0.6], 0.2),
    ],
)
def test_float_sums_that_are_one_still_fit(neighbours: list[float], new: float) -> None:
    pods = [(f"n{i}", f) for i, f in enumerate(neighbours)]
    state = cluster(("a", [("chat", 0.05), *pods]), ("b", []))
    plan = plan_resize(state, decision(current=0.05, new=new, name="chat"))
    assert plan.kind is PlanKind.IN_PLACE
    after = apply_plan(state, plan)
    assert after.used("GPU-a") == pytest.approx(1.0)


@pytest.mark.parametrize(("neighbours", "new"), [([0.8], 0.2), ([0.2, 0.4], 0.4)])
def test_decimal_cases_really_overflow_in_floats(neighbours: list[float], new: float) -> None:
    # Guards the test above: without the tolerance these would not fit.
    assert 1.0 - sum(neighbours) < new


def test_a_real_overflow_does_not_fit() -> None:
    state = cluster(("a", [("chat", 0.125), ("n", 0.5)]))
    assert not fits(state, "GPU-a", 0.5 + 1e-6, workload("chat"))
    assert fits(state, "GPU-a", 0.5, workload("chat"))


# --- apply_plan / add_node ---------------------------------------------------------------------


def test_apply_in_place_changes_only_the_target_fraction() -> None:
    state = cluster(("a", [("chat", 0.25), ("other", 0.5)]), ("b", [("x", 0.125)]))
    after = apply_plan(state, plan_resize(state, decision(current=0.25, new=0.5, name="chat")))
    chat = after.placement(workload("chat"))
    assert chat is not None
    assert (chat.gpu_uuid, chat.fraction, chat.pod) == ("GPU-a", 0.5, "chat-0")
    assert after.placement(workload("other")) == state.placement(workload("other"))
    assert after.placement(workload("x")) == state.placement(workload("x"))
    assert after.gpus == state.gpus
    assert state.placement(workload("chat")).fraction == 0.25  # type: ignore[union-attr]


def test_apply_recreate_moves_only_the_target_with_a_new_pod_name() -> None:
    state = cluster(("a", [("chat", 0.25), ("big", 0.75)]), ("b", [("x", 0.25)]))
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="chat"))
    assert plan.kind is PlanKind.RECREATE_ELSEWHERE
    after = apply_plan(state, plan, pod="chat-1")
    chat = after.placement(workload("chat"))
    assert chat is not None
    assert (chat.gpu_uuid, chat.fraction, chat.pod) == ("GPU-b", 0.5, "chat-1")
    assert after.used("GPU-a") == 0.75
    assert after.used("GPU-b") == 0.75
    assert [p.workload.key for p in after.placements] == [p.workload.key for p in state.placements]


def test_apply_rejects_an_unknown_target_gpu() -> None:
    state = cluster(("a", [("chat", 0.25)]))
    plan = plan_resize(state, decision(current=0.25, new=0.5, name="chat"))
    bogus = plan.model_copy(update={"gpu_after": "GPU-nowhere"})
    with pytest.raises(ValueError, match="unknown GPU"):
        apply_plan(state, bogus)


def test_add_node_adds_gpus_and_then_the_scale_up_fits() -> None:
    state = cluster(("a", [("chat", 0.5), ("big", 0.5)]))
    plan = plan_resize(state, decision(current=0.5, new=0.75, name="chat"))
    assert plan.kind is PlanKind.SCALE_UP

    grown = add_node(state, "node-new", gpus=2, memory_bytes=MEM)
    assert [g.uuid for g in grown.gpus] == ["GPU-a", "GPU-node-new-0", "GPU-node-new-1"]
    assert grown.nodes == ("node-a", "node-new")
    assert grown.placements == state.placements
    assert len(state.gpus) == 1

    replanned = plan_resize(grown, decision(current=0.5, new=0.75, name="chat"))
    assert replanned.kind is PlanKind.RECREATE_ELSEWHERE
    assert replanned.gpu_after == "GPU-node-new-0"


def test_nodes_are_unique_and_ordered() -> None:
    state = add_node(add_node(ClusterState(), "n1", 2, MEM), "n2", 1, MEM)
    assert state.nodes == ("n1", "n2")
    assert state.gpu("GPU-n2-0") is not None
    assert state.gpu("GPU-n3-0") is None


# --- property: plans never overcommit a GPU ------------------------------------------------------


@st.composite
def clusters_and_decisions(draw: st.DrawFn) -> tuple[ClusterState, str, float]:
    steps = draw(st.sampled_from([4, 8, 10, 16]))
    n_gpus = draw(st.integers(1, 5))
    state = add_node(ClusterState(), "n", n_gpus, MEM)
    fractions = draw(st.lists(st.integers(1, steps), min_size=1, max_size=12))
    placements: list[Placement] = []
    for i, k in enumerate(fractions):
        f = k / steps
        partial = state.model_copy(update={"placements": tuple(placements)})
        wl = workload(f"w{i}")
        gpu = next((g for g in partial.gpus if fits(partial, g.uuid, f, wl)), None)
        if gpu is not None:
            placements.append(Placement(workload=wl, pod=f"w{i}-0", gpu_uuid=gpu.uuid, fraction=f))
    state = state.model_copy(update={"placements": tuple(placements)})
    target = draw(st.sampled_from([p.workload.owner_name for p in placements]))
    new = draw(st.integers(1, steps)) / steps
    return state, target, new


@settings(max_examples=150, deadline=None)
@given(clusters_and_decisions())
def test_applied_plans_never_overcommit_a_gpu(case: tuple[ClusterState, str, float]) -> None:
    state, target, new = case
    current = state.placement(workload(target))
    assert current is not None
    if new == current.fraction:
        return
    plan = plan_resize(state, decision(current=current.fraction, new=new, name=target))
    assert plan.kind is not PlanKind.NONE
    if plan.kind is PlanKind.SCALE_UP:
        # Scale-up only when it truly fits nowhere.
        assert all(state.free(g.uuid, workload(target)) + 1e-9 < new for g in state.gpus)
        return
    after = apply_plan(state, plan)
    for gpu in after.gpus:
        assert sum(p.fraction for p in after.placements if p.gpu_uuid == gpu.uuid) <= 1.0 + 1e-9
    moved = after.placement(workload(target))
    assert moved is not None
    assert moved.fraction == new
    assert moved.gpu_uuid == plan.gpu_after
    others_before = [p for p in state.placements if p.workload.owner_name != target]
    others_after = [p for p in after.placements if p.workload.owner_name != target]
    assert others_before == others_after
