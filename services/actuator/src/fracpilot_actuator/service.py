"""The actuator service: a thin NATS adapter that turns decisions into cluster changes.

For each decision it claims the decision id in KV before acting (so a redelivered or
republished decision is applied at most once), plans with the pure planner, executes the plan
on the backend, and publishes an ``ActuationResult`` saying what it did and why. Recommend-mode
decisions and dry-run are recorded without changing anything.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter
from pydantic import Field

from fracpilot_actuator.planner import ResizePlan, plan_resize
from fracpilot_actuator.simulated_cluster import SimulatedCluster, parse_seed_pods, seed_cluster
from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    FractionDecision,
    Mode,
    Outcome,
    PlanKind,
    utcnow,
)
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "actuator"
GIB = 1024**3


class ActuatorSettings(ServiceSettings):
    backend: str = Field(default="simulated", description="cluster backend: simulated")
    dry_run: bool = Field(default=False, description="plan and log, change nothing")
    sim_cluster: str = "demo"
    sim_nodes: int = Field(default=2, ge=0)
    sim_gpus_per_node: int = Field(default=2, ge=1)
    sim_gpu_memory_gib: int = Field(default=80, ge=1)
    sim_pods: str = Field(default="", description="seed pods: ns/name=fraction,...")


class ActuatorService:
    def __init__(self, settings: ActuatorSettings, span_processor: SpanProcessor | None = None):
        if settings.backend != "simulated":
            raise ValueError(f"unknown backend {settings.backend!r}; this build has: simulated")
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.cluster: SimulatedCluster | None = None
        self._claims: KeyValue | None = None
        self._lock = asyncio.Lock()
        self.actions = Counter(
            "fracpilot_actuator_actions_total",
            "Decisions handled",
            ["plan", "outcome"],
            registry=self.runtime.registry,
        )

    async def start(self) -> None:
        bus, s = self.runtime.bus, self.settings
        self._claims = await bus.kv(subjects.ACTUATOR_STATE_BUCKET)
        self.cluster = SimulatedCluster(
            self._claims,
            await bus.kv(subjects.ALLOCATION_BUCKET),
            s.sim_gpus_per_node,
            s.sim_gpu_memory_gib * GIB,
        )
        seed = seed_cluster(
            s.sim_nodes,
            s.sim_gpus_per_node,
            s.sim_gpu_memory_gib * GIB,
            parse_seed_pods(s.sim_pods, s.sim_cluster),
        )
        await self.cluster.load_or_seed(seed)
        await bus.consume(
            stream=subjects.DECISION_STREAM,
            durable=subjects.ACTUATOR_CONSUMER,
            filter_subject=f"{subjects.DECISION_PREFIX}.>",
            model=FractionDecision,
            handler=self.on_decision,
        )

    async def on_decision(self, decision: FractionDecision, _msg: Msg) -> None:
        async with self._lock:  # never two actions in flight
            await self._handle(decision)

    async def _claim(self, decision: FractionDecision) -> str | None:
        """Record the decision before acting; returns the earlier record if there is one."""
        assert self._claims is not None
        key = f"decision.{decision.decision_id}"
        try:
            await self._claims.create(key, b"started")
            return None
        except KeyWrongLastSequenceError:
            entry = await self._claims.get(key)
            return (entry.value or b"").decode()

    async def _handle(self, decision: FractionDecision) -> None:
        assert self.cluster is not None
        assert self._claims is not None
        earlier = await self._claim(decision)
        if earlier is not None and earlier.startswith("done"):
            log.info(
                "decision already handled",
                extra={"decision_id": decision.decision_id, "record": earlier},
            )
            self.actions.labels("none", "duplicate").inc()
            return
        plan = plan_resize(self.cluster.state, decision)
        if decision.mode is Mode.RECOMMEND or self.settings.dry_run:
            why = "recommend mode" if decision.mode is Mode.RECOMMEND else "dry-run"
            outcome, executed, detail = Outcome.DRY_RUN, plan, f"{why}: would {plan.reason}"
        elif plan.kind is PlanKind.NONE:
            outcome, executed, detail = Outcome.SKIPPED, plan, plan.reason
        else:
            executed = await self.cluster.execute(
                plan, f"{decision.workload.owner_name}-{decision.decision_id[:5]}"
            )
            outcome, detail = Outcome.APPLIED, executed.reason
        await self._claims.put(f"decision.{decision.decision_id}", f"done:{outcome}".encode())
        await self._report(decision, executed, outcome, detail)

    async def _report(
        self, decision: FractionDecision, plan: ResizePlan, outcome: Outcome, detail: str
    ) -> None:
        assert self.cluster is not None
        state = self.cluster.state
        before = state.gpu(plan.gpu_before) if plan.gpu_before else None
        after = state.gpu(plan.gpu_after) if plan.gpu_after else None
        result = ActuationResult(
            decision_id=decision.decision_id,
            workload=decision.workload,
            plan=plan.kind,
            outcome=outcome,
            fraction_before=plan.fraction_before,
            fraction_after=plan.fraction_after
            if outcome is Outcome.APPLIED
            else plan.fraction_before,
            node_before=before.node if before else "",
            node_after=after.node if after else "",
            gpu_before=plan.gpu_before,
            gpu_after=plan.gpu_after,
            detail=detail,
            finished_at=utcnow(),
        )
        await self.runtime.bus.publish(
            subjects.actuation_subject(decision.workload), result, f"{decision.decision_id}:result"
        )
        self.actions.labels(plan.kind.value, outcome.value).inc()
        log.info(
            "actuation",
            extra={
                "workload": decision.workload.display,
                "plan": plan.kind.value,
                "outcome": outcome.value,
                "decision_id": decision.decision_id,
                "detail": detail,
            },
        )

    async def run(self) -> None:
        await self.runtime.run(self.start)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = ActuatorSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(ActuatorService(settings).run())


if __name__ == "__main__":
    main()
