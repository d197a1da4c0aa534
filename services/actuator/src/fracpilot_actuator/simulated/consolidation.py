"""Consolidation on the simulated cluster: the live planner
(:func:`fracpilot_libs.placement.consolidation.consolidation_plan`), carried out at once. Pure.

As on a real cluster (:mod:`fracpilot_actuator.kube.consolidation_round`): ``would`` is the plan
with every pod that is not off (what recommend mode reports); in auto mode only pods opted in
to auto move, whole nodes only (card candidates are reported, not moved), at most
``max_moves_per_hour`` moves in any simulated hour. A move here is instant (the simulated
scheduler puts the replacement where the planner predicts), so a node is emptied in one round;
the simulated autoscaler (:mod:`.autoscaler`) then removes it once it has been empty long
enough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from fracpilot_actuator.opt_in import Automation, automation_of
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_libs.contracts import Mode, WorkloadRef
from fracpilot_libs.placement.consolidation import consolidation_plan
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    ConsolidationStep,
)
from fracpilot_libs.placement.planner import ClusterState, apply_plan

UNLIMITED = 1_000_000


@dataclass(frozen=True)
class Moved:
    step: ConsolidationStep
    new_pod: str


@dataclass(frozen=True)
class SimulatedRound:
    would: ConsolidationPlan
    state: ClusterState  # after the moves (the state given when none)
    moved: tuple[Moved, ...] = ()
    freed_nodes: tuple[str, ...] = ()  # held GPU pods before the moves, none after


def automation(
    workload: WorkloadRef,
    namespace_labels: Mapping[str, Mapping[str, str]],
    opt_in: OptInSettings,
) -> Automation:
    """The opt-in rule's answer for a simulated workload (its namespace's labels decide)."""
    labels = namespace_labels.get(workload.namespace, {})
    return automation_of(workload.namespace, labels, (), Mode.AUTO, opt_in).mode


def simulated_round(
    state: ClusterState,
    settings: ConsolidationSettings,
    automation_of_workload: Callable[[WorkloadRef], Automation],
    recent_moves: Sequence[datetime],
    now: datetime,
    new_pod: Callable[[ConsolidationStep, int], str],
) -> SimulatedRound:
    """One round (the module docstring); ``recent_moves``: when the moves of the last hour
    were made; ``new_pod``: the replacement's name for a step and its number in the round."""
    modes = {p.pod_key: automation_of_workload(p.workload) for p in state.placements}
    off = {k: "opted out" for k, m in modes.items() if m is Automation.OFF}
    would = consolidation_plan(state, max_moves=UNLIMITED, pinned=off)
    if settings.mode != "auto":
        return SimulatedRound(would, state)
    hour_ago = now - timedelta(hours=1)
    left = settings.max_moves_per_hour - sum(1 for t in recent_moves if t > hour_ago)
    if left <= 0:
        return SimulatedRound(would, state)
    manual = {k: "not opted in to auto" for k, m in modes.items() if m is not Automation.AUTO}
    plan = consolidation_plan(state, max_moves=left, pinned=manual)
    steps = [s for s in plan.moves if s.frees is Candidate.NODE]
    gpu_node = {g.uuid: g.node for g in state.gpus}

    def nodes_held(s: ClusterState) -> set[str]:
        return {gpu_node.get(p.gpu_uuid, "") for p in s.placements}

    before = nodes_held(state)
    moved = []
    after = state
    for n, step in enumerate(steps):
        name = new_pod(step, n)
        after = apply_plan(after, step.as_resize_plan(), name)
        moved.append(Moved(step, name))
    freed = tuple(sorted(before - nodes_held(after)))
    return SimulatedRound(would, after, tuple(moved), freed)
