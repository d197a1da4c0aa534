"""The simulated cluster as a :class:`~fracpilot_actuator.actuation.ClusterBackend`.

The opt-in rule (:mod:`fracpilot_actuator.opt_in`) holds here as in a real cluster: the simulated
namespaces' labels (``FRACPILOT_SIM_NAMESPACE_LABELS``) say which are in auto mode, so the demo
opts its namespace in as a user would label theirs.

A workload whose server preallocates its memory (the simulation's ``PREALLOCATING``, issue 28)
is downsized by a recreate on its GPU, as the Kubernetes backend does
(:mod:`fracpilot_actuator.kube.preallocation`): its pool does not shrink in place, and the new
pod starts with its flag rewritten for the new fraction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from datetime import datetime

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.opt_in import Automation, automation_of
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.simulated.cluster import SimulatedCluster
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind
from fracpilot_libs.placement.planner import ResizePlan, plan_resize
from fracpilot_libs.simulation.workloads import PREALLOCATING


def preallocated_plan(plan: ResizePlan, preallocating: Collection[str]) -> ResizePlan:
    """The plan, with an in-place downsize of a workload in ``preallocating`` (owner names)
    made a recreate on its GPU (see the module docstring)."""
    before = plan.fraction_before
    if (
        plan.kind is not PlanKind.IN_PLACE
        or before is None
        or plan.fraction_after >= before
        or plan.workload.owner_name not in preallocating
    ):
        return plan
    return plan.model_copy(
        update={
            "kind": PlanKind.RECREATE_ELSEWHERE,
            "reason": f"{plan.reason}, but its LLM server preallocated its memory and its pool "
            "does not shrink in place: recreated with its memory flag rewritten",
        }
    )


class SimulatedBackend:
    """The demo's cluster: plans with :func:`plan_resize` and executes on the simulation."""

    def __init__(
        self,
        cluster: SimulatedCluster,
        seed: Callable[[], Awaitable[None]],
        opt_in: OptInSettings | None = None,
        namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
        preallocating: Collection[str] = frozenset(PREALLOCATING),
    ) -> None:
        self.cluster = cluster
        self._seed = seed
        self.opt_in = opt_in or OptInSettings()
        self.namespace_labels = dict(namespace_labels or {})
        self.preallocating = frozenset(preallocating)  # workloads' owner names

    async def start(self, now: datetime | None = None) -> None:
        await self._seed()

    async def resume(self, now: datetime) -> None:
        return None  # nothing waits: every action ends at once

    async def reconcile(self, now: datetime) -> None:
        return None

    def close(self) -> None:
        return None

    async def actuate(
        self, decision: FractionDecision, *, dry_run: str, now: datetime, resumed: bool = False
    ) -> Actuation:
        if resumed and self.cluster.has_applied(decision.decision_id):
            placement = self.cluster.state.placement(decision.workload)
            gpu = self.cluster.state.gpu(placement.gpu_uuid) if placement else None
            return Actuation(
                plan=PlanKind.NONE,
                outcome=Outcome.APPLIED,
                detail="applied by an earlier attempt that stopped before recording it; "
                "not executed again",
                fraction_after=placement.fraction if placement else None,
                node_after=gpu.node if gpu else "",
                gpu_after=placement.gpu_uuid if placement else "",
            )
        wl = decision.workload
        labels = self.namespace_labels.get(wl.namespace, {})
        selected = automation_of(wl.namespace, labels, (), decision.mode, self.opt_in)
        if selected.mode is Automation.OFF:
            detail = f"off: {selected.reason}"
            return Actuation(PlanKind.NONE, Outcome.SKIPPED, detail, held_back="off")
        held_back = "dry_run" if dry_run else selected.held_back
        dry_run = dry_run or ("" if selected.applies else selected.reason)
        plan = preallocated_plan(plan_resize(self.cluster.state, decision), self.preallocating)
        if dry_run:
            would = self._actuation(plan, Outcome.DRY_RUN, f"{dry_run}: would {plan.reason}")
            return replace(would, held_back=held_back)
        if plan.kind is PlanKind.NONE:
            return self._actuation(plan, Outcome.SKIPPED, plan.reason)
        executed = await self.cluster.execute(
            plan,
            f"{decision.workload.owner_name}-{decision.decision_id[:5]}",
            decision.decision_id,
        )
        return self._actuation(executed, Outcome.APPLIED, executed.reason)

    def _actuation(self, plan: ResizePlan, outcome: Outcome, detail: str) -> Actuation:
        state = self.cluster.state
        before = state.gpu(plan.gpu_before) if plan.gpu_before else None
        after = state.gpu(plan.gpu_after) if plan.gpu_after else None
        return Actuation(
            plan=plan.kind,
            outcome=outcome,
            detail=detail,
            fraction_before=plan.fraction_before,
            fraction_after=plan.fraction_after
            if outcome is Outcome.APPLIED
            else plan.fraction_before,
            node_before=before.node if before else "",
            node_after=after.node if after else "",
            gpu_before=plan.gpu_before,
            gpu_after=plan.gpu_after,
        )
