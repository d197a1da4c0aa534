"""KAI-Scheduler's shapes (kube/kai.py) in the inventory and the judge: the binder's reservation
flags, multi-device fraction pods, BindRequests, and fractions KAI's rounding keeps as planned.

Upstream formulas (NVIDIA/KAI-scheduler v0.12.0) are restated here, so that a property test
compares our choice with what KAI computes: ``cache.go`` formats GPU_PORTION ``%.2f``;
``getNonMigGpus`` counts ``Round(portion * 100) / 100``; ``getNodeGpuMemory`` floors the label
to 100 MiB and ``getGpuMemoryFractionalOnNode`` is ``Ceil(MiB / that * 100) / 100``.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import decision
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.inventory import Inventory, build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_actuator.kube.kai import (
    BindTarget,
    bind_targets,
    fraction_devices,
    gpu_portion,
    kai_fraction,
    kai_memory_mib,
    memory_fraction,
    multi_device_refusal,
    quota_portion,
)
from fracpilot_libs.contracts import GpuSharing, Outcome, PlanKind
from fracpilot_libs.kai import KaiSettings
from support.kube_objects import MEM_MIB, T0, kai, node, pod, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
UUID_B = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
OWNER = ("Deployment", "chat")
NOW = T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings())
OPTED_IN = {"fracpilot.io/mode": "auto"}


def inventory(pods: list[Any], **kw: Any) -> Inventory:
    return build_inventory(
        [node("n1", gpus=2)], pods, cluster="test", default_gpu_memory_mib=MEM_MIB, **kw
    )


def shares(inv: Inventory) -> list[tuple[str, str, float]]:
    return sorted((p.pod, p.gpu_uuid, p.fraction) for p in inv.state.placements)


def grow(current: float, new: float) -> Any:
    return decision(current, new, name="chat", decided_at=T0 + timedelta(minutes=5))


def view_of(inv: Inventory) -> ClusterView:
    made = decision(name="chat")
    return ClusterView(inv, inv.pods_of(made.workload, {}), None, OPTED_IN)


# --- the binder's reservation flags -------------------------------------------------------------


def test_reservation_pods_are_found_where_the_binder_flags_put_them() -> None:
    custom = reservation("g1", UUID_A)
    custom["metadata"]["namespace"] = "gpu-reservations"
    custom["metadata"]["labels"]["app"] = "reserved"
    pods = [custom, kai("chat-0", "0.5", group="g1", owner=OWNER)]
    # Defaults (the binder's flag defaults): that pod is not KAI's reservation pod.
    assert shares(inventory(pods)) == [("chat-0", "n1/group/g1", 0.5)]
    moved = KaiSettings(reservation_namespace="gpu-reservations", reservation_app_label="reserved")
    assert shares(inventory(pods, kai=moved)) == [("chat-0", UUID_A, 0.5)]
    # In the namespace but without the app label: KAI does not take it for one either.
    only_ns = KaiSettings(reservation_namespace="gpu-reservations")
    assert shares(inventory(pods, kai=only_ns)) == [("chat-0", "n1/group/g1", 0.5)]


def test_kai_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from fracpilot_actuator.settings import ActuatorSettings

    monkeypatch.setenv("FRACPILOT_KAI_RESERVATION_NAMESPACE", "gpu-reservations")
    monkeypatch.setenv("FRACPILOT_KAI_RESERVATION_APP_LABEL", "reserved")
    monkeypatch.setenv("FRACPILOT_KAI_QUEUE_BOUND", "quota")
    kai_settings = ActuatorSettings().kai
    assert (
        kai_settings.reservation_namespace,
        kai_settings.reservation_app_label,
        kai_settings.queue_bound,
    ) == ("gpu-reservations", "reserved", "quota")
    assert KaiSettings().reservation_namespace == "kai-resource-reservation"
    assert KaiSettings().reservation_app_label == "kai-resource-reservation"


# --- multi-device fraction pods -----------------------------------------------------------------


def multi(name: str, groups: tuple[str, ...], devices: str = "2", **kw: Any) -> dict[str, Any]:
    labels = {f"runai-gpu-group/{g}": g for g in groups}
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": devices}
    return pod(name, annotations=annotations, labels=labels, owner=OWNER, **kw)


def test_a_multi_device_pod_counts_on_each_of_its_gpus() -> None:
    inv = inventory(
        [reservation("g1", UUID_A), reservation("g2", UUID_B), multi("m-0", ("g1", "g2"))]
    )
    assert shares(inv) == [("m-0", UUID_A, 0.5), ("m-0", UUID_B, 0.5)]
    assert not any(g.uuid == "n1/unknown" for g in inv.state.gpus)
    # Before its groups are known: one synthetic GPU per device, never one unknown share.
    early = inventory([multi("m-0", ())])
    assert shares(early) == [("m-0", "n1/pod/uid-m-0/0", 0.5), ("m-0", "n1/pod/uid-m-0/1", 0.5)]
    assert early.problems == ()


def test_a_multi_device_workload_is_refused_with_a_reason_and_a_metric_label() -> None:
    inv = inventory(
        [reservation("g1", UUID_A), reservation("g2", UUID_B), multi("chat-0", ("g1", "g2"))]
    )
    result = judge(grow(0.5, 0.6), view_of(inv), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.SKIPPED
    assert result.actuation.held_back == "multi_device"
    assert "multi-device fraction pod" in result.actuation.detail
    assert "gpu-fraction-num-devices='2'" in result.actuation.detail
    assert result.warnings == ()


def test_multi_device_detection() -> None:
    one = ("ns/p", {"gpu-fraction": "0.5"}, {"runai-gpu-group": "g"})
    assert multi_device_refusal([one]) == ""
    assert multi_device_refusal([("ns/p", {"gpu-fraction-num-devices": "1"}, {})]) == ""
    assert multi_device_refusal([("ns/p", {}, {"runai-gpu-group/g": "g"})])
    assert multi_device_refusal([("ns/p", {"gpu-fraction-num-devices": "x"}, {})])
    assert fraction_devices({"gpu-fraction-num-devices": "3"}) == 3
    with pytest.raises(ValueError, match="not a positive whole number"):
        fraction_devices({"gpu-fraction-num-devices": "0"})


# --- BindRequests ---------------------------------------------------------------------------


def bind_request(pod_name: str, node_name: str, *groups: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": pod_name, "namespace": "inference"},
        "spec": {"podName": pod_name, "selectedNode": node_name, "selectedGPUGroups": list(groups)},
        "status": status,
    }


def test_a_pod_counts_on_its_bind_requests_node_before_it_is_bound() -> None:
    pending = kai("chat-1", "0.5", owner=OWNER, node_name=None, phase="Pending")
    pods = [reservation("g1", UUID_A), kai("chat-0", "0.25", group="g1", owner=OWNER), pending]
    assert shares(inventory(pods)) == [("chat-0", UUID_A, 0.25)]  # not bound: nowhere
    bound = bind_targets([bind_request("chat-1", "n1", "g1")])
    assert bound == {"inference/chat-1": BindTarget("n1", ("g1",))}
    inv = inventory(pods, bound=bound)
    assert shares(inv) == [("chat-0", UUID_A, 0.25), ("chat-1", UUID_A, 0.5)]
    assert inv.state.used(UUID_A) == pytest.approx(0.75)
    assert inv.pods["inference/chat-1"].node == "n1"


def test_a_failed_bind_request_with_no_attempts_left_does_not_count() -> None:
    failed = bind_request("chat-1", "n1", phase="Failed")
    retrying = bind_request("chat-2", "n1", phase="Failed", failedAttempts=1)
    retrying["spec"]["backoffLimit"] = 3
    assert set(bind_targets([failed, retrying])) == {"inference/chat-2"}
    assert bind_targets([bind_request("chat-3", "")]) == {}


# --- fractions KAI keeps as planned ---------------------------------------------------------


def go_round(value: float) -> float:
    """Go's math.Round: half away from zero."""
    return math.floor(value + 0.5) if value >= 0 else -math.floor(-value + 0.5)


