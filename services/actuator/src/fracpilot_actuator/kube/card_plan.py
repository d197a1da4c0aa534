"""Shared isolation in the judge (step 5 of :mod:`.judge`): a KAI ``gpu-fraction`` pod whose
memory is not enforced (detected per pod unless the policy's ``isolation`` says otherwise) and
whose decision carries a forecast is sized with its card. :func:`plan_card` divides the card
among its tenants (:mod:`.card_division`): when the card holds them the pod's target is its
share of the card's budget and the re-divisible co-tenants get theirs, in place
(:class:`Redivision`); when it does not, the pod is sized as on a card of its own. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from fracpilot_actuator.kube.card_division import (
    LIVE_RULES,
    CardDivision,
    Tenant,
    divide_card,
    tenant_forecast,
)
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, Enforcement, enforcement_of
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.kai import is_multi_device, kai_fraction
from fracpilot_actuator.kube.object_values import KAI_FRACTION, is_opted_out
from fracpilot_actuator.kube.preallocation import server_of
from fracpilot_actuator.opt_in import automation_of
from fracpilot_libs.contracts import MIB, FractionDecision, GpuSharing, MemoryIsolation, PlanKind
from fracpilot_libs.placement.card_budget import divide
from fracpilot_libs.placement.planner import ClusterState, ResizePlan


@dataclass(frozen=True)
class Redivision:
    """A co-tenant's fraction re-divided in place (shared isolation: :func:`plan_card`)."""

    pod: PodInfo
    step: ResizePlan  # in place, for the co-tenant's workload

    @property
    def shrinks(self) -> bool:
        return self.step.fraction_after < (self.step.fraction_before or 0.0)


@dataclass(frozen=True)
class CardPlan:
    """The deciding pod's card divided (:func:`plan_card`)."""

    decision: FractionDecision  # its target the card's share, its memory need its peak
    state: ClusterState  # the cluster with the co-tenants re-divided
    redivision: tuple[Redivision, ...]
    division: CardDivision


def isolation_of(decision: FractionDecision, enforcement: Enforcement) -> tuple[bool, str]:
    """Whether the pod's memory is shared (sized with its card) and, for the result, why: the
    policy's ``isolation``, else what the pod shows (:mod:`.enforcement`). A pod whose memory
    is held to a limit (or whose limit is unknown) is sized on its own whatever the policy."""
    chosen = decision.isolation
    if enforcement.enforced or enforcement.unknown:
        said = " (the policy says shared)" if chosen is MemoryIsolation.SHARED else ""
        return False, f"isolation enforced{said}: {enforcement.describe()}"
    if chosen is MemoryIsolation.ENFORCED:
        return False, f"isolation enforced (the policy's; {enforcement.describe()})"
    how = "the policy's" if chosen is MemoryIsolation.SHARED else "detected"
    return True, f"isolation shared ({how}: {enforcement.describe()})"


def _kept(
    decision: FractionDecision, pod: PodInfo | None, view: ClusterView, guards: Guards
) -> str:
    """Why a co-tenant's fraction may not be re-divided ("": it may)."""
    if pod is None:
        return "not a workload's pod"
    if pod.namespace != decision.workload.namespace:
        return "in another namespace"
    if pod.terminating or not pod.node:
        return "not running"
    share = pod.share
    if pod.backend is not GpuSharing.KAI or share is None or share.kai_key != KAI_FRACTION:
        return "not a KAI gpu-fraction pod"
    if is_multi_device(pod.annotations, pod.labels):
        return "a multi-device fraction"
    if (server := server_of(pod).server) is not None:
        return f"runs {server}, whose preallocated memory pool does not shrink in place"
    facts = view.co_tenants.get(pod.key)
    if facts is None:
        return "its workload is not known"
    if is_opted_out(pod.raw) or facts.owner_opted_out:
        return "opted out"
    if facts.known is None:
        return "no forecast"
    selected = automation_of(
        pod.namespace,
        view.namespace_labels,
        [pod.labels],
        facts.known.mode,
        guards.opt_in,
        pods=[pod.name],
    )
    if not selected.applies:
        return f"not automated: {selected.reason}"
    gpu = view.inventory.state.gpu(share.gpu_uuid)
    memory = gpu.memory_bytes // MIB if gpu is not None else 0
    e = enforcement_of(pod, {}, memory)  # a ConfigMap-held limit reads as unknown here
    if e.enforced or e.unknown:
        return e.describe()
    if facts.workload.key in guards.state.in_flight:
        return "another action on its workload is in flight"
    return ""


