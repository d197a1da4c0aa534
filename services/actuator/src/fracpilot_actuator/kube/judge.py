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
5. shared isolation (:func:`.card_plan.plan_card`: a KAI ``gpu-fraction`` pod whose memory is not
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

The judge's inputs are in :mod:`.cluster_view`, its answers in :mod:`.judgement`; a scale-up
waiting for capacity is planned in :mod:`.scale_up_plan`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from functools import partial

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import Subject, Verdict, check, opt_out
from fracpilot_actuator.kube.card_plan import CardPlan, plan_card
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.enforcement import enforce
from fracpilot_actuator.kube.gangs import Member, gang_refusal
from fracpilot_actuator.kube.hami import fit_rule
from fracpilot_actuator.kube.inventory import PodInfo, last_change
from fracpilot_actuator.kube.judgement import ActuationPlan, Judgement, PodWarning, Skip
from fracpilot_actuator.kube.kai import kai_fraction, kai_memory_mib, multi_device_refusal
from fracpilot_actuator.kube.object_values import KAI_FRACTION, is_opted_out
from fracpilot_actuator.kube.preallocation import preallocation_rule, waits
from fracpilot_actuator.kube.queues import (
    effective_queues,
    queue_verdict,
    usage_by_queue,
    workload_queue,
)
from fracpilot_actuator.opt_in import Automation, Selected, automation_of
from fracpilot_actuator.settings import OptInSettings
from fracpilot_libs.contracts import FractionDecision, GpuSharing, Outcome, PlanKind
from fracpilot_libs.placement.planner import ResizePlan, WorkloadPlan, plan_workload


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
