"""The Kubernetes backend's pure judge: a decision and the cluster in, a plan or a skip out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import decision
from fracpilot_actuator.guardrails import Disruption, GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge, memory_share_mib
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_libs.contracts import FractionDecision, GpuSharing, Outcome, PlanKind
from support.kube_objects import MEM_MIB, T0, hami, kai, node, pod, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
LATER = T0 + timedelta(minutes=5)  # decisions are made after the pods were created
NOW = T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings())
OPTED_IN = {"fracpilot.io/mode": "auto"}  # the workloads' namespace is opted in (auto mode)


def view(
    *pods: dict[str, Any],
    owner: dict[str, Any] | None = None,
    gpus: int = 1,
    namespace_labels: dict[str, str] = OPTED_IN,
) -> ClusterView:
    inventory = build_inventory(
        [node("n1", gpus=gpus)],
        [reservation("g1", UUID_A), *pods],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    made = decision(name="chat")
    return ClusterView(inventory, inventory.pods_of(made.workload, {}), owner, namespace_labels)


def kai_pods(*fractions: str, **kw: Any) -> list[dict[str, Any]]:
    return [kai(f"chat-{i}", f, group="g1", owner=OWNER, **kw) for i, f in enumerate(fractions)]


def grow(current: float = 0.25, new: float = 0.38, **kw: Any) -> FractionDecision:
    return decision(current, new, name="chat", **{"decided_at": LATER, **kw})


def test_no_running_pod_is_a_skip() -> None:
    result = judge(grow(), view(), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.SKIPPED
    assert result.actuation.detail == "Deployment inference/chat has no running pods"


def test_an_opted_out_pod_or_owner_skips_before_anything_is_looked_at() -> None:
    by_pod = pod(
        "chat-0",
        annotations={"gpu-fraction": "abc", "fracpilot.io/opt-out": "true"},
        labels={"runai-gpu-group": "g1"},
        owner=OWNER,
    )
    result = judge(grow(), view(by_pod), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.detail.startswith("opt_out: opted out by fracpilot.io/opt-out on pod")
    assert result.warnings == ()  # its bad annotation is not even read
    owner = {"metadata": {"annotations": {"fracpilot.io/opt-out": "true"}}}
    result = judge(grow(), view(*kai_pods("0.25"), owner=owner), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.detail.endswith("on Deployment inference/chat")


def test_an_invalid_share_is_skipped_with_a_warning_on_its_pod_except_in_a_dry_run() -> None:
    bad = view(*kai_pods("0.25", "1.5"))
    result = judge(grow(), bad, GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.error
    assert "chat-1" in result.actuation.error
    assert [(w.pod.name, w.reason) for w in result.warnings] == [("chat-1", "FractionInvalid")]
    dry = judge(grow(), bad, GUARDS, NOW, dry_run="dry-run")
    assert isinstance(dry, Skip)
    assert dry.warnings == ()
    assert dry.actuation == result.actuation


def test_pods_with_two_kinds_of_share_are_skipped() -> None:
    mixed = [
        kai("chat-0", "0.25", group="g1", owner=OWNER),
        hami("chat-1", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER),
    ]
    result = judge(grow(), view(*mixed), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert "do not all hold a fractional GPU share of one kind" in result.actuation.detail
    assert "hami, kai" in result.actuation.detail


def test_a_kai_growth_that_fits_is_an_in_place_plan_with_its_target() -> None:
    made = grow(0.25, 0.38)  # hundredths: what KAI's GPU_PORTION ("%.2f") can hold
    result = judge(made, view(*kai_pods("0.25", "0.25")), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE
    assert (result.gpu_backend, result.disruptive, result.resuming) == (
        GpuSharing.KAI,
        False,
        False,
    )
    assert result.primary is not None
    assert result.primary.pod == "chat-0"
    target = result.target(NOW)
    assert (target.fraction, target.decision_id, target.updated_at) == (0.38, "d-1", NOW)
    # gpu-memory that KAI (label floored to 100 MiB, rounded up to 0.01) counts as 0.38
    assert target.memory_mib == round(0.38 * (MEM_MIB // 100 * 100)) == result.memory_mib
    applied = result.result(Outcome.APPLIED, "done")
    assert (applied.fraction_before, applied.fraction_after, applied.node_after) == (
        0.25,
        0.38,
        "n1",
    )


def test_a_dry_run_says_what_would_be_done_and_what_the_guardrails_would_say() -> None:
    stale = grow(decided_at=T0 - timedelta(minutes=1))
    result = judge(stale, view(*kai_pods("0.25")), GUARDS, NOW, dry_run="recommend mode")
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.DRY_RUN
    assert result.actuation.detail.startswith("recommend mode: would in_place (kai): ")
    assert "; but the guardrails would skip it: stale: " in result.actuation.detail


def test_a_stale_decision_is_skipped_by_the_guardrails() -> None:
    stale = grow(decided_at=T0 - timedelta(minutes=1))
    result = judge(stale, view(*kai_pods("0.25")), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.SKIPPED
    assert result.actuation.detail.startswith("stale: ")
    assert "(plan was in_place: " in result.actuation.detail


def test_hami_recreates_and_a_single_replica_is_guarded_unless_resumed() -> None:
    pods = [hami("chat-0", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER)]
    made = grow(0.1, 0.2)
    result = judge(made, view(*pods), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.disruptive
    assert result.actuation.detail.startswith("single_replica: ")
    assert "HAMi cannot change a running pod's limits" in result.actuation.detail
    resumed = judge(made, view(*pods), GUARDS, NOW, resuming=True)
    assert isinstance(resumed, ActuationPlan)
    assert resumed.plan.kind is PlanKind.RECREATE_ELSEWHERE
    assert resumed.disruptive
    assert resumed.resuming


def test_the_rate_limit_counts_the_disruptions_it_is_given() -> None:
    pods = [hami(f"chat-{i}", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER) for i in range(2)]
    full = GuardState(recent=tuple(Disruption(f"w{i}", "other", NOW) for i in range(5)))
    result = judge(grow(0.1, 0.2), view(*pods), Guards(full, GuardrailSettings()), NOW)
    assert isinstance(result, Skip)
    assert result.actuation.detail.startswith("rate: 5 disruptive actions")
    allowed = judge(grow(0.1, 0.2), view(*pods), GUARDS, NOW)
    assert isinstance(allowed, ActuationPlan)


def test_template_patches_make_every_change_disruptive() -> None:
    guards = Guards(GuardState(), GuardrailSettings(allow_single_replica=True), True)
    result = judge(grow(), view(*kai_pods("0.25")), guards, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE
    assert result.disruptive


def test_nothing_to_change_is_a_skip_or_applied_when_an_earlier_attempt_did_it() -> None:
    same = grow(0.25, 0.38)  # the pod holds it already
    result = judge(same, view(*kai_pods("0.38")), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert (result.actuation.plan, result.actuation.outcome) == (PlanKind.NONE, Outcome.SKIPPED)
    resumed = judge(same, view(*kai_pods("0.38")), GUARDS, NOW, resuming=True)
    assert isinstance(resumed, Skip)
    assert resumed.actuation.outcome is Outcome.APPLIED
    assert resumed.actuation.detail.startswith("finished by an earlier attempt")


def test_the_memory_share_uses_the_gpu_the_pods_are_on() -> None:
    assert memory_share_mib(grow(0.25, 0.5), view(*kai_pods("0.25"))) == MEM_MIB // 2
    assert memory_share_mib(grow(0.25, 0.5), view()) == grow(0.25, 0.5).new_memory_mib


fractions = st.sampled_from(["0.125", "0.25", "0.375", "0.5", "0.75"])


@settings(max_examples=60, deadline=None)
@given(
    current=st.lists(fractions, min_size=0, max_size=3),
    new=st.sampled_from([0.125, 0.25, 0.5, 0.75, 0.9]),
    minutes=st.integers(-10, 10),
    recent=st.integers(0, 6),
    in_flight=st.booleans(),
    dry_run=st.sampled_from(["", "dry-run"]),
    resuming=st.booleans(),
)
def test_the_judge_is_pure_and_never_acts_when_it_must_not(
    current: list[str],
    new: float,
    minutes: int,
    recent: int,
    in_flight: bool,
    dry_run: str,
    resuming: bool,
) -> None:
    made = decision(0.2, new, name="chat", decided_at=T0 + timedelta(minutes=minutes))
    cluster = view(*kai_pods(*current), gpus=2)
    state = GuardState(
        recent=tuple(Disruption(f"w{i}", "inference", NOW) for i in range(recent)),
        in_flight=frozenset({made.workload.key}) if in_flight else frozenset(),
    )
    guards = Guards(state, GuardrailSettings(allow_single_replica=True))
    result = judge(made, cluster, guards, NOW, dry_run=dry_run, resuming=resuming)
    assert result == judge(made, cluster, guards, NOW, dry_run=dry_run, resuming=resuming)
    if dry_run or not current:
        assert isinstance(result, Skip)
    if isinstance(result, ActuationPlan):
        assert result.plan.kind is not PlanKind.NONE
        if not resuming:  # only a resumed decision skips the guardrails
            assert not in_flight
            assert minutes >= 0
            assert not result.disruptive or recent < 2
    else:
        assert result.actuation.outcome in (Outcome.SKIPPED, Outcome.DRY_RUN, Outcome.APPLIED)
        if result.actuation.outcome is Outcome.APPLIED:
            assert resuming
            assert result.actuation.plan is PlanKind.NONE


# --- the opt-in rule (fracpilot_actuator.opt_in) in the judge ----------------------------------


def test_a_workload_not_opted_in_is_a_recommendation_saying_why() -> None:
    result = judge(grow(), view(*kai_pods("0.25"), namespace_labels={}), GUARDS, NOW)
    assert isinstance(result, Skip)
    assert result.actuation.outcome is Outcome.DRY_RUN
    assert result.actuation.held_back == "not_opted_in"
    assert result.actuation.detail.startswith(
        "not opted in: namespace inference has no label fracpilot.io/mode=auto: "
        "would in_place (kai): "
    )
    assert result.actuation.fraction_after == 0.25  # nothing changed


def with_mode(mode: str, *pods: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods labelled fracpilot.io/mode=<mode> (as their template would label them)."""
    for p in pods:
        p["metadata"].setdefault("labels", {})["fracpilot.io/mode"] = mode
    return list(pods)


