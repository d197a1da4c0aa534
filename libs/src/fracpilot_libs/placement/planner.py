"""The placement planner: a pure function from the cluster's GPU picture and a decision to a plan.

1. in place: the new fraction fits on the pod's current GPU;
2. recreate elsewhere: it fits on another GPU (best fit: the fullest GPU that still fits, so
   large holes stay free for large requests);
3. scale up: it fits nowhere, so capacity must be added first (make before break).

:func:`plan_resize` plans for a workload with one placement (the simulated cluster);
:func:`plan_workload` plans for each pod of a workload with several replicas, one after the
other on the cluster as the earlier steps leave it, and can be told that the backend cannot
change a running pod (HAMi), so that even a fit on the pod's own GPU is a recreate, and be
given the backend's own fit rule (:data:`FitRule`; HAMi's is
:func:`fracpilot_libs.hami.placement.hami_fit`) instead of "the free share holds it", and
which nodes a recreated pod may go to (:data:`NodeOk`, :data:`NodeOkFor`; kube-scheduler's
predicates are :mod:`fracpilot_libs.placement.predicates`): without, every node may.
No I/O: the backend that executes the plan (the actuator's simulated cluster or Kubernetes)
lives in the actuator; ``fracpilot replay --pack`` (:mod:`fracpilot_libs.analysis.packing`) runs
the same plans on a replayed cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fracpilot_libs.contracts import Allocation, FractionDecision, PlanKind, WorkloadRef

# Fractions are sums of grid steps; float sums need a tolerance when compared to 1.0.
EPSILON = 1e-9


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Gpu(_Frozen):
    uuid: str
    node: str
    memory_bytes: int = Field(gt=0)
    # What HAMi registers for the GPU (hami.io/node-nvidia-register); None: not a HAMi GPU.
    slots: int | None = Field(default=None, ge=0)  # how many pods may share it
    cores: int = Field(default=100, ge=0)  # devcore
    healthy: bool = True
    type: str = ""


class Placement(_Frozen):
    workload: WorkloadRef
    pod: str
    gpu_uuid: str
    fraction: float = Field(gt=0, le=1)
    # What the backend says the pod holds, when it says (HAMi's allocated annotation); None:
    # derived from the fraction (a planned step holds what fracpilot writes for it).
    memory_mib: int | None = Field(default=None, ge=0)
    cores: int | None = Field(default=None, ge=0)

    @property
    def pod_key(self) -> str:
        """``namespace/pod``: pod names are unique only within a namespace."""
        return f"{self.workload.namespace}/{self.pod}"


class ClusterState(_Frozen):
    """Every GPU and which workload holds how much of it."""

    gpus: tuple[Gpu, ...] = ()
    placements: tuple[Placement, ...] = ()

    def placement(self, workload: WorkloadRef) -> Placement | None:
        return next((p for p in self.placements if p.workload.key == workload.key), None)

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def used(
        self,
        gpu_uuid: str,
        excluding: WorkloadRef | None = None,
        excluding_pod: str | None = None,
    ) -> float:
        """The share of the GPU held, leaving out a whole workload or one pod (``pod_key``)."""
        skip = excluding.key if excluding else None
        return sum(
            p.fraction
            for p in self.placements
            if p.gpu_uuid == gpu_uuid and p.workload.key != skip and p.pod_key != excluding_pod
        )

    def free(
        self,
        gpu_uuid: str,
        excluding: WorkloadRef | None = None,
        excluding_pod: str | None = None,
    ) -> float:
        return 1.0 - self.used(gpu_uuid, excluding, excluding_pod)

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
    pod: str = ""  # the pod this step is for (plan_workload); empty for a workload-level plan


def fits(state: ClusterState, gpu_uuid: str, fraction: float, workload: WorkloadRef) -> bool:
    return state.free(gpu_uuid, excluding=workload) + EPSILON >= fraction


FitRule = Callable[[ClusterState, str, float, str], bool]
"""Whether ``fraction`` fits on GPU ``uuid`` without the pod ``namespace/name`` (its own share
is being planned): ``rule(state, uuid, fraction, pod_key)``."""


NodeOk = Callable[[str], str | None]
"""Why the pod being planned may not be recreated on node ``name`` (None: it may). A fit on
the pod's own GPU, changed in place, does not ask: the pod stays where it is."""

NodeOkFor = Callable[["Placement", "ClusterState"], NodeOk | None]
"""The :data:`NodeOk` for one pod of a workload, on the cluster as the earlier steps of its
plan left it; None: every node."""


