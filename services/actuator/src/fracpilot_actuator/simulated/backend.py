"""The simulated cluster as a :class:`~fracpilot_actuator.actuation.ClusterBackend`.

The opt-in rule (:mod:`fracpilot_actuator.opt_in`) holds here as in a real cluster: the simulated
namespaces' labels (``FRACPILOT_SIM_NAMESPACE_LABELS``) say which are in auto mode, so the demo
opts its namespace in as a user would label theirs.

A workload whose server preallocates its memory (the simulation's ``PREALLOCATING``, issue 28)
is downsized by a recreate on its GPU, as the Kubernetes backend does
(:mod:`fracpilot_actuator.kube.preallocation`): its pool does not shrink in place, and the new
pod starts with its flag rewritten for the new fraction.

After each decision, on the simulation's clock (the decision's ``decided_at``): a consolidation
round every ``FRACPILOT_CONSOLIDATION_INTERVAL_S`` (:mod:`.consolidation`, the live planner; its
report and moves published as the Kubernetes backend's are), then the simulated autoscaler's
scale-down (:mod:`.autoscaler`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.opt_in import Automation, automation_of
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_actuator.simulated.cluster import SimulatedCluster
from fracpilot_actuator.simulated.consolidation import automation, simulated_round
from fracpilot_libs.contracts import (
    ConsolidationMode,
    ConsolidationMove,
    FractionDecision,
    MoveState,
    Outcome,
    PlanKind,
    WireModel,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.placement.consolidation_events import consolidation_report, planned_move
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep
from fracpilot_libs.placement.planner import ResizePlan, plan_resize
from fracpilot_libs.simulation.workloads import PREALLOCATING

log = logging.getLogger(__name__)
Publish = Callable[[str, WireModel], Awaitable[object]]  # the bus's publish


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
        consolidation: ConsolidationSettings | None = None,
        publish: Publish | None = None,
        cluster_name: str = "demo",
        preallocating: Collection[str] = frozenset(PREALLOCATING),
    ) -> None:
        """``consolidation``: its mode (off: none), interval and moves per hour, on the
        simulation's clock; ``publish``: where its report and moves go (None: nowhere)."""
        self.cluster = cluster
        self._seed = seed
        self.opt_in = opt_in or OptInSettings()
        self.namespace_labels = dict(namespace_labels or {})
        self.consolidation = consolidation or ConsolidationSettings()
        self.publish = publish
        self.cluster_name = cluster_name
        self.last_round: datetime | None = None
        self.moves: list[datetime] = []  # when the moves of the last simulated hour were made
        self.last_summary = ""
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
        actuation = await self._actuate(decision, dry_run=dry_run, now=now, resumed=resumed)
        try:
            await self.after_decision(decision.decided_at)
        except Exception:  # the decision's result stands; the next decision tries again
            log.exception("simulated consolidation or autoscaling failed")
        return actuation

    async def _actuate(
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
            decision.decided_at,
        )
        return self._actuation(executed, Outcome.APPLIED, executed.reason)

    async def after_decision(self, now: datetime) -> None:
        """Consolidation (every interval) and the autoscaler, at ``now`` on the simulation's
        clock."""
        settings = self.consolidation
        due = self.last_round is None or now - self.last_round >= timedelta(
            seconds=settings.interval_s
        )
        if settings.mode != "off" and due:
            self.last_round = now
            await self._consolidate(now)
        await self.cluster.autoscale(now)

    async def _consolidate(self, now: datetime) -> None:
        self.moves = [t for t in self.moves if now - t < timedelta(hours=1)]

        def new_pod(step: ConsolidationStep, n: int) -> str:
            return f"{step.placement.workload.owner_name}-m{now:%H%M}{n}"

        labels, opt_in = self.namespace_labels, self.opt_in
        done = simulated_round(
            self.cluster.state,
            self.consolidation,
            lambda w: automation(w, labels, opt_in),
            self.moves,
            now,
            new_pod,
        )
        summary = done.would.summary()
        if summary != self.last_summary:  # reported when it changes, not every round
            self.last_summary = summary
            auto = self.consolidation.mode == "auto"
            mode = ConsolidationMode.AUTO if auto else ConsolidationMode.RECOMMEND
            report = consolidation_report(done.would, cluster=self.cluster_name, mode=mode, at=now)
            await self._send(subjects.consolidation_report_subject(self.cluster_name), report)
        if not done.moved:
            return
        before = self.cluster.state
        await self.cluster.replace_state(
            done.state, [m.step.placement.workload for m in done.moved]
        )
        for moved in done.moved:
            self.moves.append(now)
            step = moved.step
            target = done.state.gpu(step.to_gpu)
            for state in (MoveState.STARTED, MoveState.VERIFIED):
                verified = state is MoveState.VERIFIED
                await self._moved(
                    state,
                    step.from_node,
                    now,
                    step=step,
                    new_pod=moved.new_pod if verified else "",
                    to_node=(target.node if target else "") if verified else "",
                    detail=step.reason,
                )
        for node in done.freed_nodes:
            gpus = sum(1 for g in before.gpus if g.node == node)
            log.info("consolidation freed a node", extra={"node": node, "gpus": gpus})
            await self._moved(
                MoveState.FREED,
                node,
                now,
                freed_node=node,
                freed_gpus=gpus,
                detail=f"node {node} emptied of GPU pods by consolidation",
            )

    async def _moved(
        self,
        state: MoveState,
        node: str,
        now: datetime,
        step: ConsolidationStep | None = None,
        **result: str | int,
    ) -> None:
        event = ConsolidationMove.model_validate(
            {
                "cluster": self.cluster_name,
                "state": state,
                "node": node,
                "move": planned_move(step) if step is not None else None,
                "at": now,
                **result,
            }
        )
        await self._send(subjects.consolidation_move_subject(self.cluster_name), event)

    async def _send(self, subject: str, message: WireModel) -> None:
        if self.publish is None:
            return
        try:
            await self.publish(subject, message)
        except Exception as exc:  # a view: the simulation carries on
            log.warning(
                "consolidation event not published",
                extra={"subject": subject, "error": str(exc)[:300]},
            )

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