def test_a_pod_label_opts_in_where_the_namespace_does_not_and_the_policy_caps_it() -> None:
    labelled = with_mode("auto", *kai_pods("0.25", "0.25"))
    opted_in = judge(grow(), view(*labelled, namespace_labels={}), GUARDS, NOW)
    assert isinstance(opted_in, ActuationPlan)
    recommend = judge(grow(mode="recommend"), view(*labelled), GUARDS, NOW)
    assert isinstance(recommend, Skip)
    assert recommend.actuation.outcome is Outcome.DRY_RUN
    assert recommend.actuation.held_back == "policy"
    assert recommend.actuation.detail.startswith("the policy's mode is recommend")


def test_mode_off_skips_without_planning_and_one_pod_saying_recommend_holds_all_back() -> None:
    off = judge(
        grow(), view(*kai_pods("0.25"), namespace_labels={"fracpilot.io/mode": "off"}), GUARDS, NOW
    )
    assert isinstance(off, Skip)
    assert (off.actuation.outcome, off.actuation.plan) == (Outcome.SKIPPED, PlanKind.NONE)
    assert off.actuation.detail == "off: namespace inference is labelled fracpilot.io/mode=off"
    mixed = [*kai_pods("0.25"), *with_mode("recommend", kai_pods("0.25", "0.25")[1])]
    held = judge(grow(), view(*mixed), GUARDS, NOW)
    assert isinstance(held, Skip)
    assert held.actuation.outcome is Outcome.DRY_RUN
    assert "pod chat-1 is labelled fracpilot.io/mode=recommend" in held.actuation.detail