def share_fits(state: ClusterState, gpu_uuid: str, fraction: float, pod_key: str) -> bool:
    """The default rule: the GPU's free share, without the pod, holds the fraction."""
    return state.free(gpu_uuid, excluding_pod=pod_key) + EPSILON >= fraction


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
    base: dict[str, Any] = {
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
    return move_or_scale_up(state, current.gpu_uuid, new, base, lambda g: state.free(g, wl))


def move_or_scale_up(
    state: ClusterState,
    gpu: str,
    fraction: float,
    base: dict[str, Any],
    free: Callable[[str], float],
    fit_on: Callable[[str], bool] | None = None,
    node_ok: NodeOk | None = None,
) -> ResizePlan:
    """The plan for a share that does not fit on its GPU: recreate it on the best-fitting other
    GPU (the least free that holds it), or, where none holds it, wait for capacity.
    ``free(uuid)`` is a GPU's free share without the share being planned; ``fit_on(uuid)``,
    when given, decides whether it fits there (else the free share must hold it); ``node_ok``,
    when given, which nodes the recreated pod may go to."""

    def holds(uuid: str) -> bool:
        return fit_on(uuid) if fit_on is not None else free(uuid) + EPSILON >= fraction

    holding = [g for g in state.gpus if g.uuid != gpu and holds(g.uuid)]
    refused: dict[str, str] = {}  # node -> why the pod may not go there
    if node_ok is not None:
        for node in dict.fromkeys(g.node for g in holding):
            if (why := node_ok(node)) is not None:
                refused[node] = why
    candidates = [g for g in holding if g.node not in refused]
    if candidates:
        best = min(candidates, key=lambda g: (free(g.uuid), g.uuid))
        return ResizePlan(
            kind=PlanKind.RECREATE_ELSEWHERE,
            gpu_after=best.uuid,
            **base,
            reason=f"{fraction:g} does not fit on {gpu} ({free(gpu):g} free without it); "
            f"best fit is {best.uuid} on {best.node} ({free(best.uuid):g} free)"
            + (f"; {len(refused)} node(s) with room refused it" if refused else ""),
        )
    if refused:
        return ResizePlan(
            kind=PlanKind.SCALE_UP,
            **base,
            reason=f"{fraction:g} fits nowhere the pod may go: "
            + "; ".join(refused[n] for n in sorted(refused))
            + "; capacity must be added before the pod moves",
        )
    largest = max((free(g.uuid) for g in state.gpus), default=0.0)
    return ResizePlan(
        kind=PlanKind.SCALE_UP,
        **base,
        reason=f"{fraction:g} fits on no GPU (largest hole {largest:g}); "
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
                    "memory_mib": None,
                    "cores": None,
                }
            )
        placements.append(p)
    return state.model_copy(update={"placements": tuple(placements)})


def add_node(state: ClusterState, node: str, gpus: int, memory_bytes: int) -> ClusterState:
    new = tuple(
        Gpu(uuid=f"GPU-{node}-{i}", node=node, memory_bytes=memory_bytes) for i in range(gpus)
    )
    return state.model_copy(update={"gpus": state.gpus + new})


# --- per pod, for workloads with replicas ----------------------------------------------------

# How disruptive a plan is: a workload's plan is as disruptive as its most disruptive step.
SEVERITY = {
    PlanKind.NONE: 0,
    PlanKind.IN_PLACE: 1,
    PlanKind.RECREATE_ELSEWHERE: 2,
    PlanKind.SCALE_UP: 3,
}


class WorkloadPlan(_Frozen):
    """One step per pod of the workload, and the workload's plan kind (the most disruptive)."""

    kind: PlanKind
    workload: WorkloadRef
    steps: tuple[ResizePlan, ...]
    reason: str

    @property
    def disruptive(self) -> bool:
        """True when a pod is evicted (now, or once new capacity exists)."""
        return self.kind in (PlanKind.RECREATE_ELSEWHERE, PlanKind.SCALE_UP)

    def steps_of(self, *kinds: PlanKind) -> tuple[ResizePlan, ...]:
        return tuple(s for s in self.steps if s.kind in kinds)


