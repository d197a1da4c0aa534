"""A vLLM server downsized on the real KAI-Scheduler (issue 28, "Real-stack scenario"): its
preallocated pool does not shrink in place, so the actuator recreates the pod, and the
replacement comes back at the new fraction with vLLM's memory flag rewritten by fracpilot's
webhook (kube/preallocation.py, admission/sizing.py).

The actuator runs in-process on the stack's apiserver (tests/support/fracpilot_on_stack.py);
KAI (admission, scheduler, binder), kwok and kube-controller-manager do the rest.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fracpilot_actuator.admission import TARGET_ANNOTATION
from fracpilot_libs.contracts import Outcome, PlanKind
from support.fracpilot_on_stack import (
    KaiScenario,
    apply,
    decide,
    gpu_portions,
    in_thread,
    kai_deployment,
    wait_replacement,
    wait_running,
)
from support.gpu_stack import GPU_FRACTION

pytestmark = pytest.mark.integration

# The vLLM production stack's serving container (vllm-project/production-stack a6c01db0
# helm/templates/deployment-vllm-multi.yaml, rendered as in tests/unit/libs/llm_servers/
# test_pod_specs.py), its flag at what fracpilot writes for 0.5: 0.5 less vLLM's 5% margin.
VLLM_COMMAND = [
    "vllm",
    "serve",
    "facebook/opt-125m",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--max-model-len",
    "4096",
    "--dtype",
    "bfloat16",
]
VLLM_ARGS = ["--gpu_memory_utilization", "0.475"]


def vllm_deployment(name: str, fraction: str) -> dict[str, Any]:
    deployment = kai_deployment(name, fraction)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    container.update(
        name="vllm",
        image="vllm/vllm-openai:v0.9.2",
        command=list(VLLM_COMMAND),
        args=list(VLLM_ARGS),
        env=[{"name": "HF_HOME", "value": "/tmp"}],
    )
    return deployment


@pytest.mark.timeout(300)
async def test_a_vllm_downsize_is_a_recreate_whose_pod_comes_back_with_the_rewritten_flag(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    node = await kai.add_gpu_node()
    async with kai.actuator():
        await in_thread(stack.create, vllm_deployment("chat", "0.5"), ns)
        [chat] = await in_thread(wait_running, stack, ns, "chat")
        assert chat["spec"]["containers"][0]["args"] == VLLM_ARGS  # 0.475 fits 0.5: untouched

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.25)
        # PENDING once evicted; APPLIED only when the replacement is bound, read from it.
        evicted, verified = await apply(nats_url, made, count=2, timeout=150)
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert "its pool does not shrink in place" in evicted.detail, evicted
        assert "--gpu-memory-utilization=0.237" in evicted.detail, evicted
        assert (verified.plan, verified.outcome) == (
            PlanKind.RECREATE_ELSEWHERE,
            Outcome.APPLIED,
        ), verified

        new = await wait_replacement(stack, ns, "chat", chat, "the recreated vLLM pod Running")
        # Recreated, not patched in place: a new pod, the old one gone.
        assert new["metadata"]["name"] != chat["metadata"]["name"]
        assert new["metadata"]["annotations"][GPU_FRACTION] == "0.25"
        assert TARGET_ANNOTATION in new["metadata"]["annotations"]
        assert await in_thread(gpu_portions, stack, new) == ["0.25"]
        # fracpilot's webhook rewrote the value token in place: 0.25 less the 5% margin.
        [container] = new["spec"]["containers"]
        assert container["command"] == VLLM_COMMAND
        assert container["args"] == ["--gpu_memory_utilization", "0.237"]
        # The result's facts are the new pod's.
        assert new["metadata"]["name"] in verified.detail, verified
        assert (verified.node_after, verified.fraction_after) == (node, 0.25)
        assert verified.enforced_fraction in (None, 0.25)
        # The template keeps what its owner wrote; the webhook sizes each new pod.
        template = await in_thread(stack.get, "Deployment", "chat", ns, "apps/v1")
        spec = copy.deepcopy(template["spec"]["template"]["spec"])
        assert spec["containers"][0]["args"] == VLLM_ARGS
