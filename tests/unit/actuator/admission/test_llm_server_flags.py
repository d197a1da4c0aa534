"""The admission webhook starts LLM servers at the size it gives them: the memory flag of vLLM,
SGLang and TGI is rewritten for the target's fraction (JSON Patch on the container's args,
command or env), and a flag that asks for more than the fraction is warned about.

The containers are the upstream shapes of ``tests/unit/libs/llm_servers/test_pod_specs.py``.
"""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_actuator.admission import (
    KAI_CONTAINER,
    KAI_FRACTION,
    LLM_FLAG_ABOVE_FRACTION,
    AdmissionOutcome,
    admit,
    template_patch,
    visible_share,
)
from fracpilot_actuator.admission.hamicore import MEMORY_LIMIT
from fracpilot_actuator.kube.enforcement import configmaps_of
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.metrics import WebhookMetrics
from fracpilot_libs.contracts import GpuSharing, WorkloadRef, WorkloadTarget
from fracpilot_libs.llm_servers import read_pod
from fracpilot_libs.nats import subjects

NS = "inference"
CHAT = WorkloadRef(cluster="test", namespace=NS, owner_kind="Deployment", owner_name="chat")
HASH = "6b7f9c5d8"

# vllm-project/production-stack a6c01db0 helm/templates/deployment-vllm-multi.yaml
PRODUCTION_STACK = {
    "name": "vllm",
    "image": "vllm/vllm-openai:latest",
    "command": [
        "vllm",
        "serve",
        "facebook/opt-125m",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--gpu_memory_utilization",
        "0.8",
    ],
    "resources": {},
}
# kserve/kserve aaac4e29 config/runtimes/kserve-vllmserver.yaml
KSERVE_VLLM = {
    "name": "kserve-container",
    "image": "vllm/vllm-openai:v0.9.2",
    "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
    "args": ["--port=8080", "--served-model-name=chat", "--model=/mnt/models"],
    "resources": {},
}
# opea-project/GenAIInfra 109cbece helm-charts/common/tgi/templates/deployment.yaml
TGI_OPEA = {
    "name": "tgi",
    "image": "ghcr.io/huggingface/text-generation-inference:2.4.0",
    "envFrom": [{"configMapRef": {"name": "tgi-config"}}],
}
# sgl-project/sglang 0e6ed14d docker/k8s-sglang-distributed-sts.yaml
SGLANG_SCRIPT = {
    "name": "sglang-container",
    "image": "docker.io/lmsysorg/sglang:latest",
    "command": ["/bin/bash", "-c"],
    "args": ["python3 -m sglang.launch_server \\\n--model /llm-folder \\\n--port 8000\n"],
}


def target(fraction: float, backend: GpuSharing = GpuSharing.KAI) -> WorkloadTarget:
    return WorkloadTarget(
        workload=CHAT,
        fraction=fraction,
        memory_mib=int(fraction * 81920),
        backend=backend,
        decision_id="d-7",
        updated_at=datetime(2026, 3, 2, tzinfo=UTC),
    )


def kai_pod(container: dict[str, Any], fraction: str = "0.9") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"chat-{HASH}-",
            "namespace": NS,
            "labels": {"app": "chat", "pod-template-hash": HASH},
            "annotations": {KAI_FRACTION: fraction},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"chat-{HASH}"}
                | {"uid": "u-1", "controller": True}
            ],
        },
        "spec": {"schedulerName": "kai-scheduler", "containers": [copy.deepcopy(container)]},
    }


def hami_pod(container: dict[str, Any]) -> dict[str, Any]:
    pod = kai_pod(container)
    del pod["metadata"]["annotations"][KAI_FRACTION]
    del pod["spec"]["schedulerName"]
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "90"}
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


def review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-42",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": NS,
            "operation": "CREATE",
            "object": pod,
        },
    }


