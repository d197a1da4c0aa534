"""Scale-up placeholders shaped like KAI's scaling pod (kai-scheduler/KAI-Scheduler d5bc503a,
``pkg/nodescaleadjuster/scaler/scaling_pod.go``), claiming one whole GPU in each backend's terms."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from factories import decision
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.placeholders import (
    copied_requests,
    placeholder_pod,
)
from fracpilot_actuator.settings import ActuatorSettings, CapacitySettings
from support.kube_objects import hami, kai, node

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def with_requests(raw: dict[str, Any], *requests: dict[str, str]) -> dict[str, Any]:
    spec = raw["spec"]
    limits = spec["containers"][0]["resources"]["limits"]
    spec["containers"] = [
        {"name": f"c{i}", "resources": {"requests": r, **({"limits": limits} if i == 0 else {})}}
        for i, r in enumerate(requests)
    ]
    spec["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "64"}}}]
    spec["nodeSelector"] = {"pool": "gpu"}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    return raw


def body(raw: dict[str, Any], namespace: str = "fracpilot") -> dict[str, Any]:
    inv = build_inventory([node("n1")], [raw], cluster="test", default_gpu_memory_mib=81920)
    [info] = inv.pods.values()
    return placeholder_pod(
        name="p", namespace=namespace, decision=decision(), pod=info, image="pause"
    )


def test_requests_are_summed_over_the_containers_as_kai_does() -> None:
    containers = [
        {"resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
        {"resources": {"requests": {"cpu": "0.25", "memory": "512Mi"}}},
        {"resources": {"limits": {"cpu": "8"}}},  # limits are not copied
    ]
    assert copied_requests(containers) == {"cpu": "1750m", "memory": str(2560 * 1024**2)}
    assert copied_requests([{}]) == {}


def test_a_kai_placeholder_is_one_gpu_and_the_pods_requests() -> None:
    raw = with_requests(
        kai("chat-0", "0.5", group="g1"), {"cpu": "2", "memory": "8Gi"}, {"cpu": "500m"}
    )
    made = body(raw)
    spec = made["spec"]
    [container] = spec["containers"]
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "2500m", "memory": str(8 * 1024**3)},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert made["metadata"]["namespace"] == "fracpilot"


def test_a_hami_placeholder_asks_for_what_the_node_allocates() -> None:
    """Issue 26: the autoscaler simulates kube-scheduler's fit on node templates, where only
    the slots HAMi's device plugin registers (``nvidia.com/gpu``) exist; ``gpumem-percentage``
    and ``gpucores`` are allocatable nowhere, so a placeholder asking for them never made a
    node appear."""
    raw = with_requests(hami("chat-0", f"{UUID_A},NVIDIA,3000,0:;"), {"cpu": "1"})
    resources = body(raw)["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "1000m"},
        "limits": {"nvidia.com/gpu": "1"},
    }


def test_never_in_kai_scale_adjust() -> None:
    with pytest.raises(ValueError, match="kai-scale-adjust"):
        body(kai("chat-0", "0.5", group="g1"), namespace="kai-scale-adjust")
    with pytest.raises(ValidationError, match="kai-scale-adjust"):
        CapacitySettings(namespace="kai-scale-adjust")
    assert CapacitySettings(namespace="gpu-capacity").namespace == "gpu-capacity"


def test_hami_and_capacity_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_HAMI_MEMORY_FACTOR", "1024")
    assert ActuatorSettings().hami.memory_factor == 1024
    monkeypatch.setenv("FRACPILOT_CAPACITY_NAMESPACE", "kai-scale-adjust")
    with pytest.raises(ValidationError, match="kai-scale-adjust"):
        ActuatorSettings()