@given(st.floats(min_value=0.001, max_value=1.0, allow_nan=False))
def test_the_written_fraction_is_what_gpu_portion_and_kai_accounting_say(planned: float) -> None:
    written = kai_fraction(planned)
    assert written >= planned - 1e-9  # never less than planned
    assert written - planned < 0.01 + 1e-9  # by less than one hundredth
    assert float(gpu_portion(written)) == written  # GPU_PORTION "%.2f" holds it exactly
    assert go_round(written * 100) / 100 == written == quota_portion(written)


@given(
    st.integers(min_value=1, max_value=100),
    st.integers(min_value=200, max_value=1_000_000),
)
def test_gpu_memory_is_chosen_so_that_kai_counts_the_planned_fraction(
    hundredths: int, label_mib: int
) -> None:
    planned = hundredths / 100
    memory = kai_memory_mib(planned, label_mib)
    floored = label_mib - label_mib % 100
    assert math.ceil(memory / floored * 100) / 100 == planned  # KAI's own formula
    assert memory_fraction(memory, label_mib) == planned
    assert memory_fraction(memory + 1, label_mib) > planned or memory + 1 > floored


def test_examples_from_kai() -> None:
    assert gpu_portion(0.125) == "0.12"  # why 0.125 is never written
    assert kai_fraction(0.125) == 0.13
    assert kai_fraction(0.375) == 0.38
    assert kai_memory_mib(0.25, 81920) == 20475  # a quarter of 81900, not of 81920
    assert memory_fraction(20480, 81920) == 0.26


def test_the_judge_writes_hundredths_and_kais_gpu_memory() -> None:
    pods = [reservation("g1", UUID_A), kai("chat-0", "0.25", group="g1", owner=OWNER)]
    result = judge(grow(0.25, 0.375), view_of(inventory(pods)), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.gpu_backend is GpuSharing.KAI
    assert result.plan.kind is PlanKind.IN_PLACE
    target = result.target(NOW)
    assert target.fraction == 0.38
    assert target.memory_mib == kai_memory_mib(0.38, MEM_MIB)
    assert memory_fraction(target.memory_mib, MEM_MIB) == 0.38
