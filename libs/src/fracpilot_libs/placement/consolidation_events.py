"""A consolidation plan as the event stream carries it (:class:`ConsolidationReport`,
:class:`PlannedMove`). Pure: the live actuator and the simulated cluster both publish these."""

from __future__ import annotations

from datetime import datetime

from fracpilot_libs.contracts import (
    CONSOLIDATION_MOVES_KEPT,
    CONSOLIDATION_REFUSALS_KEPT,
    ConsolidationMode,
    ConsolidationRefusal,
    ConsolidationReport,
    PlannedMove,
)
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    ConsolidationStep,
    StepKind,
)
from fracpilot_libs.placement.planner import ClusterState


def planned_move(step: ConsolidationStep, state: ClusterState | None = None) -> PlannedMove:
    """One step on the wire; ``state`` (the cluster before the plan) names the source card's
    node when the step does not."""
    placement = step.placement
    from_node = step.from_node
    if not from_node and state is not None:
        gpu = state.gpu(placement.gpu_uuid)
        from_node = gpu.node if gpu is not None else ""
    return PlannedMove(
        pod=placement.pod_key,
        workload=placement.workload,
        kind="shrink" if step.kind is StepKind.SHRINK else "move",
        fraction=step.fraction,
        from_node=from_node,
        from_gpu=placement.gpu_uuid,
        to_node=step.to_node,
        to_gpu=step.to_gpu,
        frees="node" if step.frees is Candidate.NODE else "gpu",
        frees_name=step.frees_name,
    )


def consolidation_report(
    plan: ConsolidationPlan,
    *,
    cluster: str,
    mode: ConsolidationMode,
    at: datetime,
    node: str = "",
) -> ConsolidationReport:
    """The report of ``plan``: its counts, the first :data:`CONSOLIDATION_MOVES_KEPT` steps and
    :data:`CONSOLIDATION_REFUSALS_KEPT` refusals (the counts are of them all)."""
    return ConsolidationReport(
        cluster=cluster,
        mode=mode,
        would_free_gpus=plan.cards_freed,
        would_free_nodes=len(plan.freed_nodes),
        gpus_on_freed_nodes=plan.gpus_on_freed_nodes,
        freed_nodes=plan.freed_nodes[:1000],
        move_count=len(plan.moves),
        moves=tuple(planned_move(s) for s in plan.steps[:CONSOLIDATION_MOVES_KEPT]),
        refused_count=len(plan.refused),
        refused=tuple(
            ConsolidationRefusal(
                candidate="node" if r.candidate is Candidate.NODE else "gpu",
                name=r.name[:253],
                reason=r.reason[:1000],
            )
            for r in plan.refused[:CONSOLIDATION_REFUSALS_KEPT]
        ),
        node=node,
        reported_at=at,
    )
