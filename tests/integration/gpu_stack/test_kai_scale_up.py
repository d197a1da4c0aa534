"""cluster-autoscaler adds a kwok node for a pod KAI cannot place, and KAI binds it there.

The path fracpilot's scale-up placeholders rely on (issue 15, scenario 3): KAI marks the pod
``PodScheduled=False/Unschedulable``, the real cluster-autoscaler (kwok provider, node group
``gpu-h100`` of scripts/gpu-stack/manifests/ca-kwok-config.yaml) sees it and adds a node,
kwok makes the node Ready and KAI binds the pod to it.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.gpu_stack import GpuStack, kai_pod

pytestmark = pytest.mark.integration

NODE_GROUP_LABEL = "example.io/nodegroup"  # fromNodeLabelKey in ca-kwok-config.yaml


@pytest.mark.timeout(480)
def test_a_whole_gpu_pod_with_no_room_gets_a_node_from_cluster_autoscaler(
    autoscaler: GpuStack, gpu_namespace: str
) -> None:
    stack = autoscaler
    stack.create(kai_pod("needs-a-node", gpus=4), gpu_namespace)

    def running() -> dict[str, Any] | None:
        pod = stack.get("Pod", "needs-a-node", gpu_namespace)
        return pod if pod["spec"].get("nodeName") and pod["status"]["phase"] == "Running" else None

    pod = stack.wait(running, "needs-a-node Running on a node CA added", timeout=300)
    node = stack.get("Node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"].get(NODE_GROUP_LABEL) == "gpu-h100"
    assert node["metadata"]["annotations"].get("kwok.x-k8s.io/node") == "fake"
