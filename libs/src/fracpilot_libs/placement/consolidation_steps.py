"""A consolidation plan as data (:func:`~fracpilot_libs.placement.consolidation.consolidation_plan`
makes one): its steps (a ``shrink`` in place or a ``move``), the candidates it leaves and why,
what it frees, and the cluster once it is done. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from fracpilot_libs.contracts import PlanKind
from fracpilot_libs.placement.planner import ClusterState, Placement, ResizePlan, apply_pod_plan


class StepKind(StrEnum):
    SHRINK = "shrink"  # in place, on the target card, to make room for the move that follows
    MOVE = "move"  # evict; the scheduler places the replacement on ``to_gpu``


class Candidate(StrEnum):
    NODE = "node"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class ConsolidationStep:
    kind: StepKind
    placement: Placement  # the pod as it is before the step
    fraction: float  # its fraction after the step
    from_node: str
    to_gpu: str  # a shrink stays on its card
    to_node: str
    frees: Candidate  # what the step is for: emptying a node, or a card
    frees_name: str  # that node's name or that card's uuid
    reason: str

    @property
    def pod_key(self) -> str:
        return self.placement.pod_key

    def as_resize_plan(self) -> ResizePlan:
        """The planner's step, as the actuator executes one (in place, or recreate elsewhere)."""
        return ResizePlan(
            kind=PlanKind.IN_PLACE if self.kind is StepKind.SHRINK else PlanKind.RECREATE_ELSEWHERE,
            workload=self.placement.workload,
            pod=self.placement.pod,
            fraction_before=self.placement.fraction,
            fraction_after=self.fraction,
            gpu_before=self.placement.gpu_uuid,
            gpu_after=self.to_gpu,
            reason=self.reason,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """A candidate the plan leaves, and why."""

    candidate: Candidate
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    steps: tuple[ConsolidationStep, ...]
    freed_nodes: tuple[str, ...]  # held GPU pods before, none after
    emptied_gpus: tuple[str, ...]  # held a tenant before, none after
    gpus_on_freed_nodes: int  # every GPU of the freed nodes (what the autoscaler gives back)
    cards_freed: int  # cards in use before minus cards in use after
    refused: tuple[Refusal, ...] = field(default=())

    @property
    def moves(self) -> tuple[ConsolidationStep, ...]:
        return tuple(s for s in self.steps if s.kind is StepKind.MOVE)

    def summary(self) -> str:
        """ "would free 3 GPU(s) and 1 node(s) (8 GPUs on them) with 4 move(s); ..."."""
        return (
            f"would free {self.cards_freed} GPU(s) and {len(self.freed_nodes)} node(s) "
            f"({self.gpus_on_freed_nodes} GPUs on them) with {len(self.moves)} move(s); "
            f"{len(self.refused)} candidate(s) refused"
        )


def apply_consolidation(state: ClusterState, plan: ConsolidationPlan) -> ClusterState:
    """The cluster once every step of the plan is done, in order."""
    for step in plan.steps:
        state = apply_pod_plan(state, step.as_resize_plan())
    return state
