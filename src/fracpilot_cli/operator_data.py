"""The NATS side of ``fracpilot status``, ``explain`` and ``report``: read-only, thin.

Streams are read through an ephemeral pull consumer without acknowledgements, in batches, up
to the messages pending when it was created (``deliver last per subject`` for "the latest of
each workload", a start time for a window). KV buckets are read the same way from their
streams (the latest value of each key, deleted keys left out), so nothing is created and no
watcher is left behind. Values that do not decode are counted and named in
``problems``, never fatal. What the pure cores make of it lives in :mod:`fracpilot_cli.status`,
:mod:`fracpilot_cli.explain` and :mod:`fracpilot_cli.report`.

Usage comes in two formats (:mod:`fracpilot_libs.nats.usage_batch`): one sample per message on
the workload's subject, or batches of a partition's samples from one scrape instant. Both are
read. "The latest sample of each workload" is the last message on each per-workload subject
and, for batches, every batch stored within :data:`LAST_INSTANT_LOOKBACK` of the partition's
last one (an instant may be cut into several batches, published seconds apart): a workload
absent from the last instant's batches has no latest sample (its ``status`` row shows none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import BaseModel

from fracpilot_cli.settings import CliSettings
from fracpilot_cli.status import FleetSnapshot, Recorded, namespace_of_key, start_of_day
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    ConsolidationMove,
    ConsolidationReport,
    FractionDecision,
    Policy,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import NatsSecurityError, connect_once
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.nats.errors import NatsUnreachableError
from fracpilot_libs.nats.kv_snapshot import (
    SnapshotStalledError,
    StoredMessage,
    is_deleted,
    kv_stream,
    read_kv,
)
from fracpilot_libs.nats.kv_snapshot import read_stream as read_stored
from fracpilot_libs.nats.usage_batch import decode_batch, decode_sample
from fracpilot_libs.nats.usage_streams import usage_partition_count
from fracpilot_libs.sizing.checkpoint_groups import CheckpointRead, group_key
from fracpilot_libs.sizing.policies import LivePolicies, cluster_default
from fracpilot_libs.sizing.state import WorkloadState

M = TypeVar("M", bound=BaseModel)
_CONSUMER_PREFIX = "fracpilot-cli"  # the ephemeral consumers' names: who is reading
# How long before a partition's last batch the other batches of the same instant may have been
# stored (ingest publishes an instant's batches through a window of a few in flight).
LAST_INSTANT_LOOKBACK = timedelta(seconds=60)


class NatsUnavailableError(Exception):
    """NATS cannot be reached: the message says where and why."""


RawMessage = StoredMessage  # a message as a stream holds it (fracpilot_libs.nats.kv_snapshot)


async def connect(settings: CliSettings, timeout_s: float = 5.0) -> NatsClient:
    """Connect once with the services' identity and TLS settings, failing fast with the reason
    (a command, not a service, is waiting)."""
    try:
        return await connect_once(settings, timeout_s=timeout_s, name="fracpilot-cli")
    except NatsSecurityError as exc:
        raise NatsUnavailableError(f"NATS at {settings.nats.url}: {exc}") from exc
    except NatsUnreachableError as exc:
        raise NatsUnavailableError(f"cannot connect to NATS at {settings.nats.url}: {exc}") from exc


async def read_stream(
    nc: NatsClient,
    stream: str,
    filter_subject: str,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    start: datetime | None = None,
) -> list[RawMessage]:
    """The stream's messages on ``filter_subject`` (all, the last per subject, or from a time)
    that were there when the read began; an absent stream holds none."""
    try:
        return await read_stored(
            nc, stream, filter_subject, deliver, start, name_prefix=_CONSUMER_PREFIX
        )
    except SnapshotStalledError as exc:
        raise NatsUnavailableError(str(exc)) from exc


async def read_usage(
    nc: NatsClient,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    start: datetime | None = None,
    workload: WorkloadRef | None = None,
) -> list[RawMessage]:
    """Usage messages, both formats, from every partition's stream (or only ``workload``'s
    partition), read at once; in stream order within a partition. With
    ``DeliverPolicy.LAST_PER_SUBJECT``: the last message of each per-workload subject and the
    batches of each partition's last instant (:data:`LAST_INSTANT_LOOKBACK`). Decode them with
    :func:`decode_usage`."""
    js = nc.jetstream()
    count = await usage_partition_count(js)
    if count is None:
        return []
    if workload is not None:
        partitions = [subjects.usage_partition(workload, count)]
        per_subject = subjects.usage_subject(workload)
    else:
        partitions = list(range(count))
        per_subject = f"{subjects.USAGE_PREFIX}.>"  # (last per subject needs a filter)
    reads = [
        _read_partition(nc, p, per_subject, workload is not None, deliver, start)
        for p in partitions
    ]
    return [m for part in await asyncio.gather(*reads) for m in part]


async def _read_partition(
    nc: NatsClient,
    partition: int,
    per_subject: str,
    with_batches: bool,
    deliver: DeliverPolicy,
    start: datetime | None,
) -> list[RawMessage]:
    stream = subjects.usage_stream(partition)
    batches = f"{subjects.USAGE_BATCH_PREFIX}.{partition}.*"
    if deliver is not DeliverPolicy.LAST_PER_SUBJECT:
        read = [read_stream(nc, stream, per_subject, deliver, start)]
        if with_batches:  # a workload's own subject holds no batch
            read.append(read_stream(nc, stream, batches, deliver, start))
        return [m for part in await asyncio.gather(*read) for m in part]
    last = await read_stream(nc, stream, per_subject, deliver)
    if with_batches:
        last += await read_stream(nc, stream, batches, deliver)
    samples = [m for m in last if not subjects.is_usage_batch(m.subject)]
    newest = max((m.received_at for m in last if subjects.is_usage_batch(m.subject)), default=None)
    if newest is None:
        return samples
    instant = await read_stream(
        nc, stream, batches, DeliverPolicy.BY_START_TIME, newest - LAST_INSTANT_LOOKBACK
    )
    return samples + instant


def decode_usage(
    messages: Iterable[RawMessage], problems: list[str]
) -> list[Recorded[UsageSample]]:
    """The samples in usage messages of either format, in message order (a batch's in its
    order); a sample or a batch header that does not decode is named in ``problems`` and left
    out (a batch's other samples are kept)."""
    out: list[Recorded[UsageSample]] = []
    for m in messages:
        if not subjects.is_usage_batch(m.subject):
            try:
                out.append(Recorded(decode(UsageSample, m.data), m.received_at, m.sequence))
            except DecodeError as exc:
                problems.append(f"{m.subject} (sequence {m.sequence}): {exc.reason[:300]}")
            continue
        try:
            lines = decode_batch(m.data).lines
        except DecodeError as exc:
            problems.append(f"{m.subject} (sequence {m.sequence}): {exc.reason[:300]}")
            continue
        for index, line in enumerate(lines):
            try:
                out.append(Recorded(decode_sample(line), m.received_at, m.sequence))
            except DecodeError as exc:
                problems.append(
                    f"{m.subject} (sequence {m.sequence}, sample {index}): {exc.reason[:300]}"
                )
    return out


def latest_samples(
    samples: Iterable[Recorded[UsageSample]], namespace: str | None
) -> dict[str, UsageSample]:
    """The newest sample per workload key, by the sample's own time (then by stream order):
    the two formats' messages are not in one order."""
    best: dict[str, Recorded[UsageSample]] = {}
    for r in samples:
        if namespace is not None and r.value.workload.namespace != namespace:
            continue
        key = subjects.kv_key(r.value.workload)
        seen = best.get(key)
        if seen is None or (r.value.timestamp, r.sequence) >= (seen.value.timestamp, seen.sequence):
            best[key] = r
    return {k: r.value for k, r in best.items()}


async def read_bucket(nc: NatsClient, bucket: str) -> dict[str, RawMessage]:
    """The latest value of every key of a KV bucket (deleted keys left out)."""
    try:
        return await read_kv(nc, bucket, name_prefix=_CONSUMER_PREFIX)
    except SnapshotStalledError as exc:
        raise NatsUnavailableError(str(exc)) from exc


async def read_key(nc: NatsClient, bucket: str, key: str) -> RawMessage | None:
    """One key's value, None when absent or deleted."""
    stream, prefix = kv_stream(bucket)
    return await read_last(nc, stream, f"{prefix}{key}")


async def read_last(nc: NatsClient, stream: str, subject: str) -> RawMessage | None:
    """The last message on a subject, None when there is none."""
    try:
        raw = await nc.jetstream().get_last_msg(stream, subject)
    except NotFoundError:
        return None
    headers = raw.headers or None
    if is_deleted(headers) or not raw.data:
        return None
    at = raw.time or datetime.now(UTC)
    return RawMessage(
        raw.subject or subject, raw.data, False, f"|{raw.seq or 0}|{int(at.timestamp() * 1e9)}"
    )


def decode_all(
    model: type[M], messages: Iterable[RawMessage], problems: list[str]
) -> list[Recorded[M]]:
    """Decoded messages; one that does not decode is named in ``problems`` and left out."""
    out = []
    for m in messages:
        try:
            out.append(Recorded(decode(model, m.data), m.received_at, m.sequence))
        except DecodeError as exc:
            problems.append(f"{m.subject} (sequence {m.sequence}): {exc.reason[:300]}")
    return out


async def read_policies(nc: NatsClient, problems: list[str]) -> LivePolicies:
    """The stored policies over the cluster default the decision service uses
    (``FRACPILOT_POLICY_JSON``, else the built-in defaults)."""
    policies = LivePolicies(cluster_default(CliSettings().policy_json))
    for key, raw in (await read_bucket(nc, subjects.POLICY_BUCKET)).items():
        try:
            policies.apply(key, decode(Policy, raw.data))
        except DecodeError as exc:
            problems.append(f"policy {key}: {exc.reason[:300]}")
    return policies


def _states(
    entries: dict[str, RawMessage],
    problems: list[str],
    wanted: Callable[[str], bool] | None = None,
) -> dict[str, WorkloadState]:
    """The workload states in the checkpoint bucket's ``entries`` (groups and the per-workload
    checkpoints written before them), of the workloads ``wanted`` (by KV key; all if None)."""
    read = CheckpointRead() if wanted is None else CheckpointRead(wanted)
    for key, raw in entries.items():
        read.add(key, raw.data)
    problems.extend(f"engine state {key}: {why[:300]}" for key, why in read.problems)
    return read.states


async def read_consolidation(
    nc: NatsClient, since: datetime, problems: list[str]
) -> tuple[list[ConsolidationReport], list[ConsolidationMove]]:
    """Each cluster's latest consolidation report, and the moves stored since ``since``
    (none when the stream is absent: consolidation off, or an actuator before it)."""
    reports, moves = await asyncio.gather(
        read_stream(
            nc,
            subjects.CONSOLIDATION_STREAM,
            subjects.CONSOLIDATION_REPORTS,
            DeliverPolicy.LAST_PER_SUBJECT,
        ),
        read_stream(
            nc,
            subjects.CONSOLIDATION_STREAM,
            subjects.CONSOLIDATION_MOVES,
            DeliverPolicy.BY_START_TIME,
            since,
        ),
    )
    return (
        [r.value for r in decode_all(ConsolidationReport, reports, problems)],
        [r.value for r in decode_all(ConsolidationMove, moves, problems)],
    )


async def read_fleet(
    nc: NatsClient, namespace: str | None = None, now: datetime | None = None
) -> tuple[FleetSnapshot, LivePolicies]:
    """Everything ``fracpilot status`` shows, read concurrently; ``namespace`` narrows the
    workloads (consolidation is the cluster's: not narrowed). ``now``: "today" ends there."""
    problems: list[str] = []
    midnight = start_of_day(now or datetime.now(UTC))
    (
        allocations,
        states,
        samples,
        results,
        policies,
        (reports, moves),
    ) = await asyncio.gather(
        read_bucket(nc, subjects.ALLOCATION_BUCKET),
        read_bucket(nc, subjects.DECISION_STATE_BUCKET),
        read_usage(nc, DeliverPolicy.LAST_PER_SUBJECT),
        read_stream(
            nc,
            subjects.ACTUATION_STREAM,
            f"{subjects.ACTUATION_PREFIX}.>",
            DeliverPolicy.LAST_PER_SUBJECT,
        ),
        read_policies(nc, problems),
        read_consolidation(nc, midnight, problems),
    )
    if namespace is not None:
        allocations = {k: v for k, v in allocations.items() if namespace_of_key(k) == namespace}
    snapshot = FleetSnapshot(problems=problems)
    snapshot.allocations = _allocations(allocations, problems)
    snapshot.states = _states(  # a group holds workloads of many namespaces: read, then narrow
        states, problems, None if namespace is None else lambda k: namespace_of_key(k) == namespace
    )
    snapshot.samples = latest_samples(decode_usage(samples, problems), namespace)
    snapshot.results = latest_per_workload(ActuationResult, results, namespace, problems)
    snapshot.consolidation_reports = reports
    snapshot.consolidation_moves = moves
    return snapshot, policies


def _allocations(entries: dict[str, RawMessage], problems: list[str]) -> dict[str, Allocation]:
    out = {}
    for key, raw in entries.items():
        try:
            out[key] = decode(Allocation, raw.data)
        except DecodeError as exc:
            problems.append(f"allocation {key}: {exc.reason[:300]}")
    return out


W = TypeVar("W", bound=ActuationResult)


def latest_per_workload(
    model: type[W], messages: list[RawMessage], namespace: str | None, problems: list[str]
) -> dict[str, W]:
    """The newest value per workload key, from messages in stream order (a subject may be
    shared by workloads whose names differ only in characters a subject cannot hold)."""
    out: dict[str, W] = {}
    for m in messages:
        try:
            value = decode(model, m.data)
        except DecodeError as exc:
            problems.append(f"{m.subject} (sequence {m.sequence}): {exc.reason[:300]}")
            continue
        if namespace is None or value.workload.namespace == namespace:
            out[subjects.kv_key(value.workload)] = value
    return out


async def read_workload(
    nc: NatsClient, namespace: str, name: str
) -> tuple[list[Recorded[FractionDecision]], list[Recorded[ActuationResult]]]:
    """Every decision and actuation result the streams hold on the workload's subjects."""
    ref = WorkloadRef(namespace=namespace, owner_name=name)
    problems: list[str] = []
    decisions, results = await asyncio.gather(
        read_stream(nc, subjects.DECISION_STREAM, subjects.decision_subject(ref)),
        read_stream(nc, subjects.ACTUATION_STREAM, subjects.actuation_subject(ref)),
    )
    return (
        decode_all(FractionDecision, decisions, problems),
        decode_all(ActuationResult, results, problems),
    )


async def read_one(
    nc: NatsClient, namespace: str, name: str, known: WorkloadRef | None = None
) -> tuple[FleetSnapshot, LivePolicies]:
    """The status sources of the workload ``namespace/name``: its latest sample and result
    (their subjects name only the namespace and the name), then its KV entries under the key
    of the workload they, or ``known`` (from its decisions), say it is."""
    problems: list[str] = []
    probe = known or WorkloadRef(namespace=namespace, owner_name=name)
    sample, result, policies = await asyncio.gather(
        read_usage(nc, DeliverPolicy.LAST_PER_SUBJECT, workload=probe),
        read_last(nc, subjects.ACTUATION_STREAM, subjects.actuation_subject(probe)),
        read_policies(nc, problems),
    )
    snapshot = FleetSnapshot(problems=problems)
    samples = latest_samples(decode_usage(sample, problems), namespace)
    results = latest_per_workload(ActuationResult, [result] if result else [], namespace, problems)
    found = [s.workload for s in samples.values() if s.workload.owner_name == name]
    found += [r.workload for r in results.values() if r.workload.owner_name == name]
    workload = known or (found[0] if found else probe)
    key = subjects.kv_key(workload)
    group = group_key(key) or key  # a key of another shape: no workload's, nothing found
    allocation, state, grouped = await asyncio.gather(
        read_key(nc, subjects.ALLOCATION_BUCKET, key),
        read_key(nc, subjects.DECISION_STATE_BUCKET, key),
        read_key(nc, subjects.DECISION_STATE_BUCKET, group),
    )
    snapshot.allocations = _allocations({key: allocation} if allocation else {}, problems)
    stored = {k: raw for k, raw in ((key, state), (group, grouped)) if raw is not None}
    snapshot.states = _states(stored, problems, lambda k: k == key)
    snapshot.samples = {k: v for k, v in samples.items() if k == key}
    snapshot.results = {k: v for k, v in results.items() if k == key}
    return snapshot, policies


@dataclass
class Window:
    """What the streams hold for a report's window."""

    samples: list[UsageSample]
    decisions: list[FractionDecision]
    results: list[ActuationResult]
    problems: list[str]
    consolidation_reports: list[ConsolidationReport] = field(default_factory=list)
    consolidation_moves: list[ConsolidationMove] = field(default_factory=list)


async def read_window(nc: NatsClient, since: datetime, namespace: str | None = None) -> Window:
    """Samples, decisions, results and consolidation's reports and moves the server stored
    since ``since`` (consolidation's are the cluster's: not narrowed to ``namespace``)."""
    problems: list[str] = []
    deliver = DeliverPolicy.BY_START_TIME
    samples, decisions, results, reports, moves = await asyncio.gather(
        read_usage(nc, deliver, since),
        read_stream(nc, subjects.DECISION_STREAM, f"{subjects.DECISION_PREFIX}.>", deliver, since),
        read_stream(
            nc, subjects.ACTUATION_STREAM, f"{subjects.ACTUATION_PREFIX}.>", deliver, since
        ),
        read_stream(
            nc, subjects.CONSOLIDATION_STREAM, subjects.CONSOLIDATION_REPORTS, deliver, since
        ),
        read_stream(
            nc, subjects.CONSOLIDATION_STREAM, subjects.CONSOLIDATION_MOVES, deliver, since
        ),
    )

    def keep(values: list[Recorded[Any]]) -> list[Any]:
        return [
            r.value for r in values if namespace is None or r.value.workload.namespace == namespace
        ]

    return Window(
        keep(decode_usage(samples, problems)),
        keep(decode_all(FractionDecision, decisions, problems)),
        keep(decode_all(ActuationResult, results, problems)),
        problems,
        [r.value for r in decode_all(ConsolidationReport, reports, problems)],
        [r.value for r in decode_all(ConsolidationMove, moves, problems)],
    )
