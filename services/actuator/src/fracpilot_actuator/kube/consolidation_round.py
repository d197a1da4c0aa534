"""One consolidation round: from the cluster as the backend reads it, what to do now. Pure.

The planner (:func:`fracpilot_libs.placement.consolidation.consolidation_plan`) says which pods
to move so that whole nodes come free; this module puts the actuator's rules around it and
answers, for one round (:func:`consolidation_round`):

- ``would``: the plan as if every pod that is not ``off`` were opted in (what recommend mode
  shows: "would free N GPUs / M nodes", and the gauges);
- in ``auto`` mode only: the node to empty (one at a time), the mark to put on it, its next
  step, or the mark to take off and why.

The rules:

- **Opt-in** (:func:`fracpilot_actuator.opt_in.automation_of`, the pod's and its namespace's
  ``fracpilot.io/mode``): a pod moves only when its answer is auto; a pod that is off (opted
  out, excluded) is never counted as movable, not even in ``would``.
- **What the live part moves**: KAI fraction pods (one GPU) that a controller recreates; a bare
  pod, a HAMi pod, a multi-device fraction, a terminating pod or a fracpilot placeholder stays.
- **Nodes first, then cards**: a round acts on a node candidate of the plan; only when the plan
  frees no node does it empty a single card (a GPU on a node that keeps other pods), one card
  at a time, re-planned alone (every other pod pinned) so that its steps are the cluster's as
  it is, not as the node moves before it in the plan would leave it.
- **A card being emptied carries no mark**: a taint is per node and would keep pods off the
  node's other cards. KAI keeps new fraction pods off it by itself: its binpack sends a
  fraction pod to the fullest shared GPU that holds it (``gpupack``'s score is the GPU's used
  portion, ``pkg/scheduler/plugins/gpupack/gpupack.go``; ``Session.sortGPUs`` orders fitting
  GPUs by it, ``pkg/scheduler/framework/session.go``; KAI-Scheduler v0.12.0), and the planner
  empties the emptiest card first; a GPU whose every tenant is releasing (the card's last
  tenant evicted) takes no new shared pod at all (``IsTaskFitOnGpuGroup`` /
  ``isAllGpuReleased``, ``pkg/scheduler/api/node_info/gpu_sharing_node_info.go``). A card of
  several tenants looks fuller to KAI while an evicted one is releasing (its share is still
  counted used), so a replacement can go back onto it: the verdict compares the replacement's
  GPU with the prediction, and a card move that did not land there gives the card up. A new
  pod that lands on the card anyway is in the next round's plan: moved too, or the card given
  up.
- **The mark**: the node being emptied gets the NoSchedule taint :data:`MARK_TAINT` (so neither
  KAI nor kube-scheduler puts the replacement back on it: the planner's prediction assumes it)
  and the annotation :data:`MARK_REASON`; while a node is marked the next round plans that node
  only, and when its plan is refused (a PDB, an opt-out, no room any more) or the node is empty
  the mark comes off.
- **Limits** (:class:`~fracpilot_actuator.settings.ConsolidationSettings`): at most
  ``max_moves_per_hour`` moves in any hour (a node is started only when all its moves fit in
  what is left; a marked node waits for the next move), no node is started in the quiet hours
  (a marked one is given up then), and the guardrails' disruption budget (the backend checks
  it for each move, as for a decision).
- **Shared isolation** (:func:`shared_card_budget`): a tenant whose workload's last decision
  carried a card forecast (the policy auto, its isolation not ``enforced``), opted in to auto,
  and whose memory nothing enforces (KAI without HAMi-core) has a budgeted share of its card;
  the planner may shrink it in place to that share to make room for a move (a ``shrink``
  step, done live as an annotation patch). A card none of whose tenants is such keeps the
  plain fit rule: each tenant keeps its fraction.
- **Autoscaler and gang rules**: the planner's (``scale-down-disabled``, ``do-not-disrupt``,
  ``safe-to-evict``, PDBs' ``disruptionsAllowed``, KAI PodGroups' ``minMember``).

:func:`move_verdict` then says whether a moved pod's replacement is bound (make before break:
the next move waits for it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from fracpilot_actuator.kube.card_division import LIVE_RULES, STEP, fixed_need, tenant_forecast
from fracpilot_actuator.kube.enforcement import enforcement_of
from fracpilot_actuator.kube.gangs import PodGroup, group_of
from fracpilot_actuator.kube.inventory import Inventory, PodInfo
from fracpilot_actuator.kube.kai import is_multi_device
from fracpilot_actuator.kube.object_values import KAI_FRACTION, is_opted_out
from fracpilot_actuator.opt_in import Automation, automation_of
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_libs.contracts import CardForecast, GpuSharing, Mode
from fracpilot_libs.placement.card_budget import TenantForecast, divide, fits
from fracpilot_libs.placement.consolidation import consolidation_plan
from fracpilot_libs.placement.consolidation_limits import CardBudget, DisruptionBudget, Gang
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    ConsolidationStep,
    StepKind,
)
from fracpilot_libs.placement.planner import Placement
from fracpilot_libs.placement.scheduling_facts import LabelSelector, Requirement

MARK_TAINT = "fracpilot.io/consolidating"
"""The NoSchedule taint on a node being emptied (value ``"true"``)."""
MARK_REASON = "fracpilot.io/consolidating-reason"
"""The annotation saying why the node is being emptied."""
SAME_SHARE = 0.005  # KAI keeps hundredths (verification.py)
UNLIMITED = 1_000_000  # the planner's move limit when the round applies its own


@dataclass(frozen=True)
class ConsolidationView:
    """The cluster as a round reads it."""

    inventory: Inventory
    nodes: Mapping[str, Mapping[str, Any]]  # raw Node objects by name
    budgets: tuple[DisruptionBudget, ...] = ()
    pod_groups: Mapping[str, PodGroup] | None = None
    namespace_labels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Round:
    """What one round does (see the module docstring)."""

    would: ConsolidationPlan
    node: str = ""  # the node being emptied ("" none); for a card, the card's node
    card: str = ""  # the card being emptied (its GPU uuid; "" a whole node, or nothing)
    mark: str = ""  # the reason to put on ``node`` (a node newly chosen); "" when marked already
    # (for a card newly chosen: why it is emptied, said in an Event; a card carries no taint)
    unmark: str = ""  # why the mark on ``marked`` comes off ("" it stays)
    done: bool = False  # the mark comes off because the node (card) is empty
    step: ConsolidationStep | None = None  # the next step on ``node`` (None: nothing now)
    held_back: str = ""  # why nothing moves this round

    @property
    def would_free_gpus(self) -> int:
        return self.would.cards_freed

    @property
    def would_free_nodes(self) -> int:
        return len(self.would.freed_nodes)


# --- reading the cluster --------------------------------------------------------------------


def _selector(raw: Mapping[str, Any] | None) -> LabelSelector | None:
    """A PDB's ``spec.selector`` (None: it selects no pod, as policy/v1 says of a null one)."""
    if raw is None:
        return None
    return LabelSelector(
        match_labels=tuple(
            sorted((str(k), str(v)) for k, v in (raw.get("matchLabels") or {}).items())
        ),
        expressions=tuple(
            Requirement(
                key=str(r.get("key", "")),
                operator=str(r.get("operator", "")),
                values=tuple(str(v) for v in r.get("values") or ()),
            )
            for r in raw.get("matchExpressions") or ()
        ),
    )


