"""What the judge (:mod:`.judge`) answers: a plan the guardrails let through
(:class:`ActuationPlan`, what :mod:`.executor` carries out) or a :class:`Skip`, and the
:class:`~fracpilot_actuator.actuation.Actuation` either reports. Pure data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.card_plan import Redivision
from fracpilot_actuator.kube.enforcement import Enforcement, enforced_after
from fracpilot_actuator.kube.inventory import Inventory, PodInfo
from fracpilot_libs.contracts import FractionDecision, GpuSharing, Outcome, PlanKind, WorkloadTarget
from fracpilot_libs.placement.planner import ResizePlan, WorkloadPlan


@dataclass(frozen=True)
class PodWarning:
    """A Warning event to leave on a pod (why its decision could not be planned)."""

    pod: PodInfo
    reason: str
    message: str


@dataclass(frozen=True)
class Skip:
    """Nothing to do in the cluster: the answer as it is."""

    actuation: Actuation
    disruptive: bool = False  # the plan that was not carried out would have disrupted
    warnings: tuple[PodWarning, ...] = ()


@dataclass(frozen=True)
class ActuationPlan:
    """A plan the guardrails let through: what the executor carries out."""

    decision: FractionDecision
    plan: WorkloadPlan
    gpu_backend: GpuSharing  # the kind of share the workload's pods hold
    primary: ResizePlan | None  # the step the result reports
    inventory: Inventory
    memory_mib: int  # the new share in MiB of the workload's GPUs
    disruptive: bool
    resuming: bool = False
    enforcement: Mapping[str, Enforcement] = field(default_factory=dict)  # by pod name
    redivision: tuple[Redivision, ...] = ()  # co-tenants re-divided in place (shared isolation)

    def target(self, now: datetime) -> WorkloadTarget:
        """The workload's target, recorded before any pod is touched."""
        d = self.decision
        return WorkloadTarget(
            workload=d.workload,
            fraction=d.new_fraction,
            memory_mib=self.memory_mib,
            backend=self.gpu_backend,
            decision_id=d.decision_id,
            updated_at=now,
        )

    def result(self, outcome: Outcome, detail: str, error: str | None = None) -> Actuation:
        done = actuation_of(self.inventory, self.plan.kind, self.primary, outcome, detail, error)
        if self.primary is None or (e := self.enforcement.get(self.primary.pod)) is None:
            return done
        applied = outcome is Outcome.APPLIED
        return replace(done, enforced_fraction=enforced_after(self.primary, e, applied))


Judgement = ActuationPlan | Skip


def actuation_of(
    inventory: Inventory,
    kind: PlanKind,
    step: ResizePlan | None,
    outcome: Outcome,
    detail: str,
    error: str | None = None,
) -> Actuation:
    """The answer for a plan of ``kind`` reported by its ``step``."""
    if step is None:
        return Actuation(plan=kind, outcome=outcome, detail=detail, error=error)
    applied = outcome is Outcome.APPLIED
    return Actuation(
        plan=kind,
        outcome=outcome,
        detail=detail,
        fraction_before=step.fraction_before,
        fraction_after=step.fraction_after if applied else step.fraction_before,
        node_before=inventory.gpu_node(step.gpu_before),
        node_after=inventory.gpu_node(step.gpu_after),
        gpu_before=step.gpu_before,
        gpu_after=step.gpu_after,
        error=error,
    )
