"""Consolidation's wire contracts: the actuator's reports and moves, on
``subjects.CONSOLIDATION_STREAM`` (re-exported by :mod:`fracpilot_libs.contracts`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from fracpilot_libs.contracts_base import (
    SCHEMA_VERSION,
    Fraction,
    UtcDatetime,
    WireModel,
    WorkloadRef,
)

CONSOLIDATION_MOVES_KEPT = 200  # planned moves a report lists (the counts are of them all)
CONSOLIDATION_REFUSALS_KEPT = 20  # refused candidates a report names


class ConsolidationMode(StrEnum):
    """The actuator's consolidation mode (``FRACPILOT_CONSOLIDATION_MODE``; off publishes
    nothing)."""

    RECOMMEND = "recommend"  # plans and reports, moves nothing
    AUTO = "auto"  # empties the plan's nodes, one pod at a time


class PlannedMove(WireModel):
    """One step of a consolidation plan: the pod, where it is, where the scheduler is predicted
    to put it, and what the step frees."""

    pod: str = Field(min_length=1, max_length=317)  # namespace/name
    workload: WorkloadRef
    kind: Literal["move", "shrink"] = "move"  # shrink: in place on the target card, first
    fraction: Fraction  # what it holds after the step
    from_node: str = Field(default="", max_length=253)
    from_gpu: str = Field(default="", max_length=128)
    to_node: str = Field(default="", max_length=253)
    to_gpu: str = Field(default="", max_length=128)
    frees: Literal["node", "gpu"] = "node"  # what the step is for
    frees_name: str = Field(default="", max_length=253)  # that node's name or that card's uuid


class ConsolidationRefusal(WireModel):
    """A candidate the plan leaves, and why (a PDB, an opt-out, no room ...)."""

    candidate: Literal["node", "gpu"]
    name: str = Field(max_length=253)
    reason: str = Field(max_length=1000)


class ConsolidationReport(WireModel):
    """The actuator's consolidation plan as it stands: what it would free and the moves that
    would do it. Published when the summary changes (not every round); the latest is what
    ``fracpilot status`` shows."""

    schema_version: Literal[1] = SCHEMA_VERSION
    cluster: str = Field(min_length=1, max_length=253)
    mode: ConsolidationMode
    would_free_gpus: Annotated[int, Field(ge=0)]  # cards in use before minus after
    would_free_nodes: Annotated[int, Field(ge=0)]
    gpus_on_freed_nodes: Annotated[int, Field(ge=0)] = 0  # what the autoscaler gives back
    freed_nodes: tuple[str, ...] = Field(default=(), max_length=1000)  # the nodes it would empty
    move_count: Annotated[int, Field(ge=0)] = 0  # every move of the plan
    moves: tuple[PlannedMove, ...] = Field(default=(), max_length=CONSOLIDATION_MOVES_KEPT)
    refused_count: Annotated[int, Field(ge=0)] = 0
    refused: tuple[ConsolidationRefusal, ...] = Field(
        default=(), max_length=CONSOLIDATION_REFUSALS_KEPT
    )
    node: str = Field(default="", max_length=253)  # auto: the node being emptied ("" none)
    reported_at: UtcDatetime


class MoveState(StrEnum):
    STARTED = "started"  # the pod is being evicted (announced first); its replacement awaited
    VERIFIED = "verified"  # the replacement is bound, where the result says
    FAILED = "failed"  # the eviction failed, or the replacement was not bound in time
    ABANDONED = "abandoned"  # the node's plan was given up (the mark came off)
    FREED = "freed"  # the node holds no GPU pod any more: the autoscaler may remove it


class ConsolidationMove(WireModel):
    """What consolidation did in auto mode: a move's start and result, a node's plan given up,
    or a node freed (``freed_node``, ``freed_gpus``; no pod)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    cluster: str = Field(min_length=1, max_length=253)
    state: MoveState
    node: str = Field(min_length=1, max_length=253)  # the node being emptied
    move: PlannedMove | None = None  # the planned step (None: about the node only)
    new_pod: str = Field(default="", max_length=253)  # verified: the replacement
    to_node: str = Field(default="", max_length=253)  # verified: where it was bound
    freed_node: str = Field(default="", max_length=253)  # freed: the node given back
    freed_gpus: Annotated[int, Field(ge=0)] = 0  # freed: the GPUs on it
    detail: str = Field(default="", max_length=4000)
    at: UtcDatetime