def disruption_budgets(
    pdbs: Iterable[Mapping[str, Any]], pods: Iterable[PodInfo]
) -> tuple[DisruptionBudget, ...]:
    """PodDisruptionBudgets as the planner takes them: ``status.disruptionsAllowed`` (0 when
    the disruption controller has not written it: nothing may go) and the pods selected in the
    budget's namespace (an empty selector selects them all)."""
    pods = list(pods)
    found = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        selector = _selector((pdb.get("spec") or {}).get("selector"))
        allowed = (pdb.get("status") or {}).get("disruptionsAllowed")
        selected = frozenset(
            p.key
            for p in pods
            if p.namespace == namespace and selector is not None and selector.matches(p.labels)
        )
        found.append(
            DisruptionBudget(
                name=f"{namespace}/{meta.get('name', '')}",
                allowed=int(allowed) if isinstance(allowed, int) else 0,
                pods=selected,
            )
        )
    return tuple(found)


def gangs_of(pods: Iterable[PodInfo], groups: Mapping[str, PodGroup] | None) -> tuple[Gang, ...]:
    """KAI PodGroups with their running members (the gang rule of :mod:`.gangs`)."""
    if groups is None:
        return ()
    members: dict[str, list[PodInfo]] = {}
    for pod in pods:
        group = group_of(pod.namespace, pod.annotations, groups)
        if group is not None and pod.node and not pod.terminating:
            members.setdefault(group.key, []).append(pod)
    return tuple(
        Gang(
            name=key,
            min_member=groups[key].min_member,
            running=len(found),
            pods=frozenset(p.key for p in found),
        )
        for key, found in sorted(members.items())
    )


