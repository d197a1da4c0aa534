"""What a consolidation leader saves for the next one (:class:`Progress`: the node or card
being emptied, the move in flight, the recent moves), its JSON form (:func:`progress_json`,
:func:`progress_of`) and whether a new leader goes on with it (:func:`resume_refusal`). Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fracpilot_actuator.kube.consolidation_moves import MoveInFlight
from fracpilot_actuator.kube.consolidation_round import MARK_TAINT, marked_nodes
from fracpilot_actuator.kube.consolidation_view import ConsolidationView
from fracpilot_libs.placement.consolidation_steps import Candidate, ConsolidationStep, StepKind
from fracpilot_libs.placement.planner import Placement


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
    # an emptied KAI card leaves the inventory (the round's _card_round): its node stays
    if progress.card:
        if progress.node not in view.nodes:
            return f"node {progress.node} of GPU {progress.card} is not in the cluster any more"
        return None
    if progress.node not in marked_nodes(view.nodes):
        return f"node {progress.node} no longer carries the mark {MARK_TAINT}"
    return None
