"""The demo's simulated backend downsizes a preallocating LLM server by a recreate, as the
Kubernetes backend does (issue 28)."""

from __future__ import annotations

from factories import workload
from fracpilot_actuator.simulated.backend import SimulatedBackend, preallocated_plan
from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.placement.planner import ResizePlan

GPU = "GPU-sim-node-0-0"


def step(name: str, before: float, after: float, kind: PlanKind = PlanKind.IN_PLACE) -> ResizePlan:
    return ResizePlan(
        kind=kind,
        workload=workload(name),
        fraction_before=before,
        fraction_after=after,
        gpu_before=GPU,
        gpu_after=GPU,
        reason="fits",
    )


def test_a_preallocating_servers_downsize_is_a_recreate_on_its_gpu() -> None:
    plan = preallocated_plan(step("chat-llama-8b", 0.5, 0.3), {"chat-llama-8b"})
    assert plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert (plan.gpu_before, plan.gpu_after, plan.fraction_after) == (GPU, GPU, 0.3)
    assert "pool does not shrink in place" in plan.reason


def test_upsizes_other_workloads_and_other_plans_are_left_as_planned() -> None:
    for planned, names in (
        (step("chat-llama-8b", 0.3, 0.5), {"chat-llama-8b"}),  # an upsize
        (step("embed-bge", 0.5, 0.3), {"chat-llama-8b"}),  # no server that preallocates
        (step("chat-llama-8b", 0.5, 0.5, PlanKind.NONE), {"chat-llama-8b"}),
    ):
        assert preallocated_plan(planned, names) == planned


def test_the_demo_backend_knows_the_simulations_preallocating_workloads() -> None:
    backend = SimulatedBackend(cluster=None, seed=None)  # type: ignore[arg-type]
    assert backend.preallocating == frozenset({"chat-llama-8b"})
