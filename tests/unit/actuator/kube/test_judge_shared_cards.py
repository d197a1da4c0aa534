"""The judge's shared-isolation step: a KAI gpu-fraction pod whose memory is not enforced is
sized with its card (card_division), its co-tenants re-divided in place; otherwise per pod."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from factories import decision, workload
from fracpilot_actuator.guardrails import GuardrailSettings, GuardState
from fracpilot_actuator.kube.cluster_view import ClusterView, CoTenant, Guards
from fracpilot_actuator.kube.enforcement import Enforcement
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan
from fracpilot_actuator.stores.forecasts import KnownForecast
from fracpilot_libs.contracts import (
    CardForecast,
    FractionDecision,
    MemoryIsolation,
    Mode,
    PeakProfile,
    PlanKind,
)
from support.kube_objects import MEM_MIB, T0, kai, node, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
LATER = T0 + timedelta(minutes=5)
NOW = T0 + timedelta(minutes=6)
GUARDS = Guards(GuardState(), GuardrailSettings(allow_single_replica=True))
OPTED_IN = {"fracpilot.io/mode": "auto"}
CHAT = CardForecast(memory_peak=0.45, memory_jump=0.1, compute=0.2)
EMBED = CardForecast(memory_peak=0.25, memory_jump=0.2, compute=0.1)


def view(
    embed: dict[str, Any] | None = None,
    known: CardForecast | None = EMBED,
    **changes: Any,
) -> ClusterView:
    embed = embed or kai("embed-0", "0.6", group="g1", owner=("Deployment", "embed"))
    inventory = build_inventory(
        [node("n1", gpus=1)],
        [
            reservation("g1", UUID_A),
            kai("chat-0", "0.3", group="g1", owner=("Deployment", "chat")),
            embed,
        ],
        cluster="test",
        default_gpu_memory_mib=MEM_MIB,
    )
    facts = KnownForecast(known, LATER, Mode.AUTO) if known is not None else None
    co_tenants = {"inference/embed-0": CoTenant(workload("embed"), facts)}
    chat = inventory.pods_of(decision(name="chat").workload, {})
    fields: dict[str, Any] = {"namespace_labels": OPTED_IN, "co_tenants": co_tenants}
    return ClusterView(inventory, chat, **{**fields, **changes})


def grow(**kw: Any) -> FractionDecision:
    fields: dict[str, Any] = {"decided_at": LATER, "forecast": CHAT}
    return decision(0.3, 0.6, name="chat", **{**fields, **kw})


def test_two_kai_pods_on_one_gpu_are_redivided_in_place_by_one_decision() -> None:
    result = judge(grow(), view(), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE  # 0.6 would not fit beside embed's 0.6
    assert result.primary is not None
    # needs 0.45 + 0.25, one pooled headroom 0.5 x 0.2 = 0.1 shared by the jumps (1:2)
    assert (result.primary.fraction_before, result.primary.fraction_after) == (0.3, 0.48)
    assert result.target(NOW).fraction == 0.48
    [co] = result.redivision
    assert (co.pod.name, co.step.fraction_before, co.step.fraction_after) == ("embed-0", 0.6, 0.31)
    assert co.shrinks
    assert co.step.workload == workload("embed")
    assert "decision d-1" in co.step.reason
    assert "isolation shared (detected: memory not enforced" in result.plan.reason
    assert "inference/embed-0 0.6 -> 0.31" in result.plan.reason
    assert 0.48 + 0.31 <= 1.0


def test_a_co_tenant_without_a_forecast_keeps_its_share_and_the_card_may_not_hold_them() -> None:
    result = judge(grow(), view(known=None), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    # 0.45 + 0.05 headroom beside a fixed 0.6: not on this card; sized as on a card of its own
    assert "the card does not hold its tenants" in result.plan.reason
    assert result.plan.kind is PlanKind.SCALE_UP  # one GPU only
    assert result.decision.new_fraction == 0.5
    small = grow(forecast=CardForecast(memory_peak=0.2, memory_jump=0.05, compute=0.1))
    fits = judge(small, view(known=None), GUARDS, NOW)
    assert isinstance(fits, ActuationPlan)
    assert fits.plan.kind is PlanKind.IN_PLACE
    assert fits.primary is not None
    assert fits.primary.fraction_after == 0.25  # its need + the floor; embed keeps 0.6
    assert "inference/embed-0 keeps 0.6 (no forecast)" in fits.plan.reason


def test_a_co_tenant_that_opts_out_or_is_not_automated_keeps_its_share() -> None:
    opted = kai("embed-0", "0.6", group="g1", owner=("Deployment", "embed"))
    opted["metadata"]["annotations"]["fracpilot.io/opt-out"] = "true"
    small = grow(forecast=CardForecast(memory_peak=0.2, memory_jump=0.05, compute=0.1))
    result = judge(small, view(opted), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    assert "embed-0 keeps 0.6 (opted out)" in result.plan.reason
    recommend = view()
    facts = CoTenant(workload("embed"), KnownForecast(EMBED, LATER, Mode.RECOMMEND))
    recommend = ClusterView(
        recommend.inventory,
        recommend.pods,
        namespace_labels=OPTED_IN,
        co_tenants={"inference/embed-0": facts},
    )
    result = judge(small, recommend, GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    assert "embed-0 keeps 0.6 (not automated" in result.plan.reason


def test_an_enforced_pod_or_an_enforced_policy_is_sized_per_pod() -> None:
    limited = Enforcement(memory_mib=MEM_MIB * 3 // 10, fraction=0.3, how="test limit")
    result = judge(grow(), view(enforcement={"chat-0": limited}), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    assert result.decision.new_fraction == 0.6
    assert "isolation enforced: enforced 0.3 (test limit)" in result.plan.reason
    by_policy = judge(grow(isolation=MemoryIsolation.ENFORCED), view(), GUARDS, NOW)
    assert isinstance(by_policy, ActuationPlan)
    assert by_policy.redivision == ()
    assert "isolation enforced (the policy's;" in by_policy.plan.reason
    assert by_policy.plan.kind is PlanKind.SCALE_UP  # 0.6 beside 0.6, per pod
    unknown = judge(grow(forecast=None), view(), GUARDS, NOW)
    assert isinstance(unknown, ActuationPlan)
    assert "the decision carries no forecast: sized per pod" in unknown.plan.reason


def test_a_co_tenant_in_flight_keeps_its_share() -> None:
    busy = Guards(GuardState().begin(workload("embed").key), GuardrailSettings())
    small = grow(forecast=CardForecast(memory_peak=0.2, memory_jump=0.05, compute=0.1))
    result = judge(small, view(), busy, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.redivision == ()
    assert "another action on its workload is in flight" in result.plan.reason


def test_with_peak_profiles_the_card_reserves_the_joint_peak_only() -> None:
    # chat peaks by day, embed by night: together they never held more than 0.5 in one hour
    hour = int(LATER.timestamp() // 3600)
    day = PeakProfile(
        period_s=3600.0, first=hour - 24, last=hour, peaks=((hour - 20, 0.1), (hour - 8, 0.45))
    )
    night = PeakProfile(
        period_s=3600.0, first=hour - 24, last=hour, peaks=((hour - 20, 0.25), (hour - 8, 0.05))
    )
    chat = CHAT.model_copy(update={"profile": day})
    embed = EMBED.model_copy(update={"profile": night})
    result = judge(grow(forecast=chat), view(known=embed), GUARDS, NOW)
    assert isinstance(result, ActuationPlan)
    assert result.plan.kind is PlanKind.IN_PLACE
    # joint peak 0.5 (not 0.45 + 0.25) + one pooled headroom 0.1: 0.6, shared by need (45:25)
    assert result.primary is not None
    assert result.primary.fraction_after == 0.38
    [co] = result.redivision
    assert (co.step.fraction_before, co.step.fraction_after) == (0.6, 0.21)
    assert "peaks pooled over 2 peak profiles: joint peak 0.5 where summed 0.7" in (
        result.plan.reason
    )
