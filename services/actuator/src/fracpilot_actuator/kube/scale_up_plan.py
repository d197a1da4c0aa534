"""A scale-up waiting for capacity, planned (:func:`plan_scale_up`): for each of its pods,
wait, give up, or move (in place or recreate) and whether its placeholder must go with the
eviction; :mod:`.scale_ups` only carries that out. Pure: time is an argument."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from fracpilot_actuator.kube.cluster_view import ClusterView
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED, must_recreate
from fracpilot_actuator.kube.hami import fit_rule
from fracpilot_actuator.kube.placeholders import PendingScaleUp
from fracpilot_libs.contracts import GpuSharing, PlanKind
from fracpilot_libs.placement.planner import (
    ClusterState,
    NodeOkFor,
    Placement,
    ResizePlan,
    apply_pod_plan,
    plan_pod,
)


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
