"""No in-place memory downsize for an LLM server that preallocates (issue 28): the judge makes
it a recreate within the guardrails, keeps it in place only when the pool already fits, and
refuses it when the flag cannot be rewritten (kube/preallocation.py)."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from factories import decision, workload
from fracpilot_actuator.guardrails import Disruption, GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, CoTenant, Guards
from fracpilot_actuator.kube.enforcement import enforcement_map
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_actuator.kube.preallocation import pool_fits, server_of
from fracpilot_actuator.stores.forecasts import KnownForecast
from fracpilot_libs.contracts import CardForecast, FractionDecision, Mode, Outcome, PlanKind
from support.kube_objects import MEM_MIB, T0, kai, node, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
LATER = T0 + timedelta(minutes=5)
NOW = T0 + timedelta(minutes=6)
OPTED_IN = {"fracpilot.io/mode": "auto"}
SINGLE = Guards(GuardState(), GuardrailSettings(allow_single_replica=True))

# The vLLM production stack's container (vllm-project/production-stack a6c01db0
# helm/templates/deployment-vllm-multi.yaml, as rendered in tests/unit/libs/llm_servers/
# test_pod_specs.py), its flag at what the webhook writes for 0.5 (0.5 less vLLM's 5% margin).
VLLM = {
    "name": "vllm",
    "image": "vllm/vllm-openai:latest",
    "command": ["vllm", "serve", "facebook/opt-125m", "--port", "8000"],
    "args": ["--gpu_memory_utilization", "0.475"],
}
# SGLang's docker/k8s-sglang-service.yaml (sgl-project/sglang 0b082f52): no memory flag.
SGLANG = {
    "name": "sglang",
    "image": "docker.io/lmsysorg/sglang:latest",
    "command": ["python3", "-m", "sglang.launch_server"],
    "args": ["--model-path", "meta-llama/Meta-Llama-3.1-8B-Instruct", "--port", "30000"],
}
TGI = {
    "name": "tgi",
    "image": "ghcr.io/huggingface/text-generation-inference:3.0",
    "env": [{"name": "CUDA_MEMORY_FRACTION", "value": "0.5"}],
}


def llm_pod(name: str, fraction: str, container: dict[str, Any], **kw: Any) -> dict[str, Any]:
    raw = kai(name, fraction, group="g1", owner=kw.pop("owner", OWNER), **kw)
    raw["spec"]["containers"] = [copy.deepcopy(container)]
    return raw


def vllm(utilization: str | None = "0.475") -> dict[str, Any]:
    container = copy.deepcopy(VLLM)
    container["args"] = ["--gpu_memory_utilization", utilization] if utilization else []
    return container


def view(*pods: dict[str, Any]) -> ClusterView:
    inventory = build_inventory(
        [node("n1", gpus=1)],
        [reservation("g1", UUID_A), *pods],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    return ClusterView(inventory, inventory.pods_of(workload("chat"), {}), None, OPTED_IN)


def down(**kw: Any) -> FractionDecision:
    return decision(0.5, 0.25, name="chat", **{"decided_at": LATER, **kw})


def test_a_vllm_downsize_is_a_recreate_with_the_flag_rewritten_never_in_place() -> None:
    result = judge(down(), view(llm_pod("chat-0", "0.5", vllm())), SINGLE, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert result.disruptive
    assert result.primary is not None
    assert (result.primary.fraction_before, result.primary.fraction_after) == (0.5, 0.25)
    assert result.primary.gpu_after == UUID_A  # it fits where it is: only the pool must go
    reason = result.plan.reason
    assert "vllm --gpu-memory-utilization 0.475 in container 'vllm'" in reason
    assert "its pool does not shrink in place" in reason
    assert "--gpu-memory-utilization=0.237" in reason  # 0.25 less the 5% margin, rounded down
    done = result.result(Outcome.APPLIED, "done")
    assert (done.plan, done.fraction_after) == (PlanKind.RECREATE_ELSEWHERE, 0.25)


def test_vllms_default_and_sglang_sizing_itself_and_tgis_env_are_recreated_too() -> None:
    for container, said in (
        (vllm(None), "vllm --gpu-memory-utilization unset (default 0.92)"),
        (SGLANG, "sglang --mem-fraction-static unset (it sizes itself from the card)"),
        (TGI, "tgi --cuda-memory-fraction 0.5"),
    ):
        result = judge(down(), view(llm_pod("chat-0", "0.5", container)), SINGLE, NOW)
        assert isinstance(result, ActuationPlan), said
        assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE, said
        assert said in result.plan.reason


def test_the_guardrails_hold_the_recreate_back_and_the_result_says_the_downsize_waits() -> None:
    lone = judge(
        down(),
        view(llm_pod("chat-0", "0.5", vllm())),
        Guards(GuardState(), GuardrailSettings()),
        NOW,
    )
    assert isinstance(lone, Skip)
    assert lone.actuation.outcome is Outcome.SKIPPED
    assert lone.actuation.plan is PlanKind.RECREATE_ELSEWHERE
    detail = lone.actuation.detail
    assert detail.startswith("the downsize waits: chat-0 run(s) an LLM server")
    assert "single_replica: the workload has a single replica" in detail
    assert lone.actuation.fraction_after == 0.5  # nothing changed, not even the accounting

    busy = GuardState(recent=tuple(Disruption(f"w{i}", "other", NOW) for i in range(5)))
    budget = judge(
        down(), view(llm_pod("chat-0", "0.5", vllm())), Guards(busy, SINGLE.settings), NOW
    )
    assert isinstance(budget, Skip)
    assert budget.actuation.detail.startswith("the downsize waits")
    assert "rate: 5 disruptive actions in the last 600 s" in budget.actuation.detail


def test_a_dry_run_says_it_would_recreate() -> None:
    result = judge(down(), view(llm_pod("chat-0", "0.5", vllm())), SINGLE, NOW, dry_run="dry-run")
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.DRY_RUN
    assert "would recreate_elsewhere (kai)" in result.actuation.detail


@pytest.mark.parametrize(("utilization", "fits"), [("0.2", True), ("0.237", True), ("0.24", False)])
def test_in_place_only_when_the_pool_already_fits_the_new_share(
    utilization: str, fits: bool
) -> None:
    result = judge(down(), view(llm_pod("chat-0", "0.5", vllm(utilization))), SINGLE, NOW)
    assert isinstance(result, ActuationPlan)
    if fits:
        assert result.plan.kind is PlanKind.IN_PLACE
        assert "its preallocated pool already fits" in result.plan.reason
        assert not result.disruptive
    else:
        assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE


def test_a_pool_that_fits_still_needs_the_memory_floor_under_the_new_share() -> None:
    pods = view(llm_pod("chat-0", "0.5", vllm("0.2")))
    result = judge(down(memory_need_mib=24576), pods, SINGLE, NOW)  # 0.3 of 80 GiB
    assert isinstance(result, Skip)
    assert "memory need 0.3 (peak + headroom) is above it" in result.actuation.detail


def test_a_flag_that_cannot_be_rewritten_is_neither_downsized_in_place_nor_recreated() -> None:
    script = {
        "name": "vllm",
        "image": "vllm/vllm-openai:latest",
        "command": ["/bin/sh", "-c"],
        "args": ["vllm serve facebook/opt-125m --gpu-memory-utilization 0.9"],
    }
    for container, problem in (
        (script, "the server is started by a shell script"),
        ({**vllm(), "args": ["--config", "/etc/vllm.yaml"]}, "a --config file may set"),
    ):
        result = judge(down(), view(llm_pod("chat-0", "0.5", container)), SINGLE, NOW)
        assert isinstance(result, Skip), problem
        assert result.actuation.plan is PlanKind.NONE
        detail = result.actuation.detail
        assert detail.startswith("not downsized to 0.25: vllm in container 'vllm' preallocates")
        assert problem in detail


def test_upsizes_and_pods_without_a_server_are_planned_as_before() -> None:
    up = judge(
        decision(0.5, 0.75, name="chat", decided_at=LATER),
        view(llm_pod("chat-0", "0.5", vllm())),
        SINGLE,
        NOW,
    )
    assert isinstance(up, ActuationPlan)
    assert up.plan.kind is PlanKind.IN_PLACE
    plain = judge(down(), view(kai("chat-0", "0.5", group="g1", owner=OWNER)), SINGLE, NOW)
    assert isinstance(plain, ActuationPlan)
    assert plain.plan.kind is PlanKind.IN_PLACE


def test_the_server_is_read_from_the_pod_spec() -> None:
    [pod] = view(llm_pod("chat-0", "0.5", vllm("0.2"))).live
    reading = server_of(pod)
    assert (reading.server, reading.value) == ("vllm", 0.2)
    assert pool_fits(reading, 0.25)
    assert not pool_fits(reading, 0.2)  # 0.2 less the margin is 0.19
    [plain] = view(kai("chat-0", "0.5", group="g1", owner=OWNER)).live
    assert server_of(plain).server is None


def test_a_preallocating_co_tenant_is_never_redivided_in_place() -> None:
    embed = llm_pod("embed-0", "0.6", vllm("0.57"), owner=("Deployment", "embed"))
    inventory = build_inventory(
        [node("n1", gpus=1)],
        [reservation("g1", UUID_A), kai("chat-0", "0.3", group="g1", owner=OWNER), embed],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    known = KnownForecast(
        CardForecast(memory_peak=0.25, memory_jump=0.2, compute=0.1), LATER, Mode.AUTO
    )
    shared = ClusterView(
        inventory,
        inventory.pods_of(workload("chat"), {}),
        namespace_labels=OPTED_IN,
        co_tenants={"inference/embed-0": CoTenant(workload("embed"), known)},
    )
    small = CardForecast(memory_peak=0.2, memory_jump=0.05, compute=0.1)
    result = judge(
        decision(0.3, 0.6, name="chat", decided_at=LATER, forecast=small), shared, SINGLE, NOW
    )
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    assert "embed-0 keeps 0.6 (runs vllm, whose preallocated memory pool does not shrink" in (
        result.plan.reason
    )


# --- under KAI's hamicore plugin: HAMi-core reports the container's limit as CUDA's total ------

PREFIX = "chat-abcdefg-shared-gpu"  # KAI's runai/shared-gpu-configmap


def hamicore(raw: dict[str, Any]) -> dict[str, Any]:
    """The pod as KAI's hamicore webhook leaves it: CUDA_DEVICE_MEMORY_LIMIT from the pod's
    GPU-sharing ConfigMap (kube/enforcement.py has the source)."""
    raw["metadata"]["annotations"]["runai/shared-gpu-configmap"] = PREFIX
    ref = {"name": f"{PREFIX}-0", "key": "CUDA_DEVICE_MEMORY_LIMIT", "optional": True}
    container = raw["spec"]["containers"][0]
    container["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": {"configMapKeyRef": ref}}]
    return raw


def enforced_view(raw: dict[str, Any], limit_mib: int | None) -> ClusterView:
    plain = view(raw)
    data = None if limit_mib is None else {"CUDA_DEVICE_MEMORY_LIMIT": f"{limit_mib}m"}
    limits = enforcement_map(plain.live, plain.inventory, {f"{PREFIX}-0": data}, MEM_MIB)
    return replace(plain, enforcement=limits)


def test_an_enforced_vllm_is_a_share_of_its_limit_and_keeps_that_share_when_recreated() -> None:
    # started at 0.5 under hamicore: the webhook wrote 0.95 of the 0.5 limit (0.475 of the card)
    pod = hamicore(llm_pod("chat-0", "0.5", vllm("0.95")))
    result = judge(down(), enforced_view(pod, MEM_MIB // 2), SINGLE, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.RECREATE_ELSEWHERE
    # 0.95 of the new 0.25 limit: the flag stays, the limit CUDA reports shrinks
    assert "--gpu-memory-utilization=0.95" in result.plan.reason
    # read as a share of the card (the old rule) 0.95 would have been rewritten to 0.237
    assert "0.237" not in result.plan.reason


def test_an_enforced_vllm_whose_pool_fits_the_new_share_stays_in_place() -> None:
    # 0.45 of a 0.5 limit is 0.225 of the card: under 0.25 less the margin (0.2375)
    pod = hamicore(llm_pod("chat-0", "0.5", vllm("0.45")))
    result = judge(down(), enforced_view(pod, MEM_MIB // 2), SINGLE, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE
    assert "its preallocated pool already fits" in result.plan.reason
    # as a share of the whole card 0.45 would not fit 0.25
    assert not pool_fits(server_of(result_pod(pod)), 0.25)
    assert pool_fits(server_of(result_pod(pod)), 0.25, visible_share=0.5)


def result_pod(raw: dict[str, Any]) -> Any:
    [pod] = view(raw).live
    return pod


def test_an_unreadable_or_hand_written_limit_refuses_the_downsize_with_a_reason() -> None:
    unread = hamicore(llm_pod("chat-0", "0.5", vllm("0.95")))
    result = judge(down(), enforced_view(unread, None), SINGLE, NOW)
    assert isinstance(result, Skip)
    detail = result.actuation.detail
    assert detail.startswith("not downsized to 0.25: vllm in container 'vllm' preallocates")
    assert "memory limit, which CUDA reports as the total, is unknown" in detail
    by_hand = llm_pod("chat-0", "0.5", vllm("0.95"))
    by_hand["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "40960m"}
    ]
    result = judge(down(), enforced_view(by_hand, None), SINGLE, NOW)
    assert isinstance(result, Skip)
    assert "is written in the pod" in result.actuation.detail