def marked_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes carrying our mark (a previous round's, or a previous leader's)."""
    return sorted(
        name
        for name, raw in nodes.items()
        if any(t.get("key") == MARK_TAINT for t in (raw.get("spec") or {}).get("taints") or ())
    )


def _stays(pod: PodInfo) -> str | None:
    """Why the live part never moves this pod (None: it may)."""
    if pod.terminating:
        return "it is terminating"
    if pod.controller is None:
        return "no controller would recreate it"
    share = pod.share
    if pod.backend is not GpuSharing.KAI or share is None or share.kai_key != KAI_FRACTION:
        return "consolidation moves KAI gpu-fraction pods only"
    if is_multi_device(pod.annotations, pod.labels):
        return "a multi-device fraction"
    return None


def pins(view: ConsolidationView, opt_in: OptInSettings) -> tuple[dict[str, str], dict[str, str]]:
    """Pods that stay whatever the mode (off, or never moved live) and, besides those, the
    pods that stay in auto mode because they are not opted in."""
    always: dict[str, str] = {}
    unless_opted_in: dict[str, str] = {}
    placed = {p.pod_key for p in view.inventory.state.placements}
    for key in placed:
        pod = view.inventory.pods.get(key)
        if pod is None:
            always[key] = "a fracpilot placeholder"
            continue
        if (why := _stays(pod)) is not None:
            always[key] = why
            continue
        if is_opted_out(pod.raw):
            always[key] = "opted out (fracpilot.io/opt-out)"
            continue
        selected = automation_of(
            pod.namespace,
            view.namespace_labels.get(pod.namespace, {}),
            [pod.labels],
            Mode.AUTO,
            opt_in,
            pods=[pod.name],
        )
        if selected.mode is Automation.OFF:
            always[key] = f"off: {selected.reason}"
        elif not selected.applies:
            unless_opted_in[key] = selected.reason
    return always, unless_opted_in


def shrinkable(
    view: ConsolidationView,
    forecasts: Mapping[str, CardForecast],
    always: Mapping[str, str],
    unless_opted_in: Mapping[str, str],
) -> dict[str, TenantForecast]:
    """The pods that may shrink in place, with their forecasts: a forecast given (the caller
    keeps only an auto policy's, isolation not ``enforced``), a pod that may move (not
    pinned by :func:`pins`) and whose memory nothing enforces (a limit it refers to and that
    is not read here counts as enforced)."""
    out: dict[str, TenantForecast] = {}
    for key, forecast in forecasts.items():
        pod = view.inventory.pods.get(key)
        if pod is None or key in always or key in unless_opted_in:
            continue
        enforced = enforcement_of(pod, {}, 0)
        if enforced.enforced or enforced.unknown:
            continue
        out[key] = tenant_forecast(forecast)
    return out


def shared_card_budget(tenants: Mapping[str, TenantForecast]) -> CardBudget:
    """The planner's card budget from the shrinkable ``tenants`` (:func:`shrinkable`): on a
    card that holds one, the card planner's division with the peaks summed (each keeps at
    least its predicted need: :data:`~.card_division.LIVE_RULES`), every other tenant a fixed
    need that keeps its fraction; a card without one is not budgeted (each keeps its own)."""

    def budget(gpu_uuid: str, held: Mapping[str, float]) -> Mapping[str, float] | None:
        del gpu_uuid  # every card is one whole GPU
        if not any(k in tenants for k in held):
            return dict(held)
        known = {k: tenants.get(k) or fixed_need(f) for k, f in held.items()}
        if not fits(known.values(), LIVE_RULES):
            return None
        shares = divide(known, LIVE_RULES)
        return {k: max(STEP, shares[k]) if k in tenants else f for k, f in held.items()}

    return budget


# --- the round -------------------------------------------------------------------------------


def _plan(
    view: ConsolidationView,
    pinned: Mapping[str, str],
    max_moves: int = UNLIMITED,
    card_budget: CardBudget | None = None,
) -> ConsolidationPlan:
    inventory = view.inventory
    return consolidation_plan(
        inventory.state,
        max_moves=max_moves,
        facts=inventory.facts,
        node_annotations={
            n: (raw.get("metadata") or {}).get("annotations") or {} for n, raw in view.nodes.items()
        },
        pod_annotations={k: p.annotations for k, p in inventory.pods.items()},
        disruption_budgets=view.budgets,
        gangs=gangs_of(inventory.pods.values(), view.pod_groups),
        spread=False,  # KAI places fraction pods: no topology spread
        pinned=pinned,
        card_budget=card_budget,
    )


def _node_steps(plan: ConsolidationPlan, node: str) -> list[ConsolidationStep]:
    return [s for s in plan.steps if s.frees is Candidate.NODE and s.frees_name == node]


def _card_steps(plan: ConsolidationPlan, card: str, node: str) -> list[ConsolidationStep]:
    """The steps that empty the card: as a card, or as its node when the card's tenants are
    all the node holds that moves (every other pod is pinned when a card is planned alone)."""
    return [
        s
        for s in plan.steps
        if (s.frees is Candidate.GPU and s.frees_name == card)
        or (s.frees is Candidate.NODE and s.frees_name == node)
    ]


def _card_refusal(plan: ConsolidationPlan, card: str) -> str:
    return next(
        (r.reason for r in plan.refused if r.candidate is Candidate.GPU and r.name == card),
        "its pods can no longer all go to other cards",
    )


def _alone(view: ConsolidationView, card: str) -> dict[str, str]:
    """Every pod not on the card, pinned: the card is planned alone."""
    return {
        p.pod_key: f"not on {card}, the card being emptied"
        for p in view.inventory.state.placements
        if p.gpu_uuid != card
    }


def _refusal(plan: ConsolidationPlan, node: str) -> str:
    return next(
        (r.reason for r in plan.refused if r.candidate is Candidate.NODE and r.name == node),
        "its pods can no longer all go elsewhere",
    )


def moves_in_last_hour(moves: Sequence[datetime], now: datetime) -> int:
    return sum(1 for at in moves if now - at < timedelta(hours=1))


def consolidation_round(
    view: ConsolidationView,
    settings: ConsolidationSettings,
    opt_in: OptInSettings,
    *,
    marked: str,
    recent_moves: Sequence[datetime],
    now: datetime,
    card: str = "",
    card_node: str = "",
    forecasts: Mapping[str, CardForecast] | None = None,
) -> Round:
    """This round's answer (the module docstring); ``marked``: the node carrying our mark ("":
    none); ``card``: the card being emptied ("": none; ignored while a node is marked) and
    ``card_node`` its node; ``recent_moves``: when the moves of the last hour started;
    ``forecasts``: the card forecasts of pods under shared isolation, by ``namespace/name``
    (:func:`shrinkable`)."""
    always, unless_opted_in = pins(view, opt_in)
    tenants = shrinkable(view, forecasts or {}, always, unless_opted_in)
    budget = shared_card_budget(tenants) if tenants else None
    would = _plan(view, always, card_budget=budget)
    card = "" if marked else card
    if settings.mode != "auto":
        unmark = f"consolidation is {settings.mode}" if marked or card else ""
        node = marked or card_node
        return Round(would, node=node, card=card, unmark=unmark, held_back=f"{settings.mode} mode")
    pinned = {**always, **unless_opted_in}
    left = max(0, settings.max_moves_per_hour - moves_in_last_hour(recent_moves, now))
    quiet = settings.quiet_at(now.hour)
    if card:
        return _card_round(
            view, settings, would, pinned, card, card_node, left=left, quiet=quiet, budget=budget
        )
    if marked:
        on_node = [
            p for p in view.inventory.state.placements if _node_of(view, p.gpu_uuid) == marked
        ]
        if not on_node:
            return Round(
                would, node=marked, unmark=f"node {marked} holds no GPU pod any more", done=True
            )
        going = sorted(
            p.pod_key
            for p in on_node
            if (pod := view.inventory.pods.get(p.pod_key)) is not None and pod.terminating
        )
        if going:  # an evicted pod still terminating: wait for it before judging the node
            return Round(would, node=marked, held_back=f"{', '.join(going)} terminating")
        if quiet:
            return Round(would, node=marked, unmark="quiet hours began", held_back="quiet hours")
        # only the marked node is a candidate: every other pod stays where it is
        others = {
            p.pod_key: f"not on node {marked}, the node being emptied"
            for p in view.inventory.state.placements
            if _node_of(view, p.gpu_uuid) != marked
        }
        plan = _plan(view, {**others, **pinned}, card_budget=budget)
        steps = _node_steps(plan, marked)
        if marked not in plan.freed_nodes or not steps:
            return Round(would, node=marked, unmark=_refusal(plan, marked))
        if steps[0].kind is StepKind.MOVE and left == 0:
            return Round(
                would,
                node=marked,
                held_back=f"rate limit: {settings.max_moves_per_hour} move(s) in the last hour",
            )
        return Round(would, node=marked, step=steps[0])
    if quiet:
        return Round(would, held_back="quiet hours")
    plan = _plan(view, pinned, card_budget=budget)
    for node in dict.fromkeys(s.frees_name for s in plan.steps if s.frees is Candidate.NODE):
        steps = _node_steps(plan, node)
        moves = sum(1 for s in steps if s.kind is StepKind.MOVE)
        if moves > left:
            continue
        gpus = sum(1 for g in view.inventory.state.gpus if g.node == node)
        targets = sorted({s.to_node for s in steps if s.kind is StepKind.MOVE})
        reason = (
            f"fracpilot empties node {node} so that the autoscaler can remove it ({gpus} GPU(s)): "
            f"{moves} pod(s) move, one at a time, to {', '.join(targets)}"
        )
        return Round(would, node=node, mark=reason, step=steps[0])
    if plan.freed_nodes:  # nodes first: no card starts while a node waits for the rate limit
        return Round(
            would,
            held_back=f"rate limit: {left} of {settings.max_moves_per_hour} move(s) left this "
            "hour, fewer than any node needs",
        )
    for uuid in dict.fromkeys(s.frees_name for s in plan.steps if s.frees is Candidate.GPU):
        node = _node_of(view, uuid)
        alone = _plan(view, {**_alone(view, uuid), **pinned}, card_budget=budget)
        steps = _card_steps(alone, uuid, node)
        moves = sum(1 for s in steps if s.kind is StepKind.MOVE)
        if uuid not in alone.emptied_gpus or not steps or moves > left:
            continue
        targets = sorted({f"{s.to_gpu} on {s.to_node}" for s in steps if s.kind is StepKind.MOVE})
        reason = (
            f"fracpilot empties GPU {uuid} on node {node} so that a whole GPU is free: "
            f"{moves} pod(s) move, one at a time, to {', '.join(targets)}"
        )
        return Round(would, node=node, card=uuid, mark=reason, step=steps[0])
    why = "; ".join(f"{r.name}: {r.reason}" for r in plan.refused if r.candidate is Candidate.NODE)
    if plan.emptied_gpus:
        return Round(
            would,
            held_back=f"rate limit: {left} of {settings.max_moves_per_hour} move(s) left this "
            "hour, fewer than any card needs",
        )
    return Round(would, held_back=f"no node or card can be emptied ({why or 'no GPU pods'})")


def _card_round(
    view: ConsolidationView,
    settings: ConsolidationSettings,
    would: ConsolidationPlan,
    pinned: Mapping[str, str],
    card: str,
    card_node: str,
    *,
    left: int,
    quiet: bool,
    budget: CardBudget | None,
) -> Round:
    """The next step on the card being emptied, or why it is given up (or done). A KAI card
    is known by its GPU group's reservation pod, which KAI deletes when the card's last
    tenant goes: an id no pod holds any more is a card emptied, on a node still there."""
    node = _node_of(view, card) or card_node
    if node not in view.nodes:
        return Round(would, node=node, card=card, unmark=f"node {node} is not in the cluster")
    on_card = [p for p in view.inventory.state.placements if p.gpu_uuid == card]
    if not on_card:
        return Round(
            would, node=node, card=card, unmark=f"GPU {card} holds no pod any more", done=True
        )
    going = sorted(
        p.pod_key
        for p in on_card
        if (pod := view.inventory.pods.get(p.pod_key)) is not None and pod.terminating
    )
    if going:
        return Round(would, node=node, card=card, held_back=f"{', '.join(going)} terminating")
    if quiet:
        return Round(
            would, node=node, card=card, unmark="quiet hours began", held_back="quiet hours"
        )
    plan = _plan(view, {**_alone(view, card), **pinned}, card_budget=budget)
    steps = _card_steps(plan, card, node)
    if card not in plan.emptied_gpus or not steps:
        return Round(would, node=node, card=card, unmark=_card_refusal(plan, card))
    if steps[0].kind is StepKind.MOVE and left == 0:
        return Round(
            would,
            node=node,
            card=card,
            held_back=f"rate limit: {settings.max_moves_per_hour} move(s) in the last hour",
        )
    return Round(would, node=node, card=card, step=steps[0])


def _node_of(view: ConsolidationView, gpu_uuid: str) -> str:
    return view.inventory.gpu_node(gpu_uuid)


# --- a move in flight --------------------------------------------------------------------------


@dataclass(frozen=True)
class MoveInFlight:
    """A pod evicted to empty ``step.from_node``, waiting for its replacement to be bound."""

    step: ConsolidationStep
    namespace: str
    controller: tuple[str, str]  # the pod's controller: the replacement has the same
    known_uids: frozenset[str]  # that controller's pods when the pod was evicted
    started_at: datetime


@dataclass(frozen=True)
class MoveVerdict:
    state: Literal["waiting", "verified", "timed_out"]
    reason: str
    pod: str = ""  # the replacement's name
    node: str = ""  # where the replacement is bound
    gpu: str = ""
    fraction: float | None = None
    as_predicted: bool = False  # bound on the node and the card the planner predicted


def move_verdict(
    move: MoveInFlight, inventory: Inventory, now: datetime, timeout_s: float
) -> MoveVerdict:
    """Whether the moved pod's replacement is bound, where and at which share (read from the
    new pod, never the plan), or too late."""
    new = sorted(
        (
            p
            for p in inventory.pods.values()
            if p.namespace == move.namespace
            and p.controller == move.controller
            and p.uid not in move.known_uids
            and not p.terminating
        ),
        key=lambda p: p.name,
    )
    bound = [p for p in new if p.node]
    step = move.step
    if bound:
        pod = bound[0]
        share = pod.share
        fraction = share.fraction if share is not None else None
        gpu = share.gpu_uuid if share is not None else ""
        # the card is what KAI chose on the node (its gpu-group's reservation pod): read from
        # the new pod, compared with the planner's prediction
        as_predicted = pod.node == step.to_node and gpu == step.to_gpu
        if as_predicted:
            predicted = "as predicted"
        elif pod.node != step.to_node:
            predicted = f"not {step.to_node} as predicted"
        else:
            predicted = f"GPU {gpu or 'unknown'}, not {step.to_gpu} as predicted"
        held = "no share it can read" if fraction is None else f"{fraction:g}"
        if fraction is not None and abs(fraction - step.fraction) > SAME_SHARE:
            held += f" (not {step.fraction:g})"
        return MoveVerdict(
            "verified",
            f"replacement {pod.name} bound on {pod.node}, GPU {gpu or 'unknown'} ({predicted}) "
            f"holding {held}",
            pod=pod.name,
            node=pod.node,
            gpu=gpu,
            fraction=fraction,
            as_predicted=as_predicted,
        )
    if now - move.started_at > timedelta(seconds=timeout_s):
        return MoveVerdict(
            "timed_out",
            f"no replacement of {step.pod_key} bound within {timeout_s:g} s ({len(new)} created)",
        )
    return MoveVerdict("waiting", f"{len(new)} replacement(s) created, none bound yet")


# --- what is in flight, saved for the next leader ------------------------------------------


@dataclass(frozen=True)
class Progress:
    """The node (or card) being emptied and the move in flight: what a new leader needs to go
    on where the last one stopped, rather than re-plan and lose the move in flight and the
    rate limit's count."""

    node: str  # the node being emptied, or the card's node
    card: str = ""  # the card being emptied ("": the whole node)
    move: MoveInFlight | None = None
    workload: str = ""  # the moving pod's workload key (in flight for the guardrails)
    moves: tuple[datetime, ...] = ()  # when the moves of the last hour started


