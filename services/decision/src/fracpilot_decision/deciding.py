"""The hot path: a partition's batch of samples decided, decisions published, the rest refused.

Samples are parsed once into the wire model (one that does not parse is dead-lettered as
classified by :func:`fracpilot_libs.nats.decoding.classify`), routed
(:mod:`fracpilot_decision.routing`), and decided by the pure engine with the workload's effective
policy; a decision (only when
the fraction should change) is published, in a span joined to the sample's trace, before the
new history is kept. The batch is then acknowledged all-up-to. Nothing else is awaited per
sample. Each workload's recommendation (:class:`~fracpilot_decision.metrics.RecommendationMetrics`)
is set once per batch, from its last sample, published decision or not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pydantic import ValidationError

from fracpilot_decision.metrics import DecisionMetrics, RecommendationMetrics
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.routing import Route, left_behind_reason, misrouted_reason, route
from fracpilot_libs.contracts import FractionDecision, Policy, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.client_types import Msg
from fracpilot_libs.nats.decoding import ErrorKind, classify
from fracpilot_libs.nats.spans import process_span
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.policies import LivePolicies
from fracpilot_libs.sizing.state import WorkloadState

log = logging.getLogger(__name__)
EXPIRE_EVERY_S = 30.0  # how often stale recommendation series are looked for
_EMPTY = WorkloadState()  # the engine never mutates a state: one empty one serves all


class Decider:
    """Decides the batches of every owned partition."""

    def __init__(
        self,
        bus: Bus,
        policies: LivePolicies,
        metrics: DecisionMetrics,
        *,
        partition_count: int,
        max_unacked: int,
        urge_checkpoint: Callable[[], None],
        recommendations: RecommendationMetrics | None = None,
    ) -> None:
        self.bus = bus
        self.policies = policies
        self.metrics = metrics
        self.recommendations = recommendations
        self._expired_at = 0.0
        self.partition_count = partition_count
        self.max_unacked = max_unacked
        self.urge_checkpoint = urge_checkpoint

    async def handle_batch(self, part: Partition, msgs: list[Msg]) -> None:
        states = part.states
        for_workload = self.policies.for_workload
        kv_key = subjects.kv_key
        stored: list[int] = []  # when each decided sample was stored, ns
        decided = duplicates = 0
        # The last sample of each workload in the batch: (sample, fraction held, new state).
        latest: dict[str, tuple[UsageSample, float, WorkloadState]] = {}
        for msg in msgs:
            seq, stored_ns = subjects.stream_position(msg.reply)
            try:
                sample = UsageSample.model_validate_json(msg.data)
            except ValidationError as exc:
                error = classify(exc)
                await self._refuse(msg, error.kind, error.reason)
                part.handled(msg)
                continue
            wl = sample.workload
            key = kv_key(wl)
            state = states.get(key)
            way = route(msg.subject, wl, state, seq, self.partition_count, part.number)
            if way is Route.MISROUTED:
                await self._refuse(msg, "validation", misrouted_reason(wl, msg.subject))
                part.handled(msg)
                continue
            if way is Route.LEFT_BEHIND:
                reason = left_behind_reason(part.number, self.partition_count)
                await self._refuse(msg, "validation", reason)
                part.handled(msg)
                continue
            if way is Route.DUPLICATE:
                duplicates += 1  # already in the history (delivered again after a move)
                part.handled(msg)
                continue
            policy = for_workload(wl)
            try:
                new, decision = decide(state or _EMPTY, sample, policy, seq)
            except Exception as exc:  # a bug on one sample must not stop the partition
                log.exception("the engine failed on a sample", extra={"subject": msg.subject})
                await self._refuse(msg, "processing", repr(exc)[:2000])
                part.handled(msg)
                continue
            if decision is not None:
                # Published before the new history is kept: if publishing fails, the
                # sample is decided again from the old history, with the same id.
                await self._publish_decision(decision, policy, msg)
            held = sample.allocated_fraction
            if held is None:  # not placed yet: as the engine reads it
                held = (state.current_fraction if state else None) or policy.max_fraction
            latest[key] = (sample, held, new)
            states[key] = new
            part.dirty.add(key)  # not aliased: a checkpoint may swap the set meanwhile
            decided += 1
            stored.append(stored_ns)
            part.handled(msg)
        self.metrics.samples.inc(decided)
        try:  # decided (and any decision published): acknowledged with everything before it
            await msgs[-1].ack()
        except Exception as exc:  # delivered again after the ack wait, recognised by position
            log.warning(
                "acknowledgement failed", extra={"partition": part.number, "error": repr(exc)}
            )
        now_ns = time.time_ns()
        for stored_ns in stored:
            self.metrics.lag.observe((now_ns - stored_ns) / 1e9)
        if self.recommendations is not None:
            self._recommend(latest, now_ns / 1e9)
        if duplicates:
            self.metrics.duplicates.inc(duplicates)
        part.last_sample_at = time.monotonic()
        if part.uncommitted * 2 > self.max_unacked:
            self.urge_checkpoint()

    def _recommend(
        self, latest: dict[str, tuple[UsageSample, float, WorkloadState]], now: float
    ) -> None:
        """What the engine last asked for (the fraction held, when it never asked for a
        change: keeping it is its recommendation)."""
        metrics = self.recommendations
        assert metrics is not None
        for sample, held, new in latest.values():
            wl = sample.workload
            recommended = new.decided_fraction if new.decided_fraction is not None else held
            metrics.set(wl.namespace, wl.owner_name, held, recommended, now)
        if now - self._expired_at >= EXPIRE_EVERY_S:
            self._expired_at = now
            metrics.expire(now)

    async def _publish_decision(self, decision: FractionDecision, policy: Policy, msg: Msg) -> None:
        bus = self.bus
        subject = subjects.decision_subject(decision.workload)
        with process_span(bus.tracer, msg):  # the sample's trace goes on to the decision
            await bus.publish(subject, decision, decision.decision_id)
        self.metrics.decisions.labels(decision.direction.value, decision.reason.value).inc()
        log.info(
            "decision",
            extra={
                "workload": decision.workload.display,
                "from": decision.current_fraction,
                "to": decision.new_fraction,
                "reason": decision.reason.value,
                "decision_id": decision.decision_id,
                "policy_scope": policy.scope.key,
                "policy_revision": policy.revision,
            },
        )

    async def _refuse(self, msg: Msg, kind: ErrorKind, reason: str) -> None:
        await self.bus.dead_letter(msg.subject, msg.data, dict(msg.headers or {}), kind, reason)