def apply_patch(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove on objects (strict: replace needs the member)."""
    doc = copy.deepcopy(document)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"][1:].split("/")]
        parent: Any = doc
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        assert isinstance(parent, dict), op
        if op["op"] == "remove":
            del parent[last]
        else:
            assert op["op"] == "add" or last in parent, op
            parent[last] = copy.deepcopy(op["value"])
    return doc


def admitted(pod: dict[str, Any], wanted: WorkloadTarget) -> tuple[Any, dict[str, Any]]:
    admission = admit(review(pod), {subjects.kv_key(CHAT): wanted}, "test")
    body = admission.review["response"]
    ops = json.loads(base64.b64decode(body["patch"])) if "patch" in body else []
    return admission, apply_patch(pod, ops)


def test_a_vllm_pod_downsized_gets_its_flag_rewritten_in_its_form() -> None:
    admission, stored = admitted(kai_pod(PRODUCTION_STACK), target(0.5))
    assert admission.outcome is AdmissionOutcome.PATCHED
    command = stored["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--gpu_memory_utilization", "0.475"]
    assert command[:-1] == PRODUCTION_STACK["command"][:-1]
    assert stored["metadata"]["annotations"][KAI_FRACTION] == "0.5"
    assert "vllm memory flag 0.475" in admission.reason
    # 0.8 of the card is more than 0.5: warned, in the AdmissionReview and for an Event.
    assert "asks 0.8 of the GPU" in admission.llm_warning
    assert admission.review["response"]["warnings"] == [
        f"{LLM_FLAG_ABOVE_FRACTION}: {admission.llm_warning}"
    ]
    again, _ = admitted(stored, target(0.5))  # reinvoked: nothing more to change
    assert again.outcome is AdmissionOutcome.UNCHANGED
    assert not again.llm_warning


def test_kserve_vllm_without_the_flag_gets_it_added_to_its_args() -> None:
    admission, stored = admitted(kai_pod(KSERVE_VLLM), target(0.25))
    args = stored["spec"]["containers"][0]["args"]
    assert args == [*KSERVE_VLLM["args"], "--gpu-memory-utilization=0.237"]
    assert "asks 0.92" in admission.llm_warning  # vLLM's default, more than 0.25


def test_under_hamis_memory_limit_the_flag_is_a_share_of_the_limit() -> None:
    admission, stored = admitted(hami_pod(KSERVE_VLLM), target(0.5, GpuSharing.HAMI))
    container = stored["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpumem-percentage"] == "50"
    assert container["args"][-1] == "--gpu-memory-utilization=0.95"  # of the 50 % it sees
    assert admission.outcome is AdmissionOutcome.PATCHED


def test_tgi_from_a_config_map_gets_the_env_variable() -> None:
    pod = kai_pod({**TGI_OPEA, "resources": {}})
    admission, stored = admitted(pod, target(0.5))
    container = stored["spec"]["containers"][0]
    assert container["env"] == [{"name": "CUDA_MEMORY_FRACTION", "value": "0.475"}]
    assert container["envFrom"] == TGI_OPEA["envFrom"]
    assert "asks 1 of the GPU" in admission.llm_warning


def test_a_shell_started_server_is_untouched_with_a_warning_and_counted() -> None:
    pod = kai_pod({**SGLANG_SCRIPT, "resources": {}})
    admission, stored = admitted(pod, target(0.5))
    assert stored["spec"]["containers"][0] == {**SGLANG_SCRIPT, "resources": {}}
    assert "shell script" in admission.llm_warning
    assert admission.llm is not None
    assert not admission.llm.applies
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    metrics.count_llm_server(admission)
    labels = {"server": "sglang", "result": "untouched"}
    assert registry.get_sample_value("fracpilot_webhook_llm_server_flags_total", labels) == 1


def test_the_metrics_count_a_flag_above_the_fraction() -> None:
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    admission, _ = admitted(kai_pod(PRODUCTION_STACK), target(0.5))
    metrics.count_llm_server(admission)
    above = {"server": "vllm", "rewritten": "true"}
    flags = {"server": "vllm", "result": "rewritten"}
    assert registry.get_sample_value("fracpilot_webhook_llm_flags_too_large_total", above) == 1
    assert registry.get_sample_value("fracpilot_webhook_llm_server_flags_total", flags) == 1


def test_a_pod_that_cannot_take_its_target_keeps_its_flag() -> None:
    pod = kai_pod(PRODUCTION_STACK)
    del pod["metadata"]["annotations"][KAI_FRACTION]  # no GPU request at all
    admission, stored = admitted(pod, target(0.5))
    assert admission.outcome is AdmissionOutcome.UNCHANGED
    assert stored["spec"]["containers"][0]["command"] == PRODUCTION_STACK["command"]


def test_a_recreate_writes_the_flag_into_the_deployments_template() -> None:
    deployment = {"spec": {"template": {k: v for k, v in kai_pod(PRODUCTION_STACK).items()}}}
    del deployment["spec"]["template"]["apiVersion"]
    sizing, ops = template_patch(deployment, target(0.375))
    assert sizing.applies
    stored = apply_patch(deployment, ops)
    template = stored["spec"]["template"]
    assert template["metadata"]["annotations"][KAI_FRACTION] == "0.375"
    reading = read_pod(template["spec"])
    assert reading.value == 0.356  # 0.375 x 0.95, rounded down
    assert not reading.asks_more_than(0.375)


# --- KAI with its hamicore plugin: HAMi-core reports the limit as CUDA's total ------------------


def with_hamicore(pod: dict[str, Any]) -> dict[str, Any]:
    """What KAI's hamicore webhook adds (pkg/admission/webhook/v1alpha2/hamicore/hamicore.go at
    d5bc503a, modelled in kube/enforcement.py): the limit from the pod's GPU-sharing ConfigMap."""
    pod = copy.deepcopy(pod)
    ref = {"name": "chat-abcdefg-shared-gpu-0", "key": "CUDA_DEVICE_MEMORY_LIMIT"}
    env = pod["spec"]["containers"][0].setdefault("env", [])
    env.append({"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": ref}})
    return pod


