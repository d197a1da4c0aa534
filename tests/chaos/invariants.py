"""What must hold after any fault: read the evidence back and count every breach.

The checker reads what the run left behind, never the services' own opinion of it:

- NATS: the usage, decision, actuation and dead-letter streams (payloads and publish times),
  every durable consumer's state, the actuator's KV bucket (its per-decision records, the
  simulated cluster and its journal of executed decisions), the allocations bucket;
- Kubernetes (API-fault runs): the fault proxy's log of what reached the apiserver and what
  it answered, and the pods and Events the apiserver holds.

Invariants (each breach counted in :class:`Findings`):

1. every sample decided or dead-lettered: every durable consumer of the usage stream has
   nothing pending and nothing unacknowledged (a sample is acknowledged after its decision
   is published, or terminated after it is dead-lettered), and, when the run knows which
   samples its load produced, each of them is in the stream exactly once (``lost_samples``,
   ``duplicate_samples``);
2. every decision acted on: each decision in the stream has an ActuationResult, the
   actuator's consumer is caught up, and no decision record is left "started" (an action
   half-recorded) (``lost_decisions``, ``half_recorded``);
3. no decision applied twice: at most one APPLIED result per decision (a scale-up's two
   stages counted as one), the simulated cluster's journal names each decision at most once,
   and the apiserver accepted at most one eviction per pod (``duplicates``);
4. no eviction beyond the budget: disruptive actions (decisions whose evictions the apiserver
   accepted, timed by the first accepted one) never exceed ``max_disruptions`` in any window
   of ``window_s``, nor ``max_per_namespace`` in one namespace (``budget_breaches``);
5. no memory allocation below the policy's floor: every decision's ``new_fraction`` is at
   least ``min_fraction`` and at least the memory floor the policy sets for the workload at
   decision time: its peak memory share over the samples of the last ``memory_window_s``
   (sample time) plus ``max(memory_margin x peak, memory_min_headroom)``, rounded up to the
   grid and capped at ``max_fraction``; every APPLIED result holds its decision's fraction
   (``floor_breaches``). For an LLM server that preallocates and reports its KV pool, the
   memory a sample counts is what docs/sizing.md ("Preallocating LLM servers") says it needs:
   the memory in use less the pool, plus the pool's share in use (:func:`_needed_share`).

The fifth is derived from the :class:`~fracpilot_libs.contracts.Policy` documentation, not from
the engine's code, so an engine that lost part of a workload's history breaks it. Readiness
(the sixth requirement) is measured by the scenarios while they run (:mod:`chaos.faults`).
Also reported, not one of the five: samples published more than ``allocation_grace_s`` after
an allocation changed that still carry the old fraction (``stale_allocation_samples``): the
ingest side's view of the cluster going stale, as it did when KV watches did not survive a
NATS restart.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from fracpilot_libs.contracts import (
    ActuationResult,
    DeadLetter,
    FractionDecision,
    Outcome,
    PlanKind,
    Policy,
    UsageSample,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_batch import as_samples
from fracpilot_libs.nats.usage_streams import usage_streams
from helpers import NatsAccess, connect, read_messages

EPS = 1e-9


@dataclass(frozen=True)
class Stored:
    subject: str
    data: bytes
    seq: int
    published_at: float  # unix seconds, the server's time of storing


@dataclass(frozen=True)
class EvictionSeen:
    """One eviction request as the fault proxy saw it."""

    at: float
    namespace: str
    pod: str
    accepted: bool  # it reached the apiserver and the apiserver took it (2xx, or no answer)


@dataclass(frozen=True)
class Budget:
    max_disruptions: int
    max_per_namespace: int
    window_s: float


@dataclass
class Findings:
    samples: int = 0
    expected_samples: int | None = None
    lost_samples: int = 0
    duplicate_samples: int = 0
    samples_dead_lettered: int = 0
    unacked_samples: int = 0
    decisions: int = 0
    results: int = 0
    applied: int = 0
    lost_decisions: int = 0
    half_recorded: int = 0
    duplicates: int = 0
    evictions_accepted: int = 0
    disruptive_actions: int = 0
    max_in_window: int = 0
    max_in_namespace_window: int = 0
    budget_breaches: int = 0
    floor_breaches: int = 0
    stale_allocation_samples: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.problems) < 40:
            self.problems.append(text)

    @property
    def breaches(self) -> int:
        return (
            self.lost_samples
            + self.duplicate_samples
            + self.unacked_samples
            + self.lost_decisions
            + self.half_recorded
            + self.duplicates
            + self.budget_breaches
            + self.floor_breaches
        )


# --- reading the evidence ---------------------------------------------------------------------


async def read_all(nc: NatsClient, stream: str) -> list[Stored]:
    """Every message in a stream, with its sequence and time, through an ordered consumer
    (read-only: what the operator identity may do)."""
    return [
        Stored(m.subject, m.data, m.metadata.sequence.stream, m.metadata.timestamp.timestamp())
        for m in await read_messages(nc, stream, idle_s=3.0)
    ]


async def durable_consumers(js: JetStreamContext, stream: str) -> list[tuple[str, int, int]]:
    """(name, pending, unacknowledged) of each durable consumer of a stream."""
    found = []
    for info in await js.consumers_info(stream):
        if info.config.durable_name:
            found.append((info.name, info.num_pending, info.num_ack_pending))
    return found


async def kv_items(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    """Every live key of a bucket and its value. The keys come from the stream's subjects
    (STREAM.INFO), the values from single-message reads: the operator identity may do both on
    any bucket, and may follow only some buckets with a consumer (``KeyValue.keys``)."""
    try:
        kv = await js.key_value(bucket)
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
    except NotFoundError:
        return {}
    items: dict[str, bytes] = {}
    for subject in info.state.subjects or {}:
        key = subject.removeprefix(f"$KV.{bucket}.")
        try:
            entry = await kv.get(key)
        except Exception:  # deleted or purged
            continue
        if entry.value:
            items[key] = entry.value
    return items


async def wait_drained(url: NatsAccess, timeout_s: float = 60.0) -> float:
    """Wait until every durable consumer of the usage and decision streams has nothing
    pending or unacknowledged; returns how long that took."""
    nc = await connect(url)
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while True:
            busy = []
            for stream in (*await usage_streams(js), subjects.DECISION_STREAM):
                for name, pending, unacked in await durable_consumers(js, stream):
                    if pending or unacked:
                        busy.append(f"{name}: {pending} pending, {unacked} unacked")
            if not busy:
                return loop.time() - started
            if loop.time() - started > timeout_s:
                raise TimeoutError(f"the pipeline did not drain: {'; '.join(busy)}")
            await asyncio.sleep(0.25)
    finally:
        await nc.close()


# --- the checks -------------------------------------------------------------------------------


def memory_floor(peak_share: float, policy: Policy) -> float:
    """The least fraction the policy allows a workload whose memory peaked at this share."""
    need = peak_share + max(peak_share * policy.memory_margin, policy.memory_min_headroom)
    on_grid = math.ceil(need * policy.steps_per_gpu - EPS) / policy.steps_per_gpu
    return min(policy.max_fraction, max(policy.min_fraction, on_grid))


def _applied_once_per_decision(results: list[ActuationResult], f: Findings) -> None:
    applied: Counter[str] = Counter()
    for r in results:
        if r.outcome is not Outcome.APPLIED:
            continue
        first_stage = r.plan is PlanKind.SCALE_UP and "capacity requested" in r.detail
        if not first_stage:
            applied[r.decision_id] += 1
    f.applied = sum(applied.values())
    for decision_id, n in applied.items():
        if n > 1:
            f.duplicates += n - 1
            f.note(f"decision {decision_id} has {n} APPLIED results")


def _needed_share(s: UsageSample) -> float:
    """The share of the device a sample's pod needs, by the documented rule (not the engine's
    code): a preallocating server with a known pool (no larger than its memory in use) and a
    KV usage in 0..1 needs its fixed part plus the used KV; anything else its memory in use."""
    signals = s.signals
    pool = signals.kv_pool_bytes if signals is not None else None
    usage = signals.kv_cache_usage if signals is not None else None
    if pool is None or usage is None or not 0.0 <= usage <= 1.0 or pool > s.memory_used_bytes:
        return s.memory_share
    return (s.memory_used_bytes - pool + pool * usage) / s.memory_total_bytes


def _floor(
    decisions: list[FractionDecision], samples: list[UsageSample], policy: Policy, f: Findings
) -> None:
    by_workload: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        by_workload[s.workload.key].append((s.timestamp.timestamp(), _needed_share(s)))
    for series in by_workload.values():
        series.sort()
    for d in decisions:
        if d.new_fraction < policy.min_fraction - EPS:
            f.floor_breaches += 1
            f.note(f"decision {d.decision_id}: {d.new_fraction} below min {policy.min_fraction}")
            continue
        at = d.decided_at.timestamp()
        since = at - policy.memory_window_s
        peak = max((m for t, m in by_workload[d.workload.key] if since <= t <= at), default=0.0)
        floor = memory_floor(peak, policy)
        if d.new_fraction < floor - EPS:
            f.floor_breaches += 1
            f.note(
                f"decision {d.decision_id} ({d.workload.display}): {d.new_fraction:g} below the "
                f"memory floor {floor:g} (peak {peak:.3f} of the device)"
            )


def _stale_allocations(
    usage: list[Stored],
    samples: list[UsageSample],
    results: list[tuple[Stored, ActuationResult]],
    grace_s: float,
    f: Findings,
) -> None:
    """Samples published more than ``grace_s`` after an applied change that do not carry it
    (nor a change applied around their own publication)."""
    changes: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for stored, r in results:
        if r.outcome is Outcome.APPLIED and r.fraction_after is not None:
            changes[r.workload.key].append((stored.published_at, r.fraction_after))
    for series in changes.values():
        series.sort()
    for stored, s in zip(usage, samples, strict=True):
        series = changes.get(s.workload.key, [])
        at = stored.published_at
        settled = [fr for t, fr in series if t <= at - grace_s]
        if not settled or s.allocated_fraction is None:
            continue
        around = {fr for t, fr in series if at - grace_s < t <= at + grace_s}
        if s.allocated_fraction != settled[-1] and s.allocated_fraction not in around:
            f.stale_allocation_samples += 1


def _budget(
    evictions: list[EvictionSeen],
    decision_of_pod: dict[tuple[str, str], str],
    budget: Budget,
    f: Findings,
) -> None:
    accepted = [e for e in evictions if e.accepted]
    f.evictions_accepted = len(accepted)
    per_pod = Counter((e.namespace, e.pod) for e in accepted)
    for (namespace, pod), n in per_pod.items():
        if n > 1:
            f.duplicates += n - 1
            f.note(f"pod {namespace}/{pod} evicted {n} times")
    first: dict[str, tuple[float, str]] = {}
    for e in sorted(accepted, key=lambda e: e.at):
        decision = decision_of_pod.get((e.namespace, e.pod), f"unknown:{e.namespace}/{e.pod}")
        first.setdefault(decision, (e.at, e.namespace))
    actions = sorted(first.values())
    f.disruptive_actions = len(actions)
    for i, (at, namespace) in enumerate(actions):
        window = [a for a in actions[: i + 1] if a[0] > at - budget.window_s]
        in_ns = [a for a in window if a[1] == namespace]
        f.max_in_window = max(f.max_in_window, len(window))
        f.max_in_namespace_window = max(f.max_in_namespace_window, len(in_ns))
        if len(window) > budget.max_disruptions or len(in_ns) > budget.max_per_namespace:
            f.budget_breaches += 1
            f.note(
                f"{len(window)} disruptive actions ({len(in_ns)} in {namespace}) within "
                f"{budget.window_s:g} s, limits {budget.max_disruptions} / "
                f"{budget.max_per_namespace}"
            )


async def check(
    url: NatsAccess,
    *,
    policy: Policy | None = None,
    expected_sample_ids: Iterable[str] | None = None,
    evictions: list[EvictionSeen] | None = None,
    decision_of_pod: dict[tuple[str, str], str] | None = None,
    budget: Budget | None = None,
    allocation_grace_s: float = 3.0,
) -> Findings:
    """Read everything back and count breaches of the five invariants (module docstring)."""
    policy = policy or Policy()
    f = Findings()
    nc = await connect(url)
    js = nc.jetstream()
    try:
        partition_streams = await usage_streams(js)
        usage = [m for stream in partition_streams for m in await read_all(nc, stream)]
        decisions_raw = await read_all(nc, subjects.DECISION_STREAM)
        results_raw = await read_all(nc, subjects.ACTUATION_STREAM)
        dead = [
            DeadLetter.model_validate_json(m.data)
            for m in await read_all(nc, subjects.DEADLETTER_STREAM)
        ]
        usage_consumers = {
            stream: await durable_consumers(js, stream) for stream in partition_streams
        }
        usage_counts = {
            stream: (await js.stream_info(stream)).state.messages for stream in partition_streams
        }
        decision_consumers = await durable_consumers(js, subjects.DECISION_STREAM)
        actuator_state = await kv_items(js, subjects.ACTUATOR_STATE_BUCKET)
    finally:
        await nc.close()

    # 1. samples
    # A usage batch holds many samples: each is paired with the message it is stored in.
    pairs = [(m, data) for m in usage for _, data in as_samples(m.subject, m.data)]
    usage = [m for m, _ in pairs]
    samples = [UsageSample.model_validate_json(data) for _, data in pairs]
    f.samples = len(samples)
    ids = Counter(s.sample_id for s in samples)
    f.duplicate_samples = sum(n - 1 for n in ids.values() if n > 1)
    if expected_sample_ids is not None:
        expected = set(expected_sample_ids)
        f.expected_samples = len(expected)
        missing = expected - set(ids)
        f.lost_samples = len(missing)
        for sample_id in sorted(missing)[:5]:
            f.note(f"sample {sample_id} never reached the usage stream")
    f.samples_dead_lettered = sum(1 for d in dead if d.subject.startswith(subjects.USAGE_PREFIX))
    for stream, consumers in usage_consumers.items():
        if not consumers and usage_counts[stream]:
            f.unacked_samples += usage_counts[stream]
            f.note(f"no durable consumer on the usage stream {stream}")
        for name, pending, unacked in consumers:
            if pending or unacked:
                f.unacked_samples += pending + unacked
                f.note(f"{stream} consumer {name}: {pending} pending, {unacked} unacknowledged")

    # 2. decisions
    decisions = [FractionDecision.model_validate_json(m.data) for m in decisions_raw]
    unique = {d.decision_id: d for d in decisions}
    f.decisions = len(unique)
    results = [(m, ActuationResult.model_validate_json(m.data)) for m in results_raw]
    f.results = len(results)
    with_result = {r.decision_id for _, r in results}
    dead_decisions = {
        json.loads(d.raw_payload).get("decision_id")
        for d in dead
        if d.subject.startswith(subjects.DECISION_PREFIX) and d.raw_payload.startswith("{")
    }
    for decision_id in unique:
        if decision_id not in with_result and decision_id not in dead_decisions:
            f.lost_decisions += 1
            f.note(f"decision {decision_id} has no actuation result")
    for name, pending, unacked in decision_consumers:
        if pending or unacked:
            f.lost_decisions += pending + unacked
            f.note(f"decision consumer {name}: {pending} pending, {unacked} unacknowledged")
    for key, value in actuator_state.items():
        if key.startswith("decision.") and not value.startswith(b"done"):
            f.half_recorded += 1
            f.note(f"{key} is still {value.decode(errors='replace')!r}")

    # 3. at most once
    _applied_once_per_decision([r for _, r in results], f)
    sim = actuator_state.get("simulated-cluster")
    if sim is not None:
        journal = json.loads(sim).get("applied", [])
        for decision_id, n in Counter(journal).items():
            if n > 1:
                f.duplicates += n - 1
                f.note(f"the simulated cluster executed {decision_id} {n} times")

    # 4. budget (Kubernetes runs)
    if evictions is not None and budget is not None:
        _budget(evictions, decision_of_pod or {}, budget, f)

    # 5. floor
    _floor(list(unique.values()), samples, policy, f)
    for _, r in results:
        d = unique.get(r.decision_id)
        if (
            d is not None
            and r.outcome is Outcome.APPLIED
            and r.fraction_after is not None
            and r.plan is not PlanKind.NONE
            and abs(r.fraction_after - d.new_fraction) > EPS
        ):
            f.floor_breaches += 1
            f.note(f"{r.decision_id} applied {r.fraction_after}, decided {d.new_fraction}")

    _stale_allocations(usage, samples, results, allocation_grace_s, f)
    return f
