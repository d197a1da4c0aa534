"""The Kubernetes backend's judge: one decision and the cluster as it is -> a plan or a skip.

Pure: no Kubernetes client, no NATS, no asyncio; time is an argument. :func:`judge` decides,
in this order, what the executor (:mod:`fracpilot_actuator.kube.executor`) is to do:

1. no running pod: skip;
2. opt-out (``fracpilot.io/opt-out`` on a pod or the workload object): skip, unlooked at;
   then the opt-in rule (:func:`fracpilot_actuator.opt_in.automation_of`: the namespace's and
   the pods' ``fracpilot.io/mode`` labels, the policy's mode): off is a skip; recommend makes
   the rest a dry run whose detail says why ("not opted in: namespace X has no label
   fracpilot.io/mode=auto");
3. invalid shares (a bad annotation, an unknown GPU): skip with the error, and a Warning
   event on each pod at fault (not in a dry run);
4. pods that do not all hold one kind of fractional share (KAI or HAMi): skip; KAI
   multi-device fraction pods: skip (:mod:`.kai`); a KAI fraction goes onto hundredths; a
   whole GPU (1.0) on a ``gpu-fraction`` pod is a recreate (KAI's webhook accepts a
   ``gpu-fraction`` only in (0, 1), and a running pod's ``nvidia.com/gpu`` limit cannot change:
   the admission webhook makes the new pod a whole-GPU pod, :mod:`fracpilot_actuator.admission`);
   an in-place upsize past the KAI queue's quota (policy ``queue_bound=quota``) is a recreate
   (:mod:`.queues`);
5. shared isolation (:func:`plan_card`: a KAI ``gpu-fraction`` pod whose memory is not
   enforced, detected per pod unless the policy's ``isolation`` says otherwise, and a
   decision with a forecast): its card is divided among its tenants
   (:mod:`.card_division`); when the card holds them the pod's target is its share of the
   card's budget and re-divisible co-tenants get theirs, in place; when it does not, the pod
   is sized as on a card of its own, on the per-pod path below. Every plan says which
   isolation was used;
6. plan the workload with the pure planner (in place only for KAI; HAMi pods with HAMi's own
   fit rules, :func:`fracpilot_actuator.kube.hami.fit_rule`; a recreated pod only where
   kube-scheduler's predicates let it go, :meth:`.Inventory.node_ok_for`);
   an in-place downsize of a pod running an LLM server that preallocates its memory (vLLM,
   SGLang, TGI, read from the pod spec) is a recreate, its flag rewritten on the new pod,
   unless its pool already fits the new share; a recreate the guardrails deny leaves the
   downsize waiting, and the result says why (:mod:`.preallocation`); such a pod is never
   re-divided as a co-tenant;
   KAI's in-place steps then say accounted vs enforced (:mod:`.enforcement`): an upsize past
   an enforced memory limit is a recreate, a downsize needs the memory floor under the new
   share, and policy ``enforcement=recreate_within_budget`` recreates when the budget allows;
   an upsize on any path (in place, recreate, scale-up) past the KAI queue's limit is then
   only recommended, the workload keeping its pods (:mod:`.queues`); an eviction that would
   take a KAI PodGroup below its ``minMember`` is refused (:mod:`.gangs`);
7. the guardrails (:func:`fracpilot_actuator.guardrails.check`), unless the decision is
   resumed (an earlier attempt recorded its target, so it passed them);
8. nothing to change: skip (or applied, when an earlier attempt did it); a dry run: what would
   be done; a denial: skip with the guard's reason; else the plan.

A scale-up waiting for capacity is planned here too (:func:`plan_scale_up`): for each of its
pods, wait, give up, or move (in place or recreate) and whether its placeholder must go with
the eviction; :mod:`.scale_ups` only carries that out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import (
    GuardrailSettings,
    GuardState,
    Subject,
    Verdict,
    check,
    opt_out,
)
from fracpilot_actuator.kube.card_division import (
    LIVE_RULES,
    CardDivision,
    Tenant,
    divide_card,
    tenant_forecast,
)
from fracpilot_actuator.kube.enforcement import (
    NOT_ENFORCED,
    Enforcement,
    enforce,
    enforced_after,
    enforcement_of,
    must_recreate,
)
from fracpilot_actuator.kube.gangs import Member, PodGroup, gang_refusal
from fracpilot_actuator.kube.hami import fit_rule
from fracpilot_actuator.kube.inventory import Inventory, PodInfo, last_change
from fracpilot_actuator.kube.kai import (
    is_multi_device,
    kai_fraction,
    kai_memory_mib,
    multi_device_refusal,
)
from fracpilot_actuator.kube.object_values import KAI_FRACTION, is_opted_out
from fracpilot_actuator.kube.placeholders import PendingScaleUp
from fracpilot_actuator.kube.preallocation import preallocation_rule, server_of, waits
from fracpilot_actuator.kube.queues import (
    Queue,
    effective_queues,
    queue_verdict,
    usage_by_queue,
    workload_queue,
)
from fracpilot_actuator.opt_in import Automation, Selected, automation_of
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.forecasts import KnownForecast
from fracpilot_libs.contracts import (
    MIB,
    FractionDecision,
    GpuSharing,
    MemoryIsolation,
    Outcome,
    PlanKind,
    WorkloadRef,
    WorkloadTarget,
)
from fracpilot_libs.kai import KaiSettings
from fracpilot_libs.owners import Controller, OwnerKey
from fracpilot_libs.placement.card_budget import divide
from fracpilot_libs.placement.planner import (
    ClusterState,
    NodeOkFor,
    Placement,
    ResizePlan,
    WorkloadPlan,
    apply_pod_plan,
    plan_pod,
    plan_workload,
)


@dataclass(frozen=True)
class CoTenant:
    """What the backend knows of a pod sharing the deciding pod's GPU (its namespace's)."""

    workload: WorkloadRef
    known: KnownForecast | None  # its workload's last forecast; None: none (or too old)
    owner_opted_out: bool = False  # its workload object opts out (or could not be read)


@dataclass(frozen=True)
class ClusterView:
    """The cluster as one decision sees it."""

    inventory: Inventory
    pods: tuple[PodInfo, ...]  # the workload's pods, terminating ones included
    owner: Mapping[str, Any] | None = None  # the workload object, when it was read
    namespace_labels: Mapping[str, Any] = field(default_factory=dict)  # the workload's namespace
    queues: Mapping[str, Queue] | None = None  # KAI's Queues by name; None: not read
    pod_groups: Mapping[str, PodGroup] | None = None  # KAI's PodGroups by ns/name; None: not read
    enforcement: Mapping[str, Enforcement] = field(default_factory=dict)  # by pod name
    owners: Mapping[OwnerKey, Controller] = field(default_factory=dict)  # the namespace's
    co_tenants: Mapping[str, CoTenant] = field(default_factory=dict)  # by pod ns/name

    @property
    def live(self) -> tuple[PodInfo, ...]:
        return tuple(p for p in self.pods if not p.terminating)


@dataclass(frozen=True)
class Guards:
    """What the guardrails need besides the decision: their memory and their limits."""

    state: GuardState
    settings: GuardrailSettings
    patches_templates: bool = False
    """targets_via=template: every change patches the pod template (a rollout: disruptive)."""
    opt_in: OptInSettings = field(default_factory=OptInSettings)
    """The opt-in rule's settings (the default mode, the excluded namespaces)."""
    kai: KaiSettings = field(default_factory=KaiSettings)
    """KAI's set-up and how far an in-place upsize may take a KAI queue (:mod:`.queues`)."""


