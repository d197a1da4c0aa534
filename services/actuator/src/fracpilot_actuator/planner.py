"""The actuation planner: a pure function from the cluster's GPU picture and a decision to a plan.

1. in place: the new fraction fits on the pod's current GPU;
2. recreate elsewhere: it fits on another GPU (best fit: the fullest GPU that still fits, so
   large holes stay free for large requests);
3. scale up: it fits nowhere, so capacity must be added first (make before break).
No I/O: the backend that executes the plan (simulated cluster, Kubernetes) lives elsewhere.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fracpilot_libs.contracts import FractionDecision, PlanKind, WorkloadRef

# Fractions are sums of grid steps; float sums need a tolerance when compared to 1.0.
EPSILON = 1e-9


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Gpu(_Frozen):
    uuid: str
    node: str
    memory_bytes: int = Field(gt=0)


class Placement(_Frozen):
    workload: WorkloadRef
    pod: str
    gpu_uuid: str
    fraction: float = Field(gt=0, le=1)


class ClusterState(_Frozen):
    """Every GPU and which workload holds how much of it."""

    gpus: tuple[Gpu, ...] = ()
    placements: tuple[Placement, ...] = ()

    def placement(self, workload: WorkloadRef) -> Placement | None:
        return next((p for p in self.placements if p.workload.key == workload.key), None)

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def used(self, gpu_uuid: str, excluding: WorkloadRef | None = None) -> float:
        skip = excluding.key if excluding else None
        return sum(
            p.fraction for p in self.placements if p.gpu_uuid == gpu_uuid and p.workload.key != skip
        )

    def free(self, gpu_uuid: str, excluding: WorkloadRef | None = None) -> float:
        return 1.0 - self.used(gpu_uuid, excluding)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.node for g in self.gpus))


class ResizePlan(_Frozen):
    kind: PlanKind
    workload: WorkloadRef
    fraction_before: float | None
    fraction_after: float
    gpu_before: str = ""
    gpu_after: str = ""  # empty for a scale-up until the new capacity exists
    reason: str


def fits(state: ClusterState, gpu_uuid: str, fraction: float, workload: WorkloadRef) -> bool:
    return state.free(gpu_uuid, excluding=workload) + EPSILON >= fraction


def plan_resize(state: ClusterState, decision: FractionDecision) -> ResizePlan:
    wl, new = decision.workload, decision.new_fraction
    current = state.placement(wl)
    if current is None:
        return ResizePlan(
            kind=PlanKind.NONE,
            workload=wl,
            fraction_before=None,
            fraction_after=new,
            reason=f"{wl.display} has no pod in the cluster",
        )
    base = {
        "workload": wl,
        "fraction_before": current.fraction,
        "fraction_after": new,
        "gpu_before": current.gpu_uuid,
    }
    if fits(state, current.gpu_uuid, new, wl):
        return ResizePlan(
            kind=PlanKind.IN_PLACE,
            gpu_after=current.gpu_uuid,
            **base,
            reason=f"{new:g} fits on its GPU {current.gpu_uuid} "
            f"({state.free(current.gpu_uuid, wl):g} free without it)",
        )
    candidates = [
        g for g in state.gpus if g.uuid != current.gpu_uuid and fits(state, g.uuid, new, wl)
    ]
    if candidates:
        best = min(candidates, key=lambda g: (state.free(g.uuid, wl), g.uuid))
        return ResizePlan(
            kind=PlanKind.RECREATE_ELSEWHERE,
            gpu_after=best.uuid,
            **base,
            reason=f"{new:g} does not fit on {current.gpu_uuid} "
            f"({state.free(current.gpu_uuid, wl):g} free without it); "
            f"best fit is {best.uuid} on {best.node} ({state.free(best.uuid, wl):g} free)",
        )
    return ResizePlan(
        kind=PlanKind.SCALE_UP,
        **base,
        reason=f"{new:g} fits on no GPU (largest hole "
        f"{max((state.free(g.uuid, wl) for g in state.gpus), default=0.0):g}); "
        "capacity must be added before the pod moves",
    )


def apply_plan(state: ClusterState, plan: ResizePlan, pod: str | None = None) -> ClusterState:
    """The cluster after the plan; ``plan.gpu_after`` must name an existing GPU."""
    if plan.kind is PlanKind.NONE or not plan.gpu_after:
        return state
    if state.gpu(plan.gpu_after) is None:
        raise ValueError(f"plan targets unknown GPU {plan.gpu_after}")
    placements = []
    for p in state.placements:
        if p.workload.key == plan.workload.key:
            p = p.model_copy(
                update={
                    "gpu_uuid": plan.gpu_after,
                    "fraction": plan.fraction_after,
                    "pod": pod or p.pod,
                }
            )
        placements.append(p)
    return state.model_copy(update={"placements": tuple(placements)})


def add_node(state: ClusterState, node: str, gpus: int, memory_bytes: int) -> ClusterState:
    new = tuple(
        Gpu(uuid=f"GPU-{node}-{i}", node=node, memory_bytes=memory_bytes) for i in range(gpus)
    )
    return state.model_copy(update={"gpus": state.gpus + new})