def test_under_kais_hamicore_limit_the_flag_is_a_share_of_the_limit() -> None:
    admission, stored = admitted(with_hamicore(kai_pod(KSERVE_VLLM)), target(0.5))
    assert admission.outcome is AdmissionOutcome.PATCHED
    assert stored["spec"]["containers"][0]["args"][-1] == "--gpu-memory-utilization=0.95"


def test_kais_hundredths_hold_the_flag_to_the_smaller_limit() -> None:
    # 0.125 is bound as the portion "0.12": the limit CUDA reports is 0.12 of the card, so the
    # server gets 0.95 of that (0.114), not 0.125 x 0.95 / 0.12 = 0.989 of it
    _, stored = admitted(with_hamicore(kai_pod(KSERVE_VLLM)), target(0.125))
    assert stored["spec"]["containers"][0]["args"][-1] == "--gpu-memory-utilization=0.95"


def test_kais_webhook_adds_the_limit_after_ours_and_the_reinvocation_rewrites_the_flag() -> None:
    # first pass: no limit yet (mutating-kai-admission sorts after fracpilot-targets)
    _, stored = admitted(kai_pod(PRODUCTION_STACK), target(0.5))
    assert stored["spec"]["containers"][0]["command"][-1] == "0.475"
    # KAI's webhook adds the env; reinvocationPolicy IfNeeded brings the pod back
    again, final = admitted(with_hamicore(stored), target(0.5))
    assert again.outcome is AdmissionOutcome.PATCHED
    assert final["spec"]["containers"][0]["command"][-1] == "0.95"
    assert not again.llm_warning  # 0.475 of a 0.5 limit asks no more than the fraction
    third, _ = admitted(final, target(0.5))
    assert third.outcome is AdmissionOutcome.UNCHANGED