@dataclass(frozen=True)
class PodWarning:
    """A Warning event to leave on a pod (why its decision could not be planned)."""

    pod: PodInfo
    reason: str
    message: str


@dataclass(frozen=True)
class Skip:
    """Nothing to do in the cluster: the answer as it is."""

    actuation: Actuation
    disruptive: bool = False  # the plan that was not carried out would have disrupted
    warnings: tuple[PodWarning, ...] = ()


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


@dataclass(frozen=True)
class ActuationPlan:
    """A plan the guardrails let through: what the executor carries out."""

    decision: FractionDecision
    plan: WorkloadPlan
    gpu_backend: GpuSharing  # the kind of share the workload's pods hold
    primary: ResizePlan | None  # the step the result reports
    inventory: Inventory
    memory_mib: int  # the new share in MiB of the workload's GPUs
    disruptive: bool
    resuming: bool = False
    enforcement: Mapping[str, Enforcement] = field(default_factory=dict)  # by pod name
    redivision: tuple[Redivision, ...] = ()  # co-tenants re-divided in place (shared isolation)

    def target(self, now: datetime) -> WorkloadTarget:
        """The workload's target, recorded before any pod is touched."""
        d = self.decision
        return WorkloadTarget(
            workload=d.workload,
            fraction=d.new_fraction,
            memory_mib=self.memory_mib,
            backend=self.gpu_backend,
            decision_id=d.decision_id,
            updated_at=now,
        )

    def result(self, outcome: Outcome, detail: str, error: str | None = None) -> Actuation:
        done = actuation_of(self.inventory, self.plan.kind, self.primary, outcome, detail, error)
        if self.primary is None or (e := self.enforcement.get(self.primary.pod)) is None:
            return done
        applied = outcome is Outcome.APPLIED
        return replace(done, enforced_fraction=enforced_after(self.primary, e, applied))