def _step_record(step: ConsolidationStep) -> dict[str, Any]:
    return {
        "kind": step.kind.value,
        "placement": step.placement.model_dump(mode="json"),
        "fraction": step.fraction,
        "from_node": step.from_node,
        "to_gpu": step.to_gpu,
        "to_node": step.to_node,
        "frees": step.frees.value,
        "frees_name": step.frees_name,
        "reason": step.reason,
    }


def _step_of(record: Mapping[str, Any]) -> ConsolidationStep:
    return ConsolidationStep(
        kind=StepKind(record["kind"]),
        placement=Placement.model_validate(record["placement"]),
        fraction=float(record["fraction"]),
        from_node=str(record["from_node"]),
        to_gpu=str(record["to_gpu"]),
        to_node=str(record["to_node"]),
        frees=Candidate(record["frees"]),
        frees_name=str(record["frees_name"]),
        reason=str(record["reason"]),
    )


def progress_json(progress: Progress) -> str:
    move = progress.move
    return json.dumps(
        {
            "node": progress.node,
            "card": progress.card,
            "workload": progress.workload,
            "moves": [t.isoformat() for t in progress.moves],
            "move": None
            if move is None
            else {
                "step": _step_record(move.step),
                "namespace": move.namespace,
                "controller": list(move.controller),
                "known_uids": sorted(move.known_uids),
                "started_at": move.started_at.isoformat(),
            },
        },
        sort_keys=True,
    )