def plan_pod(
    state: ClusterState,
    placement: Placement,
    new_fraction: float,
    *,
    in_place: bool = True,
    fit: FitRule = share_fits,
    node_ok: NodeOk | None = None,
) -> ResizePlan:
    """The plan for one pod; ``in_place=False`` when the backend cannot change a running pod;
    ``fit`` is the backend's rule for whether a share fits on a GPU; ``node_ok`` which nodes
    a recreated pod may go to (None: any).

    Without in-place changes a fit on the pod's own GPU is still a recreate (the scheduler
    may put the new pod back on it), reported as ``recreate_elsewhere`` with that GPU, unless
    its node no longer admits a new pod (a taint or label changed since).
    """
    wl, key, gpu = placement.workload, placement.pod_key, placement.gpu_uuid
    base: dict[str, Any] = {
        "workload": wl,
        "pod": placement.pod,
        "fraction_before": placement.fraction,
        "fraction_after": new_fraction,
        "gpu_before": gpu,
    }
    if abs(placement.fraction - new_fraction) <= EPSILON:
        return ResizePlan(
            kind=PlanKind.NONE,
            gpu_after=gpu,
            **base,
            reason=f"{placement.pod} already holds {new_fraction:g}",
        )
    here = state.free(gpu, excluding_pod=key)
    own = state.gpu(gpu)
    refused_here = (
        node_ok(own.node) if node_ok is not None and own is not None and not in_place else None
    )
    if fit(state, gpu, new_fraction, key) and refused_here is None:
        if in_place:
            return ResizePlan(
                kind=PlanKind.IN_PLACE,
                gpu_after=gpu,
                **base,
                reason=f"{new_fraction:g} fits on its GPU {gpu} ({here:g} free without it)",
            )
        return ResizePlan(
            kind=PlanKind.RECREATE_ELSEWHERE,
            gpu_after=gpu,
            **base,
            reason=f"{new_fraction:g} fits on its GPU {gpu} ({here:g} free without it), but "
            "the backend cannot change a running pod: recreate it",
        )
    plan = move_or_scale_up(
        state,
        gpu,
        new_fraction,
        base,
        lambda g: state.free(g, excluding_pod=key),
        lambda g: fit(state, g, new_fraction, key),
        node_ok,
    )
    if refused_here is not None and fit(state, gpu, new_fraction, key):
        plan = plan.model_copy(
            update={
                "reason": f"its own GPU {gpu} holds {new_fraction:g}, "
                f"but {refused_here}; {plan.reason}"
            }
        )
    return plan


def apply_pod_plan(state: ClusterState, step: ResizePlan) -> ClusterState:
    """The cluster after one pod's step (a scale-up step changes nothing yet)."""
    if step.kind in (PlanKind.NONE, PlanKind.SCALE_UP) or not step.gpu_after:
        return state
    key = f"{step.workload.namespace}/{step.pod}"
    moved = {"gpu_uuid": step.gpu_after, "fraction": step.fraction_after}
    placements = tuple(
        p.model_copy(update={**moved, "memory_mib": None, "cores": None}) if p.pod_key == key else p
        for p in state.placements
    )
    return state.model_copy(update={"placements": placements})


def plan_workload(
    state: ClusterState,
    workload: WorkloadRef,
    pods: tuple[Placement, ...],
    new_fraction: float,
    *,
    in_place: bool = True,
    fit: FitRule = share_fits,
    node_ok_for: NodeOkFor | None = None,
) -> WorkloadPlan:
    """Plan each pod in turn on the cluster as the earlier steps leave it (``fit``: the
    backend's fit rule, as :func:`plan_pod`; ``node_ok_for``: which nodes each pod's
    replacement may go to, on that cluster).

    Two scale-up steps each count on a GPU of their own (one whole-GPU placeholder each):
    that may ask for more than a perfect packing would, never for less.
    """
    if not pods:
        return WorkloadPlan(
            kind=PlanKind.NONE,
            workload=workload,
            steps=(),
            reason=f"{workload.display} has no pod holding a GPU share",
        )
    steps: list[ResizePlan] = []
    for placement in pods:
        node_ok = node_ok_for(placement, state) if node_ok_for is not None else None
        step = plan_pod(state, placement, new_fraction, in_place=in_place, fit=fit, node_ok=node_ok)
        steps.append(step)
        state = apply_pod_plan(state, step)
    kind = max((s.kind for s in steps), key=SEVERITY.__getitem__)
    if len(steps) == 1:
        reason = steps[0].reason
    else:
        reason = "; ".join(f"{s.pod}: {s.kind.value}: {s.reason}" for s in steps)
    return WorkloadPlan(kind=kind, workload=workload, steps=tuple(steps), reason=reason)


def allocation_for(
    workload: WorkloadRef, pod: str, gpu: Gpu, fraction: float, now: datetime
) -> Allocation:
    """What the allocations bucket says about a workload (ingest reads it for attribution)."""
    return Allocation(
        workload=workload,
        pod=pod,
        node=gpu.node,
        gpu_uuid=gpu.uuid,
        fraction=fraction,
        device_memory_bytes=gpu.memory_bytes,
        updated_at=now,
    )