Judgement = ActuationPlan | Skip


def actuation_of(
    inventory: Inventory,
    kind: PlanKind,
    step: ResizePlan | None,
    outcome: Outcome,
    detail: str,
    error: str | None = None,
) -> Actuation:
    """The answer for a plan of ``kind`` reported by its ``step``."""
    if step is None:
        return Actuation(plan=kind, outcome=outcome, detail=detail, error=error)
    applied = outcome is Outcome.APPLIED
    return Actuation(
        plan=kind,
        outcome=outcome,
        detail=detail,
        fraction_before=step.fraction_before,
        fraction_after=step.fraction_after if applied else step.fraction_before,
        node_before=inventory.gpu_node(step.gpu_before),
        node_after=inventory.gpu_node(step.gpu_after),
        gpu_before=step.gpu_before,
        gpu_after=step.gpu_after,
        error=error,
    )


def memory_share_mib(decision: FractionDecision, view: ClusterView, kai: bool = False) -> int:
    """The new share in MiB of the workload's GPUs (``kai``: the ``gpu-memory`` that KAI, which
    divides by the node's label floored to 100 MiB, counts as the fraction: :mod:`.kai`)."""
    for placement in view.inventory.placements_of(view.live):
        gpu = view.inventory.state.gpu(placement.gpu_uuid)
        if gpu is not None:
            if kai:
                return kai_memory_mib(decision.new_fraction, gpu.memory_bytes // 2**20)
            return round(decision.new_fraction * gpu.memory_bytes / 2**20)
    return decision.new_memory_mib


def is_disruptive(plan: WorkloadPlan, patches_templates: bool) -> bool:
    """Evicting pods is disruptive; so is every template patch (a rollout replaces every
    pod), counted before we know whether the template already holds the target."""
    return plan.disruptive or (patches_templates and plan.kind is not PlanKind.NONE)


def primary_step(plan: WorkloadPlan, decision: FractionDecision) -> ResizePlan | None:
    """The step reported in the result: the decision's pod, else the first."""
    return next(
        (s for s in plan.steps if s.pod == decision.pod),
        plan.steps[0] if plan.steps else None,
    )


def _skipped(detail: str, error: str | None = None, held_back: str = "") -> Skip:
    return Skip(
        Actuation(
            plan=PlanKind.NONE,
            outcome=Outcome.SKIPPED,
            detail=detail,
            error=error,
            held_back=held_back,
        )
    )


def selected_for(decision: FractionDecision, view: ClusterView, opt_in: OptInSettings) -> Selected:
    """The opt-in rule's answer for the decision's workload, from its live pods' labels."""
    live = view.live
    return automation_of(
        decision.workload.namespace,
        view.namespace_labels,
        [p.raw.get("metadata", {}).get("labels") or {} for p in live],
        decision.mode,
        opt_in,
        pods=[p.name for p in live],
    )


def subject_of(decision: FractionDecision, view: ClusterView) -> Subject:
    """What the guardrails look at: who opted out, when the workload last changed, ..."""
    wl, live = decision.workload, view.live
    opted_out_by = next((f"pod {p.key}" for p in live if is_opted_out(p.raw)), "")
    if not opted_out_by and view.owner is not None and is_opted_out(view.owner):
        opted_out_by = f"{wl.owner_kind} {wl.display}"
    return Subject(
        workload=wl.key,
        namespace=wl.namespace,
        decided_at=decision.decided_at,
        last_change=last_change(view.pods),
        replicas=len(live),
        opted_out_by=opted_out_by,
        busy=", ".join(f"pod {p.name} is terminating" for p in view.pods if p.terminating),
    )


WHOLE_GPU = (
    "a whole GPU: KAI's webhook accepts a gpu-fraction only in (0, 1) and a running pod's "
    "nvidia.com/gpu limit cannot change, so the pod is recreated and the new one asks for "
    "nvidia.com/gpu: 1"
)


def whole_gpu_by_recreate(decision: FractionDecision, live: tuple[PodInfo, ...]) -> bool:
    """A target of a whole GPU for pods holding a ``gpu-fraction``: KAI's validating webhook
    refuses ``gpu-fraction`` >= 1 on create and update (v0.12.0
    ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go``
    ``validateGpuFractionAnnotation``) and a fraction with an ``nvidia.com/gpu`` limit, so only
    a new pod with the limit and no fraction holds one (a ``gpu-memory`` pod may ask for all
    of its GPU's memory in place)."""
    return decision.new_fraction >= 1.0 and any(
        p.share is not None and p.share.kai_key == KAI_FRACTION for p in live
    )


def gang_refusal_of(plan: WorkloadPlan, view: ClusterView) -> str:
    """Why the plan's evictions must not happen: a KAI PodGroup would go below minMember."""
    evicted = [
        (plan.workload.namespace, s.pod)
        for s in plan.steps
        if s.kind in (PlanKind.RECREATE_ELSEWHERE, PlanKind.SCALE_UP)
    ]
    if not evicted:
        return ""
    members = (
        Member(p.namespace, p.name, p.annotations, bool(p.node) and not p.terminating)
        for p in view.inventory.pods.values()
    )
    return gang_refusal(evicted, members, view.pod_groups)


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
    """Shared isolation for a KAI pod (the module docstring's step 5): its card divided
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


def judge(
    decision: FractionDecision,
    view: ClusterView,
    guards: Guards,
    now: datetime,
    *,
    dry_run: str = "",
    resuming: bool = False,
) -> Judgement:
    """A plan to carry out, or a skip saying why not (see the module docstring).

    ``dry_run``: why nothing may change ("dry-run", "recommend mode"), "" when it may.
    ``resuming``: an earlier attempt at this decision recorded its target: finish it."""
    wl, live = decision.workload, view.live
    if not live:
        return _skipped(f"{wl.owner_kind} {wl.display} has no running pods")
    subject = subject_of(decision, view)
    if not (verdict := opt_out(subject)).allowed:  # an opted-out workload is not looked at
        return _skipped(f"{verdict.guard}: {verdict.reason}", held_back="off")
    selected = selected_for(decision, view, guards.opt_in)
    if selected.mode is Automation.OFF:
        return _skipped(f"off: {selected.reason}", held_back="off")
    held_back = "dry_run" if dry_run else ""
    if not dry_run and not selected.applies:  # a recommendation: planned, never carried out
        dry_run, held_back = selected.reason, selected.held_back

    problems = view.inventory.problems_of(live)
    if problems:
        text = "; ".join(map(str, problems))
        warnings = tuple(
            PodWarning(pod, "FractionInvalid", "; ".join(mine))
            for pod in live
            if not dry_run
            and (mine := [p.message for p in problems if p.subject == f"pod {pod.key}"])
        )
        skip = _skipped(f"cannot plan {wl.display}: {text}", error=text)
        return Skip(skip.actuation, warnings=warnings)
    kinds = {p.backend for p in live}
    if None in kinds or len(kinds) != 1:
        what = sorted(b.value if b else "none" for b in kinds)
        return _skipped(
            f"{wl.display}'s pods do not all hold a fractional GPU share of one kind "
            f"(KAI annotation or HAMi limits): {', '.join(what)}"
        )
    gpu_backend = next(b for b in kinds if b is not None)
    if gpu_backend is GpuSharing.KAI:
        if refusal := multi_device_refusal((p.key, p.annotations, p.labels) for p in live):
            return _skipped(refusal, held_back="multi_device")
        # On hundredths: KAI's GPU_PORTION ("%.2f") and its accounting equal the plan (kai.py).
        exact = kai_fraction(decision.new_fraction)
        decision = decision.model_copy(update={"new_fraction": exact})
    card: CardPlan | None = None
    state = view.inventory.state
    if gpu_backend is GpuSharing.KAI:
        sized, isolation = plan_card(decision, view, guards)
        if isinstance(sized, CardPlan):
            card, decision, state = sized, sized.decision, sized.state
        elif sized is not None:
            decision = sized
    else:
        isolation = "isolation enforced: HAMi holds each pod to its limits"
    whole = gpu_backend is GpuSharing.KAI and whole_gpu_by_recreate(decision, live)
    plan = plan_workload(
        state,
        wl,
        view.inventory.placements_of(live),
        decision.new_fraction,
        in_place=gpu_backend is GpuSharing.KAI and not whole,
        fit=fit_rule(gpu_backend, view.inventory.hami_memory_factor),
        node_ok_for=view.inventory.node_ok_for(gpu_backend),
    )
    if whole and plan.kind is not PlanKind.NONE:
        plan = plan.model_copy(update={"reason": f"{WHOLE_GPU}: {plan.reason}"})
    if gpu_backend is GpuSharing.HAMI and plan.kind is not PlanKind.NONE:
        plan = plan.model_copy(
            update={"reason": f"HAMi cannot change a running pod's limits: {plan.reason}"}
        )
    queues, queue = None, ""
    if gpu_backend is GpuSharing.KAI and view.queues is not None:
        usage = usage_by_queue(view.inventory.pods.values(), view.pod_groups, guards.kai)
        queues = effective_queues(view.queues, usage)
        queue = workload_queue(view.owner, live, view.pod_groups, guards.kai)
        bounded = queue_verdict(plan, queues, queue, guards.kai)
        if bounded.action == "recreate":  # KAI's quota check then admits the new pod, or not
            plan = plan_workload(
                view.inventory.state,
                wl,
                view.inventory.placements_of(live),
                decision.new_fraction,
                in_place=False,
                fit=fit_rule(gpu_backend, view.inventory.hami_memory_factor),
                node_ok_for=view.inventory.node_ok_for(gpu_backend),
            )
            plan = plan.model_copy(update={"reason": f"{bounded.reason}; {plan.reason}"})
    recreated: tuple[str, ...] = ()
    if gpu_backend is GpuSharing.KAI:  # a preallocated pool does not shrink in place
        preallocated = preallocation_rule(plan, {p.name: p for p in live}, view.enforcement)
        if isinstance(preallocated, str):
            return _skipped(preallocated)
        plan, recreated = preallocated.plan, preallocated.recreated
    if gpu_backend is GpuSharing.KAI:  # accounting moves in place, enforced limits do not
        budget = partial(
            check, subject, disruptive=True, state=guards.state, settings=guards.settings, now=now
        )
        honest = enforce(plan, decision, view.enforcement, lambda: budget().allowed)
        if isinstance(honest, str):
            return _skipped(honest)
        plan = honest
    if queues is not None:  # every path, as the plan now is: past the limit, only recommended
        bounded = queue_verdict(plan, queues, queue, guards.kai)
        if bounded.action == "recommend" and not dry_run:
            dry_run, held_back = bounded.reason, "queue_limit"
    if refusal := gang_refusal_of(plan, view):
        return _skipped(refusal, held_back="gang")
    redivision = card.redivision if card is not None and plan.kind is PlanKind.IN_PLACE else ()
    plan = plan.model_copy(update={"reason": f"{plan.reason}; {isolation}"})
    disruptive = is_disruptive(plan, guards.patches_templates)
    verdict = check(
        subject, disruptive=disruptive, state=guards.state, settings=guards.settings, now=now
    )
    if resuming:
        verdict = Verdict.allow("resumed", "an earlier attempt passed the guardrails")
    chosen = ActuationPlan(
        decision=decision,
        plan=plan,
        gpu_backend=gpu_backend,
        primary=primary_step(plan, decision),
        inventory=view.inventory,
        memory_mib=memory_share_mib(decision, view, kai=gpu_backend is GpuSharing.KAI),
        disruptive=disruptive,
        resuming=resuming,
        enforcement=view.enforcement,
        redivision=redivision,
    )

    def skipped_plan(outcome: Outcome, detail: str) -> Skip:
        result = chosen.result(outcome, detail)
        if outcome is Outcome.DRY_RUN:
            result = replace(result, held_back=held_back or "dry_run")
        return Skip(result, disruptive=disruptive)

    if plan.kind is PlanKind.NONE:
        if resuming:
            done = f"finished by an earlier attempt that stopped before reporting: {plan.reason}"
            return skipped_plan(Outcome.APPLIED, done)
        return skipped_plan(Outcome.SKIPPED, plan.reason)
    if dry_run:
        would = f"{dry_run}: would {plan.kind.value} ({gpu_backend.value}): {plan.reason}"
        if not verdict.allowed:
            would += f"; but the guardrails would skip it: {verdict.guard}: {verdict.reason}"
        return skipped_plan(Outcome.DRY_RUN, would)
    if not verdict.allowed:
        why = f"{verdict.guard}: {verdict.reason}"
        if recreated and plan.kind is PlanKind.RECREATE_ELSEWHERE:
            why = f"{waits(recreated)} ({why})"
        return skipped_plan(Outcome.SKIPPED, f"{why} (plan was {plan.kind.value}: {plan.reason})")
    return chosen


# --- a scale-up waiting for capacity ---------------------------------------------------------


@dataclass(frozen=True)
class ScaleUpMove:
    """What to do now for one pod of a scale-up waiting for capacity."""

    pod: str
    placeholder: tuple[str, str]  # (namespace, name)
    action: Literal["wait", "give_up", "gone", "move"]
    step: ResizePlan | None = None  # "move": in place, or recreate where it now fits
    node: str = ""  # where the placeholder is bound; "" while it is not
    release_first: bool = False
    """The pod fits only on its placeholder's own GPU: the placeholder goes with the eviction
    (else it stays until the replacement is bound)."""


def _without(state: ClusterState, placeholder: tuple[str, str]) -> ClusterState:
    """The cluster with a placeholder's GPU free again."""
    key = "/".join(placeholder)
    return replace_state(state, tuple(p for p in state.placements if p.pod_key != key))


def replace_state(state: ClusterState, placements: tuple[Placement, ...]) -> ClusterState:
    return ClusterState(gpus=state.gpus, placements=placements)


def plan_scale_up(
    pending: PendingScaleUp, view: ClusterView, now: datetime, timeout_s: float
) -> tuple[ScaleUpMove, ...]:
    """Each waiting pod's move, planned on the cluster as it is now (bound placeholders count
    as used GPUs, :mod:`.inventory`), in pod order, each on the cluster the earlier ones
    leave. A pod waits while it fits nowhere, and is given up on after ``timeout_s``."""
    decision, inventory = pending.decision, view.inventory
    live = {p.name: p for p in view.live}
    placements = {p.pod: p for p in inventory.placements_of(view.live)}
    bound = {(p.namespace, p.name): p.node for p in inventory.placeholders if p.node}
    timed_out = now - pending.started_at > timedelta(seconds=timeout_s)
    state, moves = inventory.state, []
    for pod_name, placeholder in sorted(pending.placeholders.items()):
        pod, placement = live.get(pod_name), placements.get(pod_name)
        if pod is None or placement is None:
            moves.append(ScaleUpMove(pod_name, placeholder, "gone"))
            continue
        enforced = view.enforcement.get(pod_name, NOT_ENFORCED)
        node_ok_for = inventory.node_ok_for(pod.backend)

        # an upsize past an enforced limit is a recreate (enforcement.py)
        in_place = pod.backend is GpuSharing.KAI and not must_recreate(enforced, decision)
        fit = fit_rule(pod.backend, inventory.hami_memory_factor)

        def plan(
            on: ClusterState,
            placement: Placement = placement,
            in_place: bool = in_place,
            fit: Any = fit,
            node_ok_for: NodeOkFor | None = node_ok_for,
        ) -> ResizePlan:
            return plan_pod(
                on,
                placement,
                decision.new_fraction,
                in_place=in_place,
                fit=fit,
                node_ok=node_ok_for(placement, on) if node_ok_for else None,
            )

        node = bound.get(placeholder, "")
        step: ResizePlan = plan(state)
        release = False
        if step.kind is PlanKind.SCALE_UP and node:  # only the placeholder's own GPU is room
            freed = _without(state, placeholder)
            if (again := plan(freed)).kind is not PlanKind.SCALE_UP:
                state, step, release = freed, again, True
        if step.kind is PlanKind.SCALE_UP:
            action: Literal["wait", "give_up"] = "give_up" if timed_out else "wait"
            moves.append(ScaleUpMove(pod_name, placeholder, action, step, node))
            continue
        state = apply_pod_plan(state, step)
        moves.append(ScaleUpMove(pod_name, placeholder, "move", step, node, release))
    return tuple(moves)
