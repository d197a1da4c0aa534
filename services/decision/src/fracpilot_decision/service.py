"""The decision service: a thin NATS adapter around the pure engine.

It consumes usage samples with a durable consumer, keeps each workload's history in memory,
publishes a decision when the engine asks for a change, and only then acknowledges the sample,
so a crash loses no sample; decision ids are deterministic, so a redelivered sample cannot
cause a second, different action. The cluster-default policy is read from the policy KV
bucket, falling back to the documented defaults.
"""

from __future__ import annotations

import json
import logging

from nats.aio.msg import Msg
from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter, Gauge
from pydantic import Field, ValidationError

from fracpilot_decision.engine import WorkloadHistory, decide
from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy, PolicyScope, UsageSample
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "decision"


class DecisionSettings(ServiceSettings):
    policy_json: str | None = Field(
        default=None, description="cluster-default policy as JSON, used when the KV has none"
    )


class DecisionService:
    def __init__(self, settings: DecisionSettings, span_processor: SpanProcessor | None = None):
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.histories: dict[str, WorkloadHistory] = {}
        self.policy = Policy()
        reg = self.runtime.registry
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
        self.policy = await self._load_policy()
        await self.runtime.bus.consume(
            stream=subjects.USAGE_STREAM,
            durable=subjects.DECISION_CONSUMER,
            filter_subject=f"{subjects.USAGE_PREFIX}.>",
            model=UsageSample,
            handler=self.on_sample,
        )

    async def _load_policy(self) -> Policy:
        if self.settings.policy_json:
            return Policy.model_validate_json(self.settings.policy_json)
        kv = await self.runtime.bus.kv(subjects.POLICY_BUCKET)
        try:
            entry = await kv.get(PolicyScope().key)
        except Exception:  # no cluster policy stored yet
            return Policy()
        try:
            return Policy.model_validate_json(entry.value or b"")
        except (ValidationError, json.JSONDecodeError) as exc:
            log.error("stored cluster policy is invalid, using defaults", extra={"error": str(exc)})
            return Policy()

    async def on_sample(self, sample: UsageSample, _msg: Msg) -> None:
        key = sample.workload.key
        history, decision = decide(self.histories.get(key, WorkloadHistory()), sample, self.policy)
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
                },
            )
        self.histories[key] = history
        self.samples.inc()
        self.workloads.set(len(self.histories))

    async def run(self) -> None:
        await self.runtime.run(self.start)


def main() -> None:
    import asyncio

    from fracpilot_libs.telemetry import setup_logging

    settings = DecisionSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(DecisionService(settings).run())


if __name__ == "__main__":
    main()
