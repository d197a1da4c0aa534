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
- **Shared isolation** (:func:`.consolidation_pods.shared_card_budget`): a tenant whose
  workload's last decision carried a card forecast (the policy auto, its isolation not
  ``enforced``), opted in to auto, and whose memory nothing enforces (KAI without HAMi-core)
  has a budgeted share of its card;
  the planner may shrink it in place to that share to make room for a move (a ``shrink``
  step, done live as an annotation patch). A card none of whose tenants is such keeps the
  plain fit rule: each tenant keeps its fraction.
- **Autoscaler and gang rules**: the planner's (``scale-down-disabled``, ``do-not-disrupt``,
  ``safe-to-evict``, PDBs' ``disruptionsAllowed``, KAI PodGroups' ``minMember``).

Around the round: the cluster as it reads it (:mod:`.consolidation_view`), which pods may move
or shrink (:mod:`.consolidation_pods`), whether a moved pod's replacement is bound
(:mod:`.consolidation_moves`: make before break, the next move waits for it) and what a leader
saves for the next (:mod:`.consolidation_progress`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fracpilot_actuator.kube.consolidation_pods import pins, shared_card_budget, shrinkable
from fracpilot_actuator.kube.consolidation_view import ConsolidationView, gangs_of
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_libs.contracts import CardForecast
from fracpilot_libs.placement.consolidation import consolidation_plan
from fracpilot_libs.placement.consolidation_limits import CardBudget
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    ConsolidationStep,
    StepKind,
)

MARK_TAINT = "fracpilot.io/consolidating"
"""The NoSchedule taint on a node being emptied (value ``"true"``)."""
MARK_REASON = "fracpilot.io/consolidating-reason"
"""The annotation saying why the node is being emptied."""
UNLIMITED = 1_000_000  # the planner's move limit when the round applies its own


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


def marked_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The nodes carrying our mark (a previous round's, or a previous leader's)."""
    return sorted(
        name
        for name, raw in nodes.items()
        if any(t.get("key") == MARK_TAINT for t in (raw.get("spec") or {}).get("taints") or ())
    )


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
