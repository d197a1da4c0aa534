"""The decision service: a thin NATS adapter around the pure engine.

It consumes usage samples with a durable consumer, keeps each workload's history in memory,
publishes a decision when the engine asks for a change, and only then acknowledges the sample,
so a crash loses no sample; decision ids are deterministic, so a redelivered sample cannot
cause a second, different action.

Each sample is decided with the effective policy for its workload (see
:mod:`fracpilot_decision.policy_store`), followed live from the policy KV bucket; the service
also answers the policy set/get/list requests. Workload states are checkpointed to KV and
restored on start (see :mod:`fracpilot_decision.checkpoints`).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter, Gauge
from pydantic import Field

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.engine import WorkloadState, decide
from fracpilot_decision.policy_store import LivePolicies, PolicyStore
from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy, PolicyLevel, UsageSample
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "decision"


class DecisionSettings(ServiceSettings):
    policy_json: str | None = Field(
        default=None,
        description="cluster-default policy as JSON, used when the policy bucket has no "
        "cluster policy",
    )
    checkpoint_interval_s: float = Field(
        default=5.0, gt=0, description="how often changed workload states are checkpointed"
    )


def cluster_default(settings: DecisionSettings) -> Policy:
    """The policy behind every stored one: FRACPILOT_POLICY_JSON, else the built-in defaults."""
    if not settings.policy_json:
        return Policy()
    policy = Policy.model_validate_json(settings.policy_json)
    if policy.scope.level is not PolicyLevel.CLUSTER:
        raise ValueError("FRACPILOT_POLICY_JSON must be a cluster-scope policy")
    return policy


class DecisionService:
    def __init__(self, settings: DecisionSettings, span_processor: SpanProcessor | None = None):
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.histories: dict[str, WorkloadState] = {}  # by subjects.kv_key(workload)
        self.policies = LivePolicies(cluster_default(settings))
        self.store: PolicyStore | None = None
        reg = self.runtime.registry
        self.checkpoints = Checkpointer(self.runtime.bus, reg, settings.checkpoint_interval_s)
        self.samples = Counter(
            "fracpilot_decision_samples_total", "Samples decided on", registry=reg
        )
        self.decisions = Counter(
            "fracpilot_decision_decisions_total",
            "Decisions published",
            ["direction", "reason"],
            registry=reg,
        )
        self.workloads = Gauge(
            "fracpilot_decision_workloads", "Workloads with history", registry=reg
        )

    async def start(self) -> None:
        bus = self.runtime.bus
        # History and policies first, so the first sample is decided as before the restart.
        self.histories.update(await self.checkpoints.restore())
        self.workloads.set(len(self.histories))
        self.checkpoints.start(self.histories)
        policies_loaded = await bus.watch_kv(subjects.POLICY_BUCKET, Policy, self._on_policy_change)
        try:
            await asyncio.wait_for(policies_loaded.wait(), timeout=30)
        except TimeoutError:
            log.warning("stored policies not all loaded in time, starting anyway")
        self.store = await PolicyStore.open(bus, self.policies.default, self.policies.apply)
        await self.store.serve()
        await bus.consume(
            stream=subjects.USAGE_STREAM,
            durable=subjects.DECISION_CONSUMER,
            filter_subject=f"{subjects.USAGE_PREFIX}.>",
            model=UsageSample,
            handler=self.on_sample,
        )

    async def stop(self) -> None:
        """Called after the consumers stopped: write the last checkpoint."""
        await self.checkpoints.stop(self.histories)

    async def _on_policy_change(self, key: str, policy: Policy | None) -> None:
        self.policies.apply(key, policy)
        log.info(
            "policy changed" if policy is not None else "policy removed",
            extra={"scope": key, "revision": policy.revision if policy else None},
        )

    async def on_sample(self, sample: UsageSample, _msg: Msg) -> None:
        key = subjects.kv_key(sample.workload)
        policy = self.policies.for_workload(sample.workload)
        history, decision = decide(self.histories.get(key, WorkloadState()), sample, policy)
        if decision is not None:
            # Publish before the new history is kept: if publishing fails, the sample is
            # redelivered and decided again from the old history, with the same decision id.
            await self.runtime.bus.publish(
                subjects.decision_subject(decision.workload), decision, decision.decision_id
            )
            self.decisions.labels(decision.direction.value, decision.reason.value).inc()
            log.info(
                "decision",
                extra={
                    "workload": sample.workload.display,
                    "from": decision.current_fraction,
                    "to": decision.new_fraction,
                    "reason": decision.reason.value,
                    "decision_id": decision.decision_id,
                    "policy_scope": policy.scope.key,
                    "policy_revision": policy.revision,
                },
            )
        self.histories[key] = history
        self.checkpoints.mark(key)
        self.samples.inc()
        self.workloads.set(len(self.histories))

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = DecisionSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(DecisionService(settings).run())


if __name__ == "__main__":
    main()
