"""Reading and rewriting LLM servers' memory flags on pod specs taken from upstream examples.

Each container below reproduces its file's command, args and env as rendered (Helm values
filled in where the template reads them):

- vLLM production stack, ``vllm-project/production-stack`` a6c01db0
  ``helm/templates/deployment-vllm-multi.yaml`` (``vllmConfig.gpuMemoryUtilization: 0.8`` as in
  ``helm/tests/deployment-vllm-multi_test.yaml``): ``--gpu_memory_utilization`` then the value;
- KServe, ``kserve/kserve`` aaac4e29 ``config/runtimes/kserve-vllmserver.yaml`` (``--port=8080``
  forms, no memory flag) and ``config/runtimes/kserve-huggingfaceserver.yaml``;
- SGLang, ``sgl-project/sglang`` ``docker/k8s-sglang-service.yaml`` (0b082f52) and
  ``docker/k8s-sglang-distributed-sts.yaml`` (0e6ed14d, a ``bash -c`` script);
- TGI ships no Kubernetes example; ``opea-project/GenAIInfra``
  ``helm-charts/common/tgi/templates/deployment.yaml`` (109cbece) runs the image's entrypoint
  with ``envFrom`` a ConfigMap and no command or args.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fracpilot_libs.llm_servers import (
    LlmServer,
    Source,
    flag_value,
    kai_hamicore_share,
    read_pod,
    rewrite_pod,
)

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
        "--no-enable-prefix-caching",
        "--max-model-len",
        "4096",
        "--dtype",
        "bfloat16",
        "--gpu_memory_utilization",
        "0.8",
    ],
    "env": [
        {"name": "PYTHONHASHSEED", "value": "123"},
        {"name": "HF_HOME", "value": "/tmp"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/tmp"},
    ],
}
KSERVE_VLLM = {
    "name": "kserve-container",
    "image": "vllm/vllm-openai:v0.9.2",  # kustomization.yaml: vllmserver -> vllm/vllm-openai
    "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
    "args": ["--port=8080", "--served-model-name=chat", "--model=/mnt/models"],
    "env": [
        {"name": "LMCACHE_USE_EXPERIMENTAL", "value": "True"},
        {"name": "HF_HOME", "value": "/tmp"},
        {"name": "VLLM_CONFIG_ROOT", "value": "/tmp"},
        {"name": "VLLM_WORKER_MULTIPROC_METHOD", "value": "spawn"},
    ],
}
KSERVE_HUGGINGFACE = {
    "name": "kserve-container",
    "image": "kserve/huggingfaceserver:v0.15.2",
    "args": ["--model_name=chat"],
    "env": [{"name": "LMCACHE_USE_EXPERIMENTAL", "value": "True"}],
}
SGLANG_SERVICE = {
    "name": "meta-llama-31-8b-instruct-sglang",
    "image": "docker.io/lmsysorg/sglang:latest",
    "command": ["python3", "-m", "sglang.launch_server"],
    "args": [
        "--model-path",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
    ],
    "env": [{"name": "HF_TOKEN", "value": "<secret>"}],
}
SGLANG_DISTRIBUTED = {
    "name": "sglang-container",
    "image": "docker.io/lmsysorg/sglang:latest",
    "command": ["/bin/bash", "-c"],
    "args": [
        "python3 -m sglang.launch_server \\\n--model /llm-folder \\\n"
        "--dist-init-addr sglang-master-pod:5000 \\\n--tensor-parallel-size 16 \\\n"
        "--nnodes 2 \\\n--node-rank $POD_INDEX \\\n--trust-remote-code \\\n"
        "--host 0.0.0.0 \\\n--port 8000 \\\n--enable-metrics \\\n--expert-parallel-size 16\n"
    ],
}
TGI_OPEA = {
    "name": "tgi",
    "image": "ghcr.io/huggingface/text-generation-inference:2.4.0-intel-cpu",
    "envFrom": [{"configMapRef": {"name": "tgi-config"}}],
}


def pod(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [copy.deepcopy(c) for c in containers]}


def with_args(container: dict[str, Any], *extra: str) -> dict[str, Any]:
    out = copy.deepcopy(container)
    out["args"] = [*out.get("args", []), *extra]
    return out


# --- reading ----------------------------------------------------------------------------------


def test_production_stack_reads_the_underscore_spelling_as_a_separate_value() -> None:
    reading = read_pod(pod(PRODUCTION_STACK))
    assert reading.server is LlmServer.VLLM
    assert reading.readable
    assert reading.value == 0.8
    assert reading.source is Source.COMMAND
    assert reading.form == "--flag v"
    assert reading.where == ("command", 13)
    assert reading.asked_share() == pytest.approx(0.8)


def test_kserve_vllm_without_the_flag_asks_for_vllms_default() -> None:
    reading = read_pod(pod(KSERVE_VLLM))
    assert reading.server is LlmServer.VLLM
    assert reading.source is Source.DEFAULT
    assert reading.asked_share() == pytest.approx(0.92)
    assert reading.asks_more_than(0.5)


def test_kserve_huggingfaceserver_runs_vllm_unless_its_backend_is_huggingface() -> None:
    assert read_pod(pod(KSERVE_HUGGINGFACE)).server is LlmServer.VLLM
    plain = with_args(KSERVE_HUGGINGFACE, "--backend=huggingface")
    assert read_pod(pod(plain)).server is None


def test_sglang_service_without_the_flag_sizes_itself() -> None:
    reading = read_pod(pod(SGLANG_SERVICE))
    assert reading.server is LlmServer.SGLANG
    assert reading.source is Source.DEFAULT
    assert reading.asked_share() is None
    assert reading.asks_more_than(0.5)  # it sizes from the whole card


def test_tgi_with_env_from_a_config_map_reads_the_default() -> None:
    reading = read_pod(pod(TGI_OPEA))
    assert reading.server is LlmServer.TGI
    assert reading.source is Source.DEFAULT
    assert reading.asked_share() == 1.0


def test_every_form_is_read() -> None:
    cases: list[tuple[dict[str, Any], float, str]] = [
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=0.7"), 0.7, "--flag=v"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization", "0.6"), 0.6, "--flag v"),
        (with_args(KSERVE_VLLM, "--gpu_memory_utilization=0.55"), 0.55, "--flag=v"),
        (with_args(SGLANG_SERVICE, "--mem-fraction-static", "0.4"), 0.4, "--flag v"),
        (with_args(SGLANG_SERVICE, "--mem-fraction-static=0.45"), 0.45, "--flag=v"),
        (with_args(TGI_OPEA, "--cuda-memory-fraction", "0.3"), 0.3, "--flag v"),
        (with_args(TGI_OPEA, "--cuda-memory-fraction=0.35"), 0.35, "--flag=v"),
        ({**TGI_OPEA, "env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.25"}]}, 0.25, "env"),
    ]
    for container, value, form in cases:
        reading = read_pod(pod(container))
        assert reading.readable, (container, reading.problem)
        assert (reading.value, reading.form) == (value, form), container


@pytest.mark.parametrize(
    ("container", "reason"),
    [
        (SGLANG_DISTRIBUTED, "shell script"),
        (with_args(KSERVE_VLLM, "--gpu-memory", "0.5"), "abbreviation"),
        (with_args(SGLANG_SERVICE, "--mem-frac=0.5"), "abbreviation"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=0.9"), ""),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=1.5"), "out of range"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=0"), "out of range"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=nan"), "out of range"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=high"), "not a number"),
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization"), "has no value"),
        (
            with_args(KSERVE_VLLM, "--gpu-memory-utilization=0.5", "--gpu_memory_utilization=0.6"),
            "given 2 times",
        ),
        (with_args(KSERVE_VLLM, "--kv-cache-memory-bytes=8000000000"), "kv-cache-memory-bytes"),
        (with_args(KSERVE_VLLM, "--config", "/etc/vllm.yaml"), "--config"),
        (
            {
                **with_args(TGI_OPEA, "--cuda-memory-fraction=0.5"),
                "env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.6"}],
            },
            "disagree",
        ),
        (
            {
                **TGI_OPEA,
                "env": [
                    {
                        "name": "CUDA_MEMORY_FRACTION",
                        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                    }
                ],
            },
            "valueFrom",
        ),
        ({**TGI_OPEA, "env": [{"name": "CUDA_MEMORY_FRACTION", "value": "2"}]}, "out of range"),
    ],
)
def test_unknown_forms_bad_values_and_conflicts_are_left_untouched(
    container: dict[str, Any], reason: str
) -> None:
    spec = pod(container)
    reading = read_pod(spec)
    assert reading.server is not None
    assert reason in reading.problem
    if reason:
        rewrite = rewrite_pod(spec, 0.5)
        assert not rewrite.applies
        assert not rewrite.changes
        assert reason in rewrite.problem


def test_two_servers_in_one_pod_are_left_untouched() -> None:
    rewrite = rewrite_pod(pod(KSERVE_VLLM, SGLANG_SERVICE), 0.5)
    assert not rewrite.applies
    assert "several preallocating servers" in rewrite.problem


def test_a_pod_without_a_server_is_not_one() -> None:
    spec = pod({"name": "app", "image": "nginx:1.27", "args": ["--gpu-memory-utilization=0.5"]})
    assert read_pod(spec).server is None
    assert not rewrite_pod(spec, 0.5).applies


# --- rewriting --------------------------------------------------------------------------------


def apply(spec: dict[str, Any], changes: dict[str, list[Any]], index: int = 0) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    out["containers"][index].update(copy.deepcopy(changes))
    return out


def test_each_servers_value_follows_its_definition() -> None:
    assert flag_value(LlmServer.VLLM, 0.5) == 0.475  # 0.5 of the card, 5 % margin
    assert flag_value(LlmServer.TGI, 0.5) == 0.475
    assert flag_value(LlmServer.SGLANG, 0.5) == 0.425  # weights + KV: a 15 % margin
    # Under HAMi's memory limit CUDA reports the limit as the total: a share of the limit.
    assert flag_value(LlmServer.VLLM, 0.5, visible_share=0.5) == 0.95
    assert flag_value(LlmServer.VLLM, 1 / 3) == 0.316  # rounded down, never over


@pytest.mark.parametrize(
    ("container", "section", "index", "expected"),
    [
        (PRODUCTION_STACK, "command", 13, "0.475"),  # "--gpu_memory_utilization", "0.8"
        (with_args(KSERVE_VLLM, "--gpu-memory-utilization=0.9"), "args", 3, None),
        (with_args(SGLANG_SERVICE, "--mem-fraction-static", "0.8"), "args", 7, "0.425"),
        (with_args(TGI_OPEA, "--cuda-memory-fraction=1.0"), "args", 0, None),
    ],
)
def test_a_flag_is_rewritten_where_it_is_in_its_form(
    container: dict[str, Any], section: str, index: int, expected: str | None
) -> None:
    spec = pod(container)
    rewrite = rewrite_pod(spec, 0.5)
    assert rewrite.applies
    assert set(rewrite.changes) == {section}
    words = rewrite.changes[section]
    before = container[section]
    assert len(words) == len(before)
    assert [w for i, w in enumerate(words) if i != index] == [
        w for i, w in enumerate(before) if i != index
    ]
    if expected is not None:
        assert words[index] == expected
    else:  # the --flag=v form keeps its spelling
        name = before[index].partition("=")[0]
        assert words[index] == f"{name}={rewrite.value}"
    again = read_pod(apply(spec, dict(rewrite.changes)))
    assert again.value == float(rewrite.value)
    assert again.form == rewrite.reading.form
    assert not again.asks_more_than(0.5)


def test_a_missing_flag_is_added_to_the_args_or_the_command() -> None:
    kserve = rewrite_pod(pod(KSERVE_VLLM), 0.25)
    assert kserve.changes == {"args": [*KSERVE_VLLM["args"], "--gpu-memory-utilization=0.237"]}
    no_args = {k: v for k, v in SGLANG_SERVICE.items() if k != "args"}
    sglang = rewrite_pod(pod(no_args), 0.5)
    assert sglang.changes == {"command": [*no_args["command"], "--mem-fraction-static=0.425"]}
    huggingface = rewrite_pod(pod(KSERVE_HUGGINGFACE), 0.5)
    assert huggingface.changes["args"][-1] == "--gpu-memory-utilization=0.475"


def test_tgi_without_a_command_line_gets_the_env_variable_which_beats_env_from() -> None:
    rewrite = rewrite_pod(pod(TGI_OPEA), 0.5)
    assert rewrite.changes == {"env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.475"}]}
    with_env = {**TGI_OPEA, "env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.9"}]}
    rewrite = rewrite_pod(pod(with_env), 0.5)
    assert rewrite.changes == {"env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.475"}]}


def test_vllm_image_entrypoint_without_args_is_left_untouched() -> None:
    rewrite = rewrite_pod(pod({"name": "v", "image": "vllm/vllm-openai:v0.9.2"}), 0.5)
    assert not rewrite.applies
    assert "no command line" in rewrite.problem


def test_a_flag_already_at_the_value_changes_nothing() -> None:
    spec = pod(with_args(KSERVE_VLLM, "--gpu-memory-utilization=0.475"))
    rewrite = rewrite_pod(spec, 0.5)
    assert rewrite.applies
    assert not rewrite.changes
    assert rewrite.value == "0.475"


def test_out_of_range_fractions_rewrite_nothing() -> None:
    for fraction in (0.0, -0.1, 1.5):
        rewrite = rewrite_pod(pod(KSERVE_VLLM), fraction)
        assert not rewrite.applies
        assert "out of range" in rewrite.problem
    tiny = rewrite_pod(pod(KSERVE_VLLM), 0.0005)
    assert not tiny.applies
    assert "nothing after the margin" in tiny.problem


def test_a_hamicore_limit_below_the_fraction_holds_the_server_to_the_limit() -> None:
    # KAI binds 0.125 as the portion "0.12" (%.2f): CUDA's total is 0.12 of the card
    assert kai_hamicore_share(0.125) == 0.12
    assert kai_hamicore_share(0.375) == 0.38
    assert kai_hamicore_share(0.001) == 0.01
    assert flag_value(LlmServer.VLLM, 0.125, visible_share=0.12) == 0.95  # 0.114 of the card
    assert flag_value(LlmServer.VLLM, 0.375, visible_share=0.38) == 0.937  # 0.356 of it
    assert flag_value(LlmServer.VLLM, 0.5, visible_share=1.0) == 0.475  # KAI alone: the card
    assert flag_value(LlmServer.SGLANG, 0.5, visible_share=0.5) == 0.85