def test_a_limit_written_in_the_pod_leaves_the_flag_with_a_reason() -> None:
    pod = kai_pod(KSERVE_VLLM)
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "20g"}]
    admission, stored = admitted(pod, target(0.5))
    assert stored["spec"]["containers"][0]["args"] == KSERVE_VLLM["args"]
    assert "CUDA_DEVICE_MEMORY_LIMIT=20g is set in the pod" in admission.llm_warning
    assert admission.llm is not None
    assert not admission.llm.applies
    unlimited = kai_pod(KSERVE_VLLM)
    unlimited["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "0"}]
    _, stored = admitted(unlimited, target(0.5))  # 0: HAMi-core's "no limit"
    assert stored["spec"]["containers"][0]["args"][-1] == "--gpu-memory-utilization=0.475"


@pytest.mark.parametrize("unlimited", ["0", "0m", "0g", "0k"])
def test_a_zero_limit_in_any_unit_is_no_limit(unlimited: str) -> None:
    # HAMi-core reads 0 in any unit as "no limit" (as kube/enforcement.py does): the flag is
    # a share of the whole card, not left alone with "a size whose share is unknown".
    pod = kai_pod(KSERVE_VLLM)
    pod["spec"]["containers"][0]["env"] = [{"name": MEMORY_LIMIT, "value": unlimited}]
    assert visible_share(pod, target(0.5)) == 1.0
    admission, stored = admitted(pod, target(0.5))
    assert stored["spec"]["containers"][0]["args"][-1] == "--gpu-memory-utilization=0.475"
    assert "rewritten to 0.475" in admission.llm_warning  # vLLM's default asked 0.92


def test_a_limit_in_an_init_container_kai_names_is_the_fractions() -> None:
    # The fraction container may be an init container (a native sidecar): its hamicore limit
    # is the one CUDA reports, as the actuator reads a running pod (kube/enforcement.py).
    pod = with_hamicore(kai_pod(KSERVE_VLLM))
    env = pod["spec"]["containers"][0].pop("env")
    pod["spec"]["initContainers"] = [{"name": "gpu", "restartPolicy": "Always", "env": env}]
    pod["metadata"]["annotations"][KAI_CONTAINER] = "gpu"
    assert visible_share(pod, target(0.125)) == 0.12  # KAI's hundredths
    running = PodInfo(
        namespace=NS,
        name="chat-0",
        uid="u-2",
        node="n1",
        phase="Running",
        terminating=False,
        created_at=None,
        labels={},
        annotations=pod["metadata"]["annotations"],
        controller=None,
        backend=GpuSharing.KAI,
        share=None,
        whole_gpus=0,
        resource_version="1",
        raw=pod,
    )
    # The same container for the actuator: its limit comes from that container's ConfigMap.
    assert configmaps_of(running) == ("chat-abcdefg-shared-gpu-0",)
    # A limit written by hand in that init container is a size, not the fraction's.
    env[0] = {"name": MEMORY_LIMIT, "value": "20g"}
    assert "is set in the pod" in str(visible_share(pod, target(0.5)))
    # Named nowhere: the first container, which sets no limit.
    pod["metadata"]["annotations"].pop(KAI_CONTAINER)
    assert visible_share(pod, target(0.5)) == 1.0


def test_an_unreadable_limit_leaves_the_flag_with_a_reason() -> None:
    pod = kai_pod(KSERVE_VLLM)
    pod["spec"]["containers"][0]["env"] = [{"name": MEMORY_LIMIT, "value": "lots"}]
    assert "is not a size" in str(visible_share(pod, target(0.5)))
    admission, stored = admitted(pod, target(0.5))
    assert stored["spec"]["containers"][0]["args"] == KSERVE_VLLM["args"]
    assert "is not a size" in admission.llm_warning


def test_sglang_and_tgi_under_hamicore_are_shares_of_the_limit_too() -> None:
    sglang = {
        "name": "sglang",
        "image": "docker.io/lmsysorg/sglang:latest",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", "meta-llama/Meta-Llama-3.1-8B-Instruct"],
        "resources": {},
    }
    _, stored = admitted(with_hamicore(kai_pod(sglang)), target(0.5))
    assert stored["spec"]["containers"][0]["args"][-1] == "--mem-fraction-static=0.85"
    _, stored = admitted(with_hamicore(kai_pod({**TGI_OPEA, "resources": {}})), target(0.5))
    env = stored["spec"]["containers"][0]["env"]
    assert {"name": "CUDA_MEMORY_FRACTION", "value": "0.95"} in env
