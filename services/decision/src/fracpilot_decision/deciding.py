"""The hot path: a partition's batch of samples decided, decisions published, the rest refused.

A fetched message is one sample (the previous version's format) or a usage batch
(:mod:`fracpilot_libs.nats.usage_batch`): both are read, so that ingest can be upgraded after
the decision service. Samples are parsed once into the wire model (one that does not parse is
dead-lettered, alone, as classified by :func:`fracpilot_libs.nats.decoding.classify`), routed
(:mod:`fracpilot_decision.routing`), and decided by the pure engine with the workload's
effective policy; a decision (only when the fraction should change) is published, in a span
joined to the message's trace, before the new history is kept. The fetched messages are then
acknowledged all-up-to. Nothing else is awaited per sample.
Each workload's recommendation (:class:`~fracpilot_decision.metrics.RecommendationMetrics`)
is set once per fetch, from its last sample, published decision or not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from itertools import repeat
from typing import TypeVar

from pydantic import ValidationError

from fracpilot_decision.forecasts import card_forecast, keep_jump, prior_of
from fracpilot_decision.metrics import DecisionMetrics, RecommendationMetrics
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.routing import (
    Route,
    left_behind_reason,
    misrouted_reason,
    route,
    route_batched,
)
from fracpilot_libs.contracts import (
    FractionDecision,
    MemoryHeadroomMode,
    MemoryIsolation,
    Policy,
    UsageSample,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.client_types import Msg
from fracpilot_libs.nats.decoding import DecodeError, ErrorKind, classify
from fracpilot_libs.nats.spans import process_span
from fracpilot_libs.nats.usage_batch import (
    BATCH_ID_HEADER,
    BATCH_INDEX_HEADER,
    decode_batch,
    decode_sample,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.isolation_policies import engine_prior
from fracpilot_libs.sizing.policies import LivePolicies
from fracpilot_libs.sizing.state import WorkloadState

log = logging.getLogger(__name__)
T = TypeVar("T")
EXPIRE_EVERY_S = 30.0  # how often stale recommendation series are looked for
# How often a partition's population priors (the forecasts' and the engine's) are recomputed:
# after this long on the clock or in sample time (a backlog replays hours in minutes).
PRIOR_EVERY_S = 300.0
_ENFORCED = MemoryIsolation.ENFORCED
_LEARNED = MemoryHeadroomMode.LEARNED
_YIELD_EVERY = 100  # samples of a batch decided between two turns of the event loop
_EMPTY = WorkloadState()  # the engine never mutates a state: one empty one serves all
# The last sample of each workload fetched: (sample, fraction held, new state).
Latest = dict[str, tuple[UsageSample, float, WorkloadState]]


# (partition, warm-up) -> (computed at on the clock, at in sample time, prior)
PriorCache = dict[tuple[int, float], tuple[float, float, T]]


def _cached(
    cache: PriorCache[T], part: Partition, now: float, policy: Policy, compute: Callable[[], T]
) -> T:
    """A partition's prior from ``cache``, computed anew once PRIOR_EVERY_S has passed on the
    clock or in sample time since it was."""
    key = (part.number, policy.memory_headroom.warmup)
    clock = time.monotonic()
    cached = cache.get(key)
    if cached is not None:
        clock_at, sample_at, prior = cached
        if clock - clock_at < PRIOR_EVERY_S and abs(now - sample_at) < PRIOR_EVERY_S:
            return prior
    prior = compute()
    cache[key] = (clock, now, prior)
    return prior


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
        self._priors: PriorCache[float] = {}  # the forecasts'
        self._engine_priors: PriorCache[float | None] = {}  # the engine's, enforced isolation

    async def handle_batch(self, part: Partition, msgs: list[Msg]) -> None:
        """Decide a fetched batch of messages, each in either wire format: one sample
        (``fracpilot.usage.v1.<slot>.<ns>.<workload>``, the previous version's) or a usage
        batch (:mod:`fracpilot_libs.nats.usage_batch`), in stream order, then acknowledge them
        all-up-to."""
        stored: list[int] = []  # when each decided sample was stored, ns
        counts = [0, 0]  # decided, duplicates
        # The last sample of each workload fetched: (sample, fraction held, new state).
        latest: Latest = {}
        for msg in msgs:
            seq, stored_ns = subjects.stream_position(msg.reply)
            if subjects.is_usage_batch(msg.subject):
                await self._decide_batch(part, msg, seq, counts, latest)
            else:
                await self._decide_sample(part, msg, seq, counts, latest)
            stored.extend(repeat(stored_ns, counts[0] - len(stored)))
        decided, duplicates = counts
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

    def _recommend(self, latest: Latest, now: float) -> None:
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

    async def _decide_sample(
        self, part: Partition, msg: Msg, seq: int, counts: list[int], latest: Latest
    ) -> None:
        """A message of the one-sample format."""
        try:
            sample = UsageSample.model_validate_json(msg.data)
        except ValidationError as exc:
            error = classify(exc)
            await self._refuse(msg, error.kind, error.reason)
            part.handled(msg)
            return
        kept: dict[str, WorkloadState] = {}
        await self._decide(part, msg, msg.subject, sample, seq, kept, counts, None, latest)
        part.keep(kept)
        part.handled(msg)

    async def _decide_batch(
        self, part: Partition, msg: Msg, seq: int, counts: list[int], latest: Latest
    ) -> None:
        """A usage batch: decoded once, each sample decided (or refused) alone, in order.

        Every sample of the message sits at the same stream position, so the new histories are
        kept together once the last is decided (``kept``, with no await between keeping and
        :meth:`Partition.handled`): a checkpoint taken meanwhile holds none of the batch, and
        a mark never falls inside it. Delivered again, a workload whose history has the
        batch's position is recognised as decided for all its samples in it."""
        try:
            batch = decode_batch(msg.data)
        except DecodeError as error:
            await self._refuse(msg, error.kind, error.reason)
            part.handled(msg)
            return
        kept: dict[str, WorkloadState] = {}
        bid = batch.header.batch_id
        for index, line in enumerate(batch.lines):
            if index and not index % _YIELD_EVERY:
                # A fetch of batches holds many thousand samples: let the leases, heartbeats
                # and socket reads in between (kept is staged: a checkpoint then holds none).
                await asyncio.sleep(0)
            try:
                sample = decode_sample(line)
            except DecodeError as error:
                await self._refuse_line(msg, line, bid, index, error.kind, error.reason)
                continue
            batch_item = (line, bid, index)
            await self._decide(part, msg, None, sample, seq, kept, counts, batch_item, latest)
        part.keep(kept)
        part.handled(msg)

    async def _decide(
        self,
        part: Partition,
        msg: Msg,
        subject: str | None,
        sample: UsageSample,
        seq: int,
        kept: dict[str, WorkloadState],
        counts: list[int],
        batch_item: tuple[bytes, str, int] | None,
        latest: Latest,
    ) -> None:
        """One sample: routed, decided, its decision published; its new history goes into
        ``kept`` (kept by the caller once the message is done). ``subject``: the sample's own
        (None: it came in a batch, on its partition's subject)."""
        wl = sample.workload
        key = subjects.kv_key(wl)
        earlier = kept.get(key)  # decided before in this message: at this position already
        state = earlier or part.states.get(key)
        if subject is None:
            way = route_batched(wl, state, seq, self.partition_count, part.number, earlier)
        else:
            way = route(subject, wl, state, seq, self.partition_count, part.number)
        if way is Route.MISROUTED:
            await self._refuse_sample(
                msg, batch_item, "validation", misrouted_reason(wl, msg.subject)
            )
            return
        if way is Route.LEFT_BEHIND:
            reason = left_behind_reason(part.number, self.partition_count)
            await self._refuse_sample(msg, batch_item, "validation", reason)
            return
        if way is Route.DUPLICATE:
            counts[1] += 1  # already in the history (delivered again after a move)
            return
        policy = self.policies.for_workload(wl)
        prior = None
        if policy.isolation is _ENFORCED and policy.memory_headroom.mode is _LEARNED:
            at = sample.timestamp.timestamp()
            first = state.first_seen if state is not None else None
            if first is None or at - first < policy.memory_headroom.warmup:  # a warm one's own
                prior = self._engine_prior(part, at, policy)
        try:
            new, decision = decide(state or _EMPTY, sample, policy, seq, prior)
        except Exception as exc:  # a bug on one sample must not stop the partition
            log.exception("the engine failed on a sample", extra={"subject": msg.subject})
            await self._refuse_sample(msg, batch_item, "processing", repr(exc)[:2000])
            return
        now = sample.timestamp.timestamp()
        share = sample.memory_share
        new = keep_jump(state, new, share, now, policy)
        if decision is not None:
            forecast = card_forecast(new, policy, now, self._prior(part, now, policy))
            update = {"forecast": forecast, "isolation": policy.isolation}
            decision = decision.model_copy(update=update)
            # Published before the new history is kept: if publishing fails, the
            # sample is decided again from the old history, with the same id.
            await self._publish_decision(decision, policy, msg)
        held = sample.allocated_fraction
        if held is None:  # not placed yet: as the engine reads it
            held = (state.current_fraction if state else None) or policy.max_fraction
        latest[key] = (sample, held, new)
        kept[key] = new
        counts[0] += 1

    def _engine_prior(self, part: Partition, now: float, policy: Policy) -> float | None:
        """The population prior a warming-up workload's learned headroom starts from under
        enforced isolation (the replay's, ``isolation_policies.engine_prior``), over the
        partition's workloads, recomputed at most every PRIOR_EVERY_S (the replay: at every
        instant)."""

        def compute() -> float | None:
            states = part.states.values()
            jumps = ((s.first_seen, s.memory_jump) for s in states if s.first_seen is not None)
            return engine_prior(jumps, now, policy)

        return _cached(self._engine_priors, part, now, policy, compute)

    def _prior(self, part: Partition, now: float, policy: Policy) -> float:
        """The partition's population prior for young workloads' jumps, recomputed at most
        every PRIOR_EVERY_S (decisions are rare; the partition may hold many workloads)."""
        return _cached(
            self._priors, part, now, policy, lambda: prior_of(part.states.values(), now, policy)
        )

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

    async def _refuse_sample(
        self, msg: Msg, batch_item: tuple[bytes, str, int] | None, kind: ErrorKind, reason: str
    ) -> None:
        if batch_item is None:
            await self._refuse(msg, kind, reason)
        else:
            await self._refuse_line(msg, *batch_item, kind, reason)

    async def _refuse_line(
        self, msg: Msg, line: bytes, bid: str, index: int, kind: ErrorKind, reason: str
    ) -> None:
        """One sample of a batch dead-lettered alone: its line, with the batch id and index."""
        headers = dict(msg.headers or {})
        headers[BATCH_ID_HEADER] = bid
        headers[BATCH_INDEX_HEADER] = str(index)
        await self.bus.dead_letter(msg.subject, line, headers, kind, reason)
