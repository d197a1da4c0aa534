"""What a cluster backend does with a decision, and the simulated cluster as a backend.

A backend turns one decision into an :class:`Actuation` (the plan it chose, what happened,
where the pod was and goes); the service claims the decision, calls the backend and
publishes the ``ActuationResult``. A backend whose action finishes later (a scale-up waits
for capacity) reports the end through the ``report`` callback it was given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from fracpilot_actuator.planner import ResizePlan, plan_resize
from fracpilot_actuator.simulated_cluster import SimulatedCluster
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind


@dataclass(frozen=True)
class Actuation:
    plan: PlanKind
    outcome: Outcome
    detail: str
    fraction_before: float | None = None
    fraction_after: float | None = None  # the fraction the pods hold once this is done
    node_before: str = ""
    node_after: str = ""
    gpu_before: str = ""
    gpu_after: str = ""
    error: str | None = None


Report = Callable[[FractionDecision, Actuation], Awaitable[None]]
"""Publishes an actuation that finished after ``actuate`` returned (a scale-up's eviction)."""


class ClusterBackend(Protocol):
    async def start(self) -> None: ...

    async def actuate(
        self, decision: FractionDecision, *, dry_run: str, now: datetime, resumed: bool = False
    ) -> Actuation:
        """Plan and act; with ``dry_run`` (why: "dry-run", "recommend mode") change nothing.

        ``resumed``: an earlier attempt at this decision started and never finished (the
        actuator stopped in the middle): finish what is left, never repeat what was done."""

    async def reconcile(self, now: datetime) -> None:
        """Carry on with actions that wait for something (capacity); called periodically."""


class SimulatedBackend:
    """The demo's cluster: plans with :func:`plan_resize` and executes on the simulation."""

    def __init__(self, cluster: SimulatedCluster, seed: Callable[[], Awaitable[None]]) -> None:
        self.cluster = cluster
        self._seed = seed

    async def start(self) -> None:
        await self._seed()

    async def reconcile(self, now: datetime) -> None:
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
        plan = plan_resize(self.cluster.state, decision)
        if dry_run:
            return self._actuation(plan, Outcome.DRY_RUN, f"{dry_run}: would {plan.reason}")
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