def progress_of(text: str) -> Progress:
    """The saved progress; ValueError when it cannot be read."""
    try:
        record = json.loads(text)
        move = record.get("move")
        return Progress(
            node=str(record["node"]),
            card=str(record.get("card", "")),
            workload=str(record.get("workload", "")),
            moves=tuple(datetime.fromisoformat(t) for t in record.get("moves") or ()),
            move=None
            if move is None
            else MoveInFlight(
                step=_step_of(move["step"]),
                namespace=str(move["namespace"]),
                controller=(str(move["controller"][0]), str(move["controller"][1])),
                known_uids=frozenset(str(u) for u in move["known_uids"]),
                started_at=datetime.fromisoformat(move["started_at"]),
            ),
        )
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"consolidation progress unreadable: {exc}") from exc


def resume_refusal(progress: Progress, view: ConsolidationView) -> str | None:
    """Why a new leader does not go on with the saved progress (None: it does; the round then
    checks the plan itself, as every round does): a node that no longer carries our mark
    (taken off by someone, or by the last leader just before it stopped), or a card whose node
    is not in the cluster any more."""
    if progress.card:  # an emptied KAI card leaves the inventory (_card_round): its node stays
        if progress.node not in view.nodes:
            return f"node {progress.node} of GPU {progress.card} is not in the cluster any more"
        return None
    if progress.node not in marked_nodes(view.nodes):
        return f"node {progress.node} no longer carries the mark {MARK_TAINT}"
    return None
