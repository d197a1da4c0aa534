"""Consolidation: which pods to move, one after another, so that whole nodes and whole GPUs come
free. Pure: the cluster, the facts that make a move safe and the limits in; a plan out.

:func:`consolidation_plan` looks at two kinds of candidates, **nodes first**: a node all of whose
GPU pods can go elsewhere (the autoscaler then removes it), then single cards. A candidate is all
or nothing: its tenants are moved one at a time on the cluster as the earlier moves left it (make
before break), and if one of them cannot move, none does and the candidate is refused with the
reason. The plan says which cards and nodes the moves free and, for every candidate it leaves,
why (so ``status`` and ``report`` can say "would free N GPUs / M nodes" and why not more).

**Where a moved pod goes** is predicted, not chosen: KAI's binpack puts the replacement on the
fullest card that holds it (:func:`~fracpilot_libs.placement.planner.move_or_scale_up`'s best
fit: least free share, then uuid), among the cards whose node passes kube-scheduler's
predicates for the pod (:func:`~fracpilot_libs.placement.predicates.node_fits`, the rule
:func:`~fracpilot_libs.placement.predicates.node_rule` applies) and that the backend's fit rule
accepts (KAI: the free share; HAMi: :func:`~fracpilot_libs.hami.placement.hami_fit`). Nodes
being emptied and nodes already freed are left out: the actuator marks a node it empties with a
NoSchedule taint, so the scheduler does too. When that prediction is of no use (the pod would go
back onto the card being freed, onto a card this plan freed, onto an idle card or node, or onto
a card whose budget does not hold it) the move is refused; the planner never pretends to steer
the scheduler.

**Card budgets** (``shared`` isolation, :mod:`fracpilot_libs.placement.card_budget`): with a
:data:`~.consolidation_limits.CardBudget`, a card must hold its tenants' pooled budget after a
move; when no card has room for the pod, the card that would hold it once its tenants shrink in
place to their budgeted shares (an annotation patch, free under shared isolation) gets those
``shrink`` steps first, each down to the tenant's share and never below, and only if that card
would then be the scheduler's choice. A moved pod keeps its fraction (card sizing re-divides the
card later).

**What a move must respect** (each from its upstream source):

- ``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`` on a node: cluster-autoscaler
  never removes it (``HasNoScaleDownAnnotation``,
  ``cluster-autoscaler/core/scaledown/eligibility/eligibility.go`` in kubernetes/autoscaler at
  0a11e9c1a02e64a6405540ae41727358ec9fcc15), so emptying it frees nothing: its pods stay;
- ``karpenter.sh/do-not-disrupt: "true"`` on a node or a pod (``DoNotDisruptAnnotationKey``,
  ``pkg/apis/v1/labels.go`` at 046bcdae737388a7edf5f984cdecfe62047b9143, and ``HasDoNotDisrupt``,
  ``pkg/utils/pod/scheduling.go`` at 098a20853917af9cd2dc5c8ac3daa4b2710ec714, in
  kubernetes-sigs/karpenter: the value must be exactly ``"true"``): the pod, or every pod on the
  node, stays;
- ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`` on a pod (``PodSafeToEvictKey`` and
  ``hasNotSafeToEvictAnnotation``, ``cluster-autoscaler/utils/drain/drain.go`` at
  000d777365d7e43f3d5adf46a0c39421d4b3c357): it stays;
- PodDisruptionBudgets (:class:`~.consolidation_limits.DisruptionBudget`:
  ``status.disruptionsAllowed`` and the pods the budget selects): a plan never evicts more of a
  budget's pods than it allows;
- gangs (:class:`~.consolidation_limits.Gang`, a KAI PodGroup): never below ``minMember``, the
  actuator's rule (``fracpilot_actuator.kube.gangs.gang_refusal``) taken as data: a group of
  ``minMember`` > 1 gives up at most ``running - minMember`` members in one plan;
- the scheduler's predicates for the target node and the backend's fit rule (above);
- ``max_moves``: the consolidation rate limit, moves per plan (shrinks are not moves);
- ``pinned``: pods the caller keeps where they are (the actuator: pods not opted in to auto).

Pods known to ``state`` but missing from ``facts`` (when facts are given) are not moved: where
they may go cannot be checked. Without ``facts`` every node may take every pod (replay).

The plan as data is :mod:`.consolidation_steps`, the limits as data :mod:`.consolidation_limits`,
and the cluster as the moves change it :mod:`.consolidation_board`.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fracpilot_libs.placement.consolidation_board import Board
from fracpilot_libs.placement.consolidation_limits import CardBudget, DisruptionBudget, Gang
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    ConsolidationStep,
    Refusal,
    StepKind,
)
from fracpilot_libs.placement.planner import EPSILON, ClusterState, FitRule
from fracpilot_libs.placement.scheduling_facts import ClusterFacts

SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def consolidation_plan(
    state: ClusterState,
    *,
    max_moves: int,
    facts: ClusterFacts | None = None,
    node_annotations: Mapping[str, Mapping[str, str]] | None = None,
    pod_annotations: Mapping[str, Mapping[str, str]] | None = None,
    disruption_budgets: Iterable[DisruptionBudget] = (),
    gangs: Iterable[Gang] = (),
    fit: FitRule | None = None,
    card_budget: CardBudget | None = None,
    spread: bool = True,
    pinned: Mapping[str, str] | None = None,
) -> ConsolidationPlan:
    """The moves that free whole nodes first, then single cards (module docstring).

    ``facts``: the scheduler's view of nodes and pods (None: every node takes every pod);
    ``node_annotations``/``pod_annotations`` (by node name, by ``namespace/name``): the
    autoscalers' opt-outs; ``fit``: the backend's fit rule (None: the free share, KAI);
    ``card_budget``: shared isolation's card budgets; ``spread=False``: a scheduler without
    topology spread (KAI); ``pinned``: pods (``namespace/name``) the caller's own rules keep
    where they are, with why (the actuator's opt-in rule)."""
    return _Planner(
        Board(state, facts, spread, fit),
        max_moves=max_moves,
        node_annotations=node_annotations or {},
        pod_annotations=pod_annotations or {},
        budgets=tuple(disruption_budgets),
        gangs=tuple(gangs),
        card_budget=card_budget,
        pinned=pinned or {},
    ).plan()


# --- the planner ------------------------------------------------------------------------------


@dataclass
class _Attempt:
    """One candidate being emptied."""

    candidate: Candidate
    name: str
    source_gpu: str  # a card candidate's card ("" for a node)
    tainted: frozenset[str]  # nodes the scheduler will not use: being emptied, or freed
    steps: list[ConsolidationStep] = field(default_factory=list)


class _Planner:
    def __init__(
        self,
        board: Board,
        *,
        max_moves: int,
        node_annotations: Mapping[str, Mapping[str, str]],
        pod_annotations: Mapping[str, Mapping[str, str]],
        budgets: tuple[DisruptionBudget, ...],
        gangs: tuple[Gang, ...],
        card_budget: CardBudget | None,
        pinned: Mapping[str, str],
    ) -> None:
        self.board = board
        self.pinned = pinned
        self.moves_left = max(0, max_moves)
        self.max_moves = max(0, max_moves)
        self.node_annotations = node_annotations
        self.pod_annotations = pod_annotations
        self.card_budget = card_budget
        self.budgets = {b.name: b for b in budgets}
        self.budgets_of: dict[str, list[str]] = {}
        for b in budgets:
            for key in b.pods:
                self.budgets_of.setdefault(key, []).append(b.name)
        self.gangs = {g.name: g for g in gangs}
        self.gang_of: dict[str, str] = {k: g.name for g in gangs for k in g.pods}
        self.evicted_by_budget: dict[str, int] = {}  # PDB name -> pods this plan moves
        self.evicted_by_gang: dict[str, int] = {}
        self.steps: list[ConsolidationStep] = []
        self.refused: list[Refusal] = []
        self.freed_nodes: set[str] = set()
        self.freed_gpus: set[str] = set()
        self.received_nodes: set[str] = set()
        self.received_gpus: set[str] = set()

    def plan(self) -> ConsolidationPlan:
        board = self.board
        in_use_before = {u for u, t in board.tenants.items() if t}
        nodes_before = {n for n, c in board.node_tenants.items() if c}
        for node in sorted(nodes_before, key=self._node_order):
            self._try_node(node)
        for uuid in sorted(
            (u for u, t in board.tenants.items() if t), key=lambda u: self._card_order(u)
        ):
            if board.node_of(uuid) not in self.freed_nodes:
                self._try_card(uuid)
        in_use_after = {u for u, t in board.tenants.items() if t}
        freed_nodes = tuple(sorted(n for n in nodes_before if board.node_tenants[n] == 0))
        return ConsolidationPlan(
            steps=tuple(self.steps),
            freed_nodes=freed_nodes,
            emptied_gpus=tuple(sorted(in_use_before - in_use_after)),
            gpus_on_freed_nodes=sum(len(board.node_gpus[n]) for n in freed_nodes),
            cards_freed=len(in_use_before) - len(in_use_after),
            refused=tuple(self.refused),
        )

    def _node_order(self, node: str) -> tuple[int, float, str]:
        """Cheapest to empty first: fewest GPU pods, then the least share held."""
        pods = self.board.on_node(node)
        return (len(pods), sum(self.board.fraction[k] for k in pods), node)

    def _card_order(self, uuid: str) -> tuple[int, float, str]:
        return (len(self.board.tenants[uuid]), 1.0 - self.board.free[uuid], uuid)

    # -- candidates

    def _try_node(self, node: str) -> None:
        why = self._node_protection(node)
        if why is None and node in self.received_nodes:
            why = "it received pods in this plan"
        if why is not None:
            self.refused.append(Refusal(Candidate.NODE, node, why))
            return
        attempt = _Attempt(Candidate.NODE, node, "", frozenset(self.freed_nodes | {node}))
        pods = self.board.on_node(node)
        if (why := self._empty(attempt, pods)) is not None:
            self.refused.append(Refusal(Candidate.NODE, node, why))
            return
        self.freed_nodes.add(node)
        self.freed_gpus.update(u for u in self.board.node_gpus[node])

    def _try_card(self, uuid: str) -> None:
        node = self.board.node_of(uuid)
        why = self._node_protection(node)
        if why is None and uuid in self.received_gpus:
            why = "it received a pod in this plan"
        if why is not None:
            self.refused.append(Refusal(Candidate.GPU, uuid, why))
            return
        attempt = _Attempt(Candidate.GPU, uuid, uuid, frozenset(self.freed_nodes))
        if (why := self._empty(attempt, list(self.board.tenants[uuid]))) is not None:
            self.refused.append(Refusal(Candidate.GPU, uuid, why))
            return
        self.freed_gpus.add(uuid)

    def _node_protection(self, node: str) -> str | None:
        notes = self.node_annotations.get(node, {})
        if notes.get(SCALE_DOWN_DISABLED) == "true":
            return f"node {node} is annotated {SCALE_DOWN_DISABLED}=true: it stays"
        if notes.get(DO_NOT_DISRUPT) == "true":
            return f"node {node} is annotated {DO_NOT_DISRUPT}=true"
        return None

    def _pod_refusal(self, key: str) -> str | None:
        if (why := self.pinned.get(key)) is not None:
            return f"pod {key} stays: {why}"
        notes = self.pod_annotations.get(key, {})
        if notes.get(SAFE_TO_EVICT) == "false":
            return f"pod {key} is annotated {SAFE_TO_EVICT}=false"
        if notes.get(DO_NOT_DISRUPT) == "true":
            return f"pod {key} is annotated {DO_NOT_DISRUPT}=true"
        if self.board.facts is not None and key not in self.board.pod_facts:
            return f"pod {key} has no scheduling facts: where it may go cannot be checked"
        return None

    def _budget_refusal(self, pods: list[str]) -> str | None:
        """PDBs and gangs: the candidate's evictions beside those the plan has already."""
        wanted: dict[str, int] = {}
        for key in pods:
            for name in self.budgets_of.get(key, ()):
                wanted[name] = wanted.get(name, 0) + 1
        for name, n in sorted(wanted.items()):
            allowed, done = max(0, self.budgets[name].allowed), self.evicted_by_budget.get(name, 0)
            if done + n > allowed:
                return (
                    f"PodDisruptionBudget {name} allows {allowed} disruption(s); emptying it "
                    f"takes {n} more beside {done} already in this plan"
                )
        wanted_gangs: dict[str, int] = {}
        for key in pods:
            if (group := self.gang_of.get(key)) is not None:
                wanted_gangs[group] = wanted_gangs.get(group, 0) + 1
        for name, n in sorted(wanted_gangs.items()):
            gang = self.gangs[name]
            may = gang.may_lose
            done = self.evicted_by_gang.get(name, 0)
            if may is not None and done + n > may:
                return (
                    f"PodGroup {name} runs {gang.running} of minMember {gang.min_member}: "
                    f"moving {n} more beside {done} would take it below"
                )
        return None

    def _empty(self, attempt: _Attempt, pods: list[str]) -> str | None:
        """Move every pod of the candidate, largest first; undo all and say why if one cannot."""
        board = self.board
        for key in sorted(pods):
            if (why := self._pod_refusal(key)) is not None:
                return why
        if (why := self._budget_refusal(pods)) is not None:
            return why
        if len(pods) > self.moves_left:
            return (
                f"emptying it takes {len(pods)} move(s); {self.moves_left} left of this plan's "
                f"limit of {self.max_moves}"
            )
        mark = len(board.journal)
        for key in sorted(pods, key=lambda k: (-board.fraction[k], k)):
            if (why := self._move(attempt, key)) is not None:
                board.rollback(mark)
                return why
        # committed
        self.moves_left -= len(pods)
        for key in pods:
            for name in self.budgets_of.get(key, ()):
                self.evicted_by_budget[name] = self.evicted_by_budget.get(name, 0) + 1
            if (gang := self.gang_of.get(key)) is not None:
                self.evicted_by_gang[gang] = self.evicted_by_gang.get(gang, 0) + 1
        for step in attempt.steps:
            if step.kind is StepKind.MOVE:
                self.received_gpus.add(step.to_gpu)
                self.received_nodes.add(step.to_node)
        self.steps.extend(attempt.steps)
        return None

    # -- one move

    def _move(self, attempt: _Attempt, key: str) -> str | None:
        """Evict the pod and place it where the scheduler would (shrinking that card's tenants
        first where a card budget needs it); the reason when that is of no use."""
        board = self.board
        before = board.placements[key].model_copy(
            update={"gpu_uuid": board.where[key], "fraction": board.fraction[key]}
        )
        fraction = before.fraction
        from_node = board.node_of(before.gpu_uuid)
        board.put(key, "", fraction)
        verdicts: dict[str, str | None] = {}
        choice = self._scheduler_choice(key, fraction, attempt, verdicts)
        shrinks: dict[str, float] = {}
        why = self._useless(attempt, key, fraction, choice)
        if why is not None and self.card_budget is not None:
            shrunk = self._shrink_choice(key, fraction, attempt, choice, verdicts)
            if shrunk is not None:
                choice, shrinks = shrunk
                why = None
        if why is not None:
            return f"pod {key} ({fraction:g}) cannot move: {why}"
        assert choice is not None
        to_node = board.node_of(choice)
        for tenant, share in sorted(shrinks.items()):
            was = board.placements[tenant].model_copy(
                update={"gpu_uuid": choice, "fraction": board.fraction[tenant]}
            )
            attempt.steps.append(
                ConsolidationStep(
                    kind=StepKind.SHRINK,
                    placement=was,
                    fraction=share,
                    from_node=to_node,
                    to_gpu=choice,
                    to_node=to_node,
                    frees=attempt.candidate,
                    frees_name=attempt.name,
                    reason=f"shrinks in place from {was.fraction:g} to its budgeted share "
                    f"{share:g} of {choice}, to make room for {key}",
                )
            )
            board.put(tenant, choice, share)
        free = board.free[choice]
        board.put(key, choice, fraction)
        what = f"{attempt.candidate.value} {attempt.name}"
        attempt.steps.append(
            ConsolidationStep(
                kind=StepKind.MOVE,
                placement=before,
                fraction=fraction,
                from_node=from_node,
                to_gpu=choice,
                to_node=to_node,
                frees=attempt.candidate,
                frees_name=attempt.name,
                reason=f"empties {what}: the scheduler's best fit for {fraction:g} is {choice} "
                f"on {to_node} ({free:g} free)",
            )
        )
        return None

    def _scheduler_choice(
        self, key: str, fraction: float, attempt: _Attempt, verdicts: dict[str, str | None]
    ) -> str | None:
        """The fullest card the scheduler may put the pod on (None: none holds it)."""
        board = self.board
        order = board.order
        # with the share rule only cards with that much free qualify; another backend's rule
        # (HAMi) counts memory and slots, so every card is asked, fullest first
        start = 0 if board.fit is not None else bisect.bisect_left(order, (fraction - EPSILON,))
        for i in range(start, len(order)):
            uuid = order[i][1]
            gpu = board.gpus[uuid]
            if not gpu.healthy or gpu.node in attempt.tainted:
                continue
            if gpu.node not in verdicts:
                verdicts[gpu.node] = board.node_refusal(key, gpu.node)
            if verdicts[gpu.node] is None and board.holds(uuid, fraction, key):
                return uuid
        return None

    def _useless(
        self, attempt: _Attempt, key: str, fraction: float, choice: str | None
    ) -> str | None:
        """Why the scheduler's choice does not serve the plan (None: it does)."""
        board = self.board
        if choice is None:
            return "no card it may go to holds it"
        if choice == attempt.source_gpu:
            return f"the scheduler would put it back on {choice}, the card being freed"
        if choice in self.freed_gpus:
            return f"the scheduler would put it on {choice}, freed earlier in this plan"
        tenants = board.tenants[choice]
        if not tenants and attempt.candidate is Candidate.GPU:
            return f"the best fit is an idle card ({choice}): moving it frees nothing"
        node = board.node_of(choice)
        if board.node_tenants[node] == 0:
            return f"the best fit is on an idle node ({node}): moving it frees nothing"
        budget = self.card_budget
        if budget is not None and budget(choice, {**tenants, key: fraction}) is None:
            return f"the scheduler's best fit {choice} would be over its card budget"
        return None

    def _shrink_choice(
        self,
        key: str,
        fraction: float,
        attempt: _Attempt,
        first: str | None,
        verdicts: dict[str, str | None],
    ) -> tuple[str, dict[str, float]] | None:
        """A card that holds the pod once its tenants shrink to their budgeted shares and is
        then the scheduler's choice (fuller than ``first``, its choice without shrinking): the
        fullest such card and the shares its tenants shrink to."""
        board = self.board
        assert self.card_budget is not None
        beat = (board.free[first], first) if first is not None else (2.0, "")
        best: tuple[float, str, dict[str, float]] | None = None
        end = bisect.bisect_left(board.order, (fraction - EPSILON,))
        for i in range(end):
            uuid = board.order[i][1]
            gpu = board.gpus[uuid]
            tenants = board.tenants[uuid]
            if not gpu.healthy or gpu.node in attempt.tainted or not tenants:
                continue
            if uuid == attempt.source_gpu or uuid in self.freed_gpus:
                continue
            shares = self.card_budget(uuid, {**tenants, key: fraction})
            if shares is None:
                continue
            after = {t: min(f, shares[t]) for t, f in tenants.items()}
            new_free = 1.0 - sum(after.values())
            if new_free + EPSILON < fraction or (new_free, uuid) >= beat:
                continue
            if best is not None and (new_free, uuid) >= (best[0], best[1]):
                continue
            if gpu.node not in verdicts:
                verdicts[gpu.node] = board.node_refusal(key, gpu.node)
            if verdicts[gpu.node] is not None:
                continue
            if board.fit is not None and not self._fits_after(uuid, after, fraction, key):
                continue
            shrinks = {t: s for t, s in after.items() if s + EPSILON < tenants[t]}
            best = (new_free, uuid, shrinks)
        return None if best is None else (best[1], best[2])

    def _fits_after(self, uuid: str, after: Mapping[str, float], fraction: float, key: str) -> bool:
        """The backend's fit rule on the card once its tenants hold ``after``."""
        board = self.board
        mark = len(board.journal)
        for tenant, share in after.items():
            board.put(tenant, uuid, share)
        ok = board.holds(uuid, fraction, key)
        board.rollback(mark)
        return ok
