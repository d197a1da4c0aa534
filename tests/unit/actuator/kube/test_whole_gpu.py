"""A target of a whole GPU for a KAI pod (issue 26): KAI's validating webhook refuses
``gpu-fraction`` >= 1 on update, so the judge recreates a ``gpu-fraction`` pod, and the admission
webhook gives the new pod ``nvidia.com/gpu: 1`` (tests/unit/actuator/admission)."""

from __future__ import annotations

from datetime import timedelta

from factories import decision
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan
from fracpilot_libs.contracts import PlanKind
from support.kube_objects import MEM_MIB, T0, node, pod, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
NOW = T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings(allow_single_replica=True))


def alone(annotations: dict[str, str]) -> ClusterView:
    """chat alone on n1's only GPU: a whole GPU fits where it is."""
    chat = pod(
        "chat-0",
        annotations=annotations,
        labels={"runai-gpu-group": "g1"},
        owner=("Deployment", "chat"),
    )
    inv = build_inventory(
        [node("n1", gpus=1)],
        [reservation("g1", UUID_A), chat],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    made = decision(0.5, 1.0)
    return ClusterView(inv, inv.pods_of(made.workload, {}), None, {"fracpilot.io/mode": "auto"})


def test_a_whole_gpu_for_a_gpu_fraction_pod_is_a_recreate_never_gpu_fraction_one() -> None:
    made = decision(0.5, 1.0, decided_at=T0 + timedelta(minutes=5))
    result = judge(made, alone({"gpu-fraction": "0.5"}), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE, (
        "today: in place, writing gpu-fraction '1', which KAI's webhook refuses"
    )
    assert result.decision.new_fraction == 1.0
    assert "KAI's webhook accepts a gpu-fraction only in (0, 1)" in result.plan.reason
    assert result.plan.steps[0].gpu_after == UUID_A  # KAI may put it back where it was


def test_a_gpu_memory_pod_takes_its_whole_gpu_in_place() -> None:
    # gpu-memory is any positive MiB to KAI's validator: all of the GPU is accepted in place.
    made = decision(0.5, 1.0, decided_at=T0 + timedelta(minutes=5))
    result = judge(made, alone({"gpu-memory": str(MEM_MIB // 2)}), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE
    assert result.memory_mib == 81900  # KAI counts the label floored to 100 MiB (kai.py)
