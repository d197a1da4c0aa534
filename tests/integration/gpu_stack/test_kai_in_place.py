"""KAI's accounting follows a fraction changed in place on a running pod (issue 15, scenario 1).

What an in-place downsize relies on, observed on the real KAI-Scheduler: the scheduler re-reads
the ``gpu-fraction`` annotation of running pods on every cycle (pod_info.go
``updatePodAdditionalFields``) and KAI's validating webhook admits the UPDATE, so the freed share
of the GPU goes to a pending pod that fits only there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from support.gpu_stack import GPU_FRACTION, GPU_GROUP, GpuStack, kai_pod

pytestmark = pytest.mark.integration


def _pod(stack: GpuStack, namespace: str, name: str) -> dict[str, Any]:
    return stack.get("Pod", name, namespace)


def _running(stack: GpuStack, namespace: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = _pod(stack, namespace, name)
        return pod if pod["spec"].get("nodeName") and pod["status"]["phase"] == "Running" else None

    found: dict[str, Any] = stack.wait(running, f"pod {namespace}/{name} Running", timeout=120)
    return found


def _unschedulable(stack: GpuStack, namespace: str, name: str) -> dict[str, Any] | None:
    pod = _pod(stack, namespace, name)
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return pod
    return None


@pytest.mark.timeout(480)
def test_a_fraction_downsized_in_place_frees_its_share_for_a_pod_that_fits_only_there(
    gpu_stack: GpuStack, gpu_namespace: str, make_gpu_node: Callable[[int], str]
) -> None:
    node = make_gpu_node(1)  # one GPU: the freed share is the only room anywhere
    for name in ("big", "other"):
        gpu_stack.create(kai_pod(name, fraction="0.5"), gpu_namespace)
    big = _running(gpu_stack, gpu_namespace, "big")
    group = big["metadata"]["labels"][GPU_GROUP]
    assert _running(gpu_stack, gpu_namespace, "other")["metadata"]["labels"][GPU_GROUP] == group

    gpu_stack.create(kai_pod("late", fraction="0.25"), gpu_namespace)
    gpu_stack.wait(
        lambda: _unschedulable(gpu_stack, gpu_namespace, "late"), "late Unschedulable", 60
    )

    gpu_stack.dynamic.resources.get(api_version="v1", kind="Pod").patch(
        name="big",
        namespace=gpu_namespace,
        body={"metadata": {"annotations": {GPU_FRACTION: "0.25"}}},
        content_type="application/merge-patch+json",
    )

    late = _running(gpu_stack, gpu_namespace, "late")
    assert (late["spec"]["nodeName"], late["metadata"]["labels"][GPU_GROUP]) == (node, group)
    big = _pod(gpu_stack, gpu_namespace, "big")
    assert big["status"]["phase"] == "Running"  # accounting only: the pod was not touched
    assert big["metadata"]["annotations"][GPU_FRACTION] == "0.25"
