"""KAI-Scheduler itself places GPU-fraction pods on kwok nodes (issue 15, the real stack).

What fracpilot's KAI model assumes, observed on the real scheduler, binder and admission
webhook: a ``gpu-fraction`` pod gets a reservation pod in ``kai-resource-reservation`` that
holds its GPU group and a ConfigMap with ``GPU_PORTION`` (``%.2f``), and is bound and Running;
a second fraction that fits shares the group; a pod that fits nowhere stays Unschedulable.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.fracpilot_on_stack import gpu_portions
from support.gpu_stack import (
    GPU_GROUP,
    RESERVATION_APP,
    RESERVATION_NS,
    GpuStack,
    kai_pod,
)

pytestmark = pytest.mark.integration


def _running(stack: GpuStack, namespace: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = stack.get("Pod", name, namespace)
        return pod if pod["spec"].get("nodeName") and pod["status"]["phase"] == "Running" else None

    pod: dict[str, Any] = stack.wait(running, f"pod {namespace}/{name} Running", timeout=120)
    return pod


def _reservation_nodes(stack: GpuStack, group: str) -> list[str]:
    """The nodes of the reservation pods holding GPU group ``group``."""
    selector = f"app={RESERVATION_APP},{GPU_GROUP}={group}"
    pods = stack.items("Pod", RESERVATION_NS, selector=selector)
    return [p["spec"].get("nodeName", "") for p in pods]


def _unschedulable(stack: GpuStack, namespace: str, name: str) -> dict[str, Any] | None:
    pod = stack.get("Pod", name, namespace)
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return pod
    return None


@pytest.mark.timeout(480)
def test_fraction_pods_share_a_reserved_gpu_and_an_oversized_pod_stays_unschedulable(
    gpu_stack: GpuStack, gpu_namespace: str, gpu_node: str
) -> None:
    gpu_stack.create(kai_pod("half-a", fraction="0.5"), gpu_namespace)
    first = _running(gpu_stack, gpu_namespace, "half-a")
    assert first["spec"]["nodeName"] == gpu_node
    group = first["metadata"].get("labels", {}).get(GPU_GROUP)
    assert group, f"KAI set no {GPU_GROUP} label: {first['metadata'].get('labels')}"
    assert _reservation_nodes(gpu_stack, group) == [gpu_node]
    assert gpu_portions(gpu_stack, first) == ["0.50"]

    gpu_stack.create(kai_pod("half-b", fraction="0.5"), gpu_namespace)
    second = _running(gpu_stack, gpu_namespace, "half-b")
    assert second["spec"]["nodeName"] == gpu_node
    assert second["metadata"]["labels"].get(GPU_GROUP) == group  # shares the first one's GPU
    assert _reservation_nodes(gpu_stack, group) == [gpu_node]  # still one reservation
    assert gpu_portions(gpu_stack, second) == ["0.50"]

    gpu_stack.create(kai_pod("too-big", gpus=8), gpu_namespace)  # the only node has 4 GPUs
    pod = gpu_stack.wait(
        lambda: _unschedulable(gpu_stack, gpu_namespace, "too-big"),
        "too-big PodScheduled=False/Unschedulable",
        timeout=60,
    )
    scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert [c["status"] for c in scheduled] == ["False"]
    assert not pod["spec"].get("nodeName")
