"""A consolidation move in flight (:class:`MoveInFlight`: a pod evicted, its replacement
awaited) and its verdict (:func:`move_verdict`: make before break, the next move waits until
the replacement is bound; read from the new pod, never the plan). Pure: time is an argument."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from fracpilot_actuator.kube.inventory import Inventory
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep

SAME_SHARE = 0.005  # KAI keeps hundredths (verification.py)


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