def plan_card(
    decision: FractionDecision, view: ClusterView, guards: Guards
) -> tuple[CardPlan | FractionDecision | None, str]:
    """Shared isolation for a KAI pod (:mod:`.judge`'s step 5): its card divided
    (:class:`CardPlan`), or the decision with the fraction it would hold on a card of its own
    (the card does not hold its tenants), or None (sized per pod as before); and the note
    saying which isolation was used and how the card was divided."""
    live = view.live
    if len(live) != 1 or live[0].share is None:
        return None, "isolation per pod (a workload of several pods is sized per pod)"
    pod, share = live[0], live[0].share
    shared, note = isolation_of(decision, view.enforcement.get(pod.name, NOT_ENFORCED))
    if not shared:
        return None, note
    if share.kai_key != KAI_FRACTION:
        return None, f"{note}; a gpu-memory pod is sized per pod"
    forecast = decision.forecast
    if forecast is None:
        return None, f"{note}; the decision carries no forecast: sized per pod"
    tenants = []
    for placement in view.inventory.state.placements:
        if placement.gpu_uuid != share.gpu_uuid or placement.pod_key == pod.key:
            continue
        other = view.inventory.pods.get(placement.pod_key)
        kept = _kept(decision, other, view, guards)
        facts = view.co_tenants.get(placement.pod_key)
        known = facts.known.forecast if facts is not None and facts.known is not None else None
        tenants.append(Tenant(placement.pod_key, placement.fraction, known, kept))
    division = divide_card(pod.key, forecast, tenants)
    peak_mib = int(forecast.memory_peak * decision.device_memory_bytes / MIB)
    if isinstance(division, str):
        alone = min(1.0, divide({pod.key: tenant_forecast(forecast)}, LIVE_RULES)[pod.key])
        return (
            decision.model_copy(
                update={"new_fraction": kai_fraction(alone), "memory_need_mib": peak_mib}
            ),
            f"{note}; {division}: sized as on a card of its own ({alone:g}: its predicted "
            "need + the pooled headroom), per pod",
        )
    if division.target >= 1.0:
        return None, f"{note}; its card share is the whole card: sized per pod"
    new = {s.pod: s.after for s in division.shares}
    state = ClusterState(
        gpus=view.inventory.state.gpus,
        placements=tuple(
            p.model_copy(update={"fraction": new[p.pod_key]}) if p.pod_key in new else p
            for p in view.inventory.state.placements
        ),
    )
    wl = decision.workload
    redivision = []
    for s in division.shares:
        other = view.inventory.pods[s.pod]
        facts = view.co_tenants[s.pod]
        step = ResizePlan(
            kind=PlanKind.IN_PLACE,
            workload=facts.workload,
            fraction_before=s.before,
            fraction_after=s.after,
            gpu_before=share.gpu_uuid,
            gpu_after=share.gpu_uuid,
            reason=f"GPU {share.gpu_uuid} re-divided among its tenants for {wl.display}'s "
            f"decision {decision.decision_id} (shared isolation: one pooled headroom per card): "
            f"{division.text}",
            pod=other.name,
        )
        redivision.append(Redivision(other, step))
    card_decision = decision.model_copy(
        update={"new_fraction": kai_fraction(division.target), "memory_need_mib": peak_mib}
    )
    return (
        CardPlan(card_decision, state, tuple(redivision), division),
        f"{note}; {division.text}",
    )
