"""The decision service: a thin NATS adapter around the pure engine, partitioned by workload.

**Partitions.** Every sample is stored in one of ``FRACPILOT_DECISION_PARTITIONS`` usage
streams, chosen by its workload (see :mod:`fracpilot_libs.subjects`; this service sets the
count: :mod:`fracpilot_libs.usage_streams`). Replicas share the partitions through leases in KV
(:mod:`fracpilot_decision.ownership`, balanced with minimal movement by
:mod:`fracpilot_decision.partitions`); each replica consumes only the partitions it owns, one
durable pull consumer per partition stream (``decision-p<k>``), in stream order, so each workload's
samples are decided in order by exactly one replica, and keeps only those workloads' histories.

**Hot path.** Samples are fetched in batches and parsed once into the wire model; the engine
decides; a decision (only when the fraction should change) is published, in a span joined to
the sample's trace, before the new history is kept. Nothing else is awaited per sample.

**No sample lost, no history reset.** A partition's samples are acknowledged as soon as a batch
is decided (all-up-to, ``AckPolicy.ALL``: nats-server keeps next to no pending state, which
when acknowledging at checkpoints cost it half its CPU at 100,000 workloads). Durability is
the **mark** each checkpoint ends with: the stream position up to which every workload state
the partition's samples changed is written
to the checkpoint bucket (in batches, every ``checkpoint_interval_s`` or sooner when many are
waiting; see :mod:`fracpilot_decision.checkpoints`). Each state records the stream position of
its last sample, so a sample delivered again is not counted twice. A replica that claims a
partition restores its workloads' checkpoints, then moves the partition's consumer back to the
sample after the mark (a consumer reset: what a dead owner decided but never checkpointed
comes again at once, in order); a graceful hand-over checkpoints before it releases the lease.

Each sample is decided with the effective policy for its workload (see
:mod:`fracpilot_decision.policy_store`), followed live from the policy KV bucket; the service
also answers the policy set/get/list requests (every replica, in a queue group).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field, ValidationError

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.engine import WorkloadState, decide
from fracpilot_decision.heap import HeapFreezer
from fracpilot_decision.ownership import Ownership, default_replica_id
from fracpilot_decision.policy_store import LivePolicies, PolicyStore
from fracpilot_decision.puller import ConsumerGoneError, PullFeed
from fracpilot_libs import subjects
from fracpilot_libs.bus import describe_validation_error
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import FractionDecision, Policy, PolicyLevel, UsageSample
from fracpilot_libs.runtime import ServiceRuntime
from fracpilot_libs.telemetry import extract_trace

log = logging.getLogger(__name__)
SERVICE = "decision"
_EMPTY = WorkloadState()  # the engine never mutates a state: one empty one serves all


class DecisionSettings(ServiceSettings):
    policy_json: str | None = Field(
        default=None,
        description="cluster-default policy as JSON, used when the policy bucket has no "
        "cluster policy",
    )
    checkpoint_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="how often a busy partition's changed workload states are checkpointed "
        "(then its mark); longer than the sampling interval, a workload is "
        "written once for several samples. A crash replays at most this much",
    )
    checkpoint_when_idle_s: float = Field(
        default=1.0,
        ge=0,
        description="checkpoint a partition as soon as no sample came for this long (so a "
        "quiet pipeline is checkpointed at once); 0: only on the interval",
    )
    replica_id: str | None = Field(
        default=None, description="this replica's name in the partition leases; unique"
    )
    partition_lease_s: float = Field(
        default=10.0,
        ge=1.0,
        description="a replica's partitions move to the others this long after it dies "
        "(the TTL of the partition lease bucket); the same on every replica",
    )
    fetch_linger_s: float = Field(
        default=0.02,
        ge=0,
        description="when few samples are waiting, wait this long for more before deciding "
        "(bigger batches under load; adds at most this to the latency)",
    )
    gc_freeze_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="move the objects that survived to Python's permanent generation this "
        "often, so that the collector's full passes do not scan the workload states (they "
        "paused deciding for up to 0.6 s at 100,000 workloads); 0: Python's own collector "
        "behaviour (see fracpilot_decision.heap)",
    )
    gc_full_interval_s: float = Field(
        default=600.0,
        gt=0,
        description="with gc_freeze_interval_s, unfreeze and collect everything this often "
        "(cycles among frozen objects are freed then; one pause each time)",
    )
    max_unacked: int = Field(
        default=100_000,
        ge=100,
        description="samples a partition may decide between two checkpoints (what a crash "
        "replays at most; also the consumer's max ack pending); a "
        "checkpoint is written early at half of it",
    )


def cluster_default(settings: DecisionSettings) -> Policy:
    """The policy behind every stored one: FRACPILOT_POLICY_JSON, else the built-in defaults."""
    if not settings.policy_json:
        return Policy()
    policy = Policy.model_validate_json(settings.policy_json)
    if policy.scope.level is not PolicyLevel.CLUSTER:
        raise ValueError("FRACPILOT_POLICY_JSON must be a cluster-scope policy")
    return policy


def position_of(reply: str) -> tuple[int, int]:
    """Stream sequence and stored time (ns) of a JetStream message, from its reply subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<cseq>.<ns>.<pending>``, or the form
    with domain and account hash); the cheap part of nats-py's ``Msg.metadata``."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7])
    return int(tokens[7]), int(tokens[9])


def _on_its_subject(subject: str, namespace: str, name: str, *, slot_too: bool) -> bool:
    """Whether a stored sample's subject ends in its own workload's tokens, and (``slot_too``)
    its slot is theirs: the partition was chosen from the slot. Names that are tokens already
    skip the escaping; the slot, a hash, is checked on a workload's first sample in the
    partition only (a sample on another slot of the same workload lands in a partition where
    the workload is new, or in this one, where its order is kept)."""
    _, slot, ns_token, name_token = subject.rsplit(".", 3)
    if ns_token != namespace and ns_token != subjects.token(namespace):
        return False
    if name_token != name and name_token != subjects.token(name):
        return False
    return not slot_too or slot == str(subjects.slot_of(ns_token, name_token))


def _of_another_partition(subject: str, partitions: int, partition: int) -> bool:
    """Whether a stored sample's slot belongs to another partition now: stored before the
    partition count changed and not consumed since. Decided here, from an empty history, it
    would overwrite its workload's checkpoint, which its new partition's owner carries on."""
    slot = subject.rsplit(".", 3)[1]
    return not slot.isdigit() or int(slot) % partitions != partition


@dataclass(eq=False)
class Partition:
    """One owned usage partition: its workloads' histories and its consumer."""

    number: int
    states: dict[str, WorkloadState] = field(default_factory=dict)  # by subjects.kv_key
    dirty: set[str] = field(default_factory=set)  # changed since the last checkpoint
    feed: PullFeed | None = None
    stream_made: str = ""  # its stream's creation time: marks name the stream they are of
    task: asyncio.Task[None] | None = None
    lag: asyncio.Task[None] | None = None  # exports the consumer's lag while owned
    last_msg: Msg | None = None  # the last sample handled, not in a checkpoint yet
    uncommitted: int = 0  # samples handled since the last mark
    last_sample_at: float = 0.0  # time.monotonic() of the last batch
    stopping: bool = False  # the worker ends at its next turn (as well as being cancelled)
    committed_at: float = field(default_factory=time.monotonic)
    commit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class DecisionService:
    def __init__(self, settings: DecisionSettings, span_processor: SpanProcessor | None = None):
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.replica = settings.replica_id or default_replica_id()
        self.partition_count = settings.decision_partitions
        self.parts: dict[int, Partition] = {}
        self.policies = LivePolicies(cluster_default(settings))
        self.store: PolicyStore | None = None
        self.ownership: Ownership | None = None
        self._checkpoints: Checkpointer | None = None
        self._commit_task: asyncio.Task[None] | None = None
        self._commit_now = asyncio.Event()
        self.heap = HeapFreezer(
            settings.gc_freeze_interval_s, settings.gc_full_interval_s, self.runtime.registry
        )
        self._stopping = False
        self._abandoned = False
        reg = self.runtime.registry
        self.samples = Counter(
            "fracpilot_decision_samples_total", "Samples decided on", registry=reg
        )
        self.duplicates = Counter(
            "fracpilot_decision_duplicate_samples_total",
            "Samples delivered again after a hand-over or restart, already in the history",
            registry=reg,
        )
        self.decisions = Counter(
            "fracpilot_decision_decisions_total",
            "Decisions published",
            ["direction", "reason"],
            registry=reg,
        )
        self.workloads = Gauge(
            "fracpilot_decision_workloads", "Workloads with history on this replica", registry=reg
        )
        self.lag = Histogram(
            "fracpilot_decision_sample_lag_seconds",
            "From a sample stored in the usage stream to its decision by this replica",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=reg,
        )

    @property
    def histories(self) -> Mapping[str, WorkloadState]:
        """Every workload state this replica holds, by ``subjects.kv_key``."""
        return ChainMap(*(p.states for p in self.parts.values()))

    @property
    def checkpoints(self) -> Checkpointer:
        if self._checkpoints is None:
            raise RuntimeError("the service is not started")
        return self._checkpoints

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        bus = self.runtime.bus
        # This service owns the partition count: it assigns the slots to the usage streams.
        await bus.ensure_streams(assign_partitions=True)
        self._checkpoints = Checkpointer(bus.nc, self.runtime.registry)
        await self._checkpoints.open()
        # Policies first, so the first sample is decided as before a restart.
        policies_loaded = await bus.watch_kv(subjects.POLICY_BUCKET, Policy, self._on_policy_change)
        try:
            await asyncio.wait_for(policies_loaded.wait(), timeout=30)
        except TimeoutError:
            log.warning("stored policies not all loaded in time, starting anyway")
        self.store = await PolicyStore.open(bus, self.policies.default, self.policies.apply)
        await self.store.serve()
        self.ownership = Ownership(
            bus.js,
            self,
            partitions=self.partition_count,
            replica=self.replica,
            lease_s=self.settings.partition_lease_s,
            registry=self.runtime.registry,
            bucket=subjects.DECISION_PARTITION_BUCKET,
        )
        await self.ownership.open()
        self._commit_task = asyncio.create_task(self._commit_loop(), name="checkpoints")
        self.heap.start()
        await self.ownership.start()  # a lone replica owns every partition from here
        log.info(
            "decision replica started",
            extra={
                "replica": self.replica,
                "partitions": self.partition_count,
                "owned": sorted(self.parts),
            },
        )

    async def stop(self) -> None:
        """Called after the requests stopped: hand every partition over (checkpointed and
        marked) and leave, so the other replicas take over at once."""
        if self._abandoned:
            return
        self._stopping = True
        if self.ownership is not None:
            await self.ownership.stop(hand_over=True)
        if self._commit_task is not None:
            self._commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
        await self.heap.stop()
        log.info("partitions handed over", extra={"replica": self.replica})

    async def abandon(self) -> None:
        """Stop as a crash would: nothing more checkpointed or marked, leases left to run
        out, so the other replicas take over from the last checkpoint (tests, the bench).
        The runtime's shutdown after it hands nothing over."""
        self._stopping = self._abandoned = True
        if self.ownership is not None:
            await self.ownership.stop(hand_over=False)
        if self._commit_task is not None:
            self._commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
        await self.heap.stop()
        for part in list(self.parts.values()):
            await self._stop_worker(part)

    async def _on_policy_change(self, key: str, policy: Policy | None) -> None:
        self.policies.apply(key, policy)
        log.info(
            "policy changed" if policy is not None else "policy removed",
            extra={"scope": key, "revision": policy.revision if policy else None},
        )

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)

    # --- partitions coming and going (called by the ownership) ------------------------------

    async def take(self, partitions: frozenset[int]) -> None:
        """Restore the partitions' workloads, then consume them. A partition that cannot be
        opened (NATS trouble) is given up: a later round claims it again."""
        ownership = self.ownership
        assert ownership is not None
        for p in partitions:
            self.parts[p] = Partition(p)
        try:
            restored = await self.checkpoints.restore(partitions, self.partition_count)
        except Exception as exc:
            log.warning("checkpoints not restored, giving up", extra={"error": repr(exc)})
            for p in partitions:
                ownership.forget_soon(p)
            return
        for p in sorted(partitions):
            part = self.parts.get(p)
            if part is None or part.task is not None:
                continue  # dropped while restoring
            part.states = restored[p]
            try:
                part.feed = await self._open_consumer(part)
            except Exception as exc:
                log.warning(
                    "partition consumer not opened, giving up",
                    extra={"partition": p, "error": repr(exc)},
                )
                ownership.forget_soon(p)
                continue
            if self.parts.get(p) is not part:  # dropped while its consumer was opened
                await part.feed.stop()
                continue
            part.task = asyncio.create_task(self._consume(part), name=f"partition-{p}")
            part.lag = self.runtime.bus.watch_consumer_lag(
                subjects.usage_stream(p), subjects.decision_consumer(p)
            )
        self._count_workloads()

    def _forget_positions(self, part: Partition, beyond: int, why: str) -> None:
        """Positions past ``beyond`` in the partition's stream do not come from it (another
        stream: the earlier layout's, a deleted one, the workload's partition before the
        count changed): they would make new samples look delivered again. A position at or
        before the stream's end when it is claimed is harmless: every new sample comes after.
        The states are checkpointed again, so that a later claim does not bring the stale
        position back once the stream has grown past it."""
        states, stale = part.states, 0
        for key, state in states.items():
            if state.position > beyond:
                states[key] = dataclasses.replace(state, position=0)
                part.dirty.add(key)
                stale += 1
        if stale:
            log.warning(
                "positions forgotten",
                extra={"partition": part.number, "workloads": stale, "why": why},
            )

    async def hand_over(self, partition: int) -> None:
        part = self.parts.get(partition)
        if part is None:
            return
        await self._stop_worker(part)
        try:
            await self._commit(part)
        except Exception as exc:  # the next owner decides again from the last checkpoint
            log.warning(
                "partition handed over without its last checkpoint",
                extra={"partition": partition, "error": repr(exc)},
            )
        if not self._stopping:  # on shutdown the histories stay readable until exit
            self.parts.pop(partition, None)
        self._count_workloads()

    async def drop(self, partition: int) -> None:
        part = self.parts.pop(partition, None)
        if part is not None:
            await self._stop_worker(part)
        self._count_workloads()

    async def _stop_worker(self, part: Partition) -> None:
        """Stop the partition's worker: it finishes at an await, never halfway through a
        sample. The flag as well as the cancel: a cancel can be lost in a race (Python 3.11's
        ``wait_for``, in libraries)."""
        part.stopping = True
        if part.lag is not None:  # its series go: another replica may own the consumer now
            part.lag.cancel()
            part.lag = None
        if part.task is not None:
            part.task.cancel()
            done, _ = await asyncio.wait({part.task}, timeout=10)
            if not done:
                log.error("partition worker did not stop", extra={"partition": part.number})
        if part.feed is not None:
            await part.feed.stop()
            part.feed = None

    def _count_workloads(self) -> None:
        self.workloads.set(sum(len(p.states) for p in self.parts.values()))

    # --- consumers --------------------------------------------------------------------------

    def _consumer_config(self, partition: int) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=subjects.decision_consumer(partition),
            description=f"decision replicas: usage partition {partition}",
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            # Acknowledged batch by batch: one still in hand this long comes again (and is
            # recognised by its position).
            ack_wait=self.settings.ack_wait_s,
            max_ack_pending=self.settings.max_unacked,
            max_deliver=-1,  # a sample that cannot be decided is dead-lettered in process
        )

    async def _open_consumer(self, part: Partition) -> PullFeed:
        """Pull from the partition's durable consumer, from the sample after its mark; the
        restored states' positions are checked against the stream first."""
        js = self.runtime.bus.js
        partition = part.number
        stream, name = subjects.usage_stream(partition), subjects.decision_consumer(partition)
        stream_info = await js.stream_info(stream)
        last_seq, part.stream_made = int(stream_info.state.last_seq), str(stream_info.created)
        self._forget_positions(part, last_seq, "past the stream's end")
        mark = await self._read_mark(partition, last_seq, part.stream_made)
        config = self._consumer_config(partition)
        try:
            info = await js.consumer_info(stream, name)
        except NotFoundError:
            info = None
        if info is None:
            if mark:
                config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
                config.opt_start_seq = mark + 1
            else:
                # Never consumed, or made anew (its mark past its end): no state's position is
                # one of this stream's (they come from the earlier single usage stream, or
                # from a stream since deleted). Were one kept, it could hide a new sample.
                self._forget_positions(part, 0, "a new partition stream")
            await js.add_consumer(stream, config)
            mark = mark or 0
        else:
            config.deliver_policy = info.config.deliver_policy  # fixed when it was made
            config.opt_start_seq = info.config.opt_start_seq
            try:
                await js.add_consumer(stream, config)  # update its limits
            except Exception as exc:  # an incompatible older config: keep it as it is
                log.warning("partition consumer kept as configured", extra={"error": repr(exc)})
            if mark is None:
                # Made, then its owner died before marking it (nothing acknowledged), or the
                # mark was deleted: from the acknowledgement floor, and positions past it are
                # not trusted (a sample counted twice rather than one hidden).
                mark = info.ack_floor.stream_seq if info.ack_floor else 0
                self._forget_positions(part, mark, "a consumer without a mark")
            await self._rewind(js, partition, mark)
        # Marked before the first acknowledgement: without a mark, the next owner would have
        # to trust an acknowledgement floor that runs ahead of the checkpoints.
        await self.checkpoints.write_mark(partition, mark, part.stream_made)
        feed = PullFeed(
            self.runtime.bus.nc,
            stream,
            name,
            batch=self.settings.fetch_batch,
            linger_s=self.settings.fetch_linger_s,
        )
        await feed.start()
        return feed

    async def _read_mark(self, partition: int, last_seq: int, stream_made: str) -> int | None:
        """The partition's mark; 0 when it lies past its stream's end (the stream was made
        anew: its samples are all new), None when there is none (or it is of an earlier
        stream of that name)."""
        mark = await self.checkpoints.read_mark(partition, stream_made)
        if mark and mark > last_seq:
            log.warning(
                "partition mark past the usage stream's end (a new stream?): from its start",
                extra={"partition": partition, "mark": mark, "last_seq": last_seq},
            )
            return 0
        return mark

    async def _rewind(self, js: JetStreamContext, partition: int, mark: int) -> None:
        """Deliver the partition again from the sample after ``mark``, now and in order: what
        a previous owner decided but never checkpointed, or fetched and never handled."""
        stream, name = subjects.usage_stream(partition), subjects.decision_consumer(partition)
        try:
            await js.reset_consumer(stream, name, seq=mark + 1)  # >= 2.14
            return
        except Exception as exc:
            log.info("consumer reset unavailable, recreating", extra={"error": repr(exc)})
        await js.delete_consumer(stream, name)
        config = self._consumer_config(partition)
        if mark:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = mark + 1
        await js.add_consumer(stream, config)

    async def _consume(self, part: Partition) -> None:
        ownership = self.ownership
        assert ownership is not None
        while not part.stopping:
            feed = part.feed
            if feed is None:
                return
            try:
                msgs = await feed.next_batch()
            except ConsumerGoneError:
                # Deleted under us (by hand, or with its stream): opened again from the mark,
                # which also notices a stream made anew.
                log.warning(
                    "partition consumer gone, opening it again", extra={"partition": part.number}
                )
                if not await self._reopen(part):
                    return
                continue
            except Exception as exc:  # connection trouble: nats-py reconnects, we wait
                log.warning("fetch failed", extra={"partition": part.number, "error": repr(exc)})
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            if not ownership.holds(part.number):
                # The lease may have run out: give the partition up; whoever claims it next
                # (maybe this replica again) gets these samples from the mark.
                log.warning("partition lease not trusted", extra={"partition": part.number})
                ownership.forget_soon(part.number)
                return
            try:
                await self._handle_batch(part, msgs)
            except Exception:
                log.exception(
                    "partition failed, resuming from its last checkpoint",
                    extra={"partition": part.number},
                )
                await asyncio.sleep(1.0)
                if not await self._reopen(part):
                    return

    async def _reopen(self, part: Partition) -> bool:
        """Reload the partition; False (and given up: a later round claims it again) when
        NATS is in the way."""
        try:
            await self._reload(part)
        except Exception as exc:
            log.warning(
                "partition not reloaded, giving up",
                extra={"partition": part.number, "error": repr(exc)},
            )
            if self.ownership is not None:
                self.ownership.forget_soon(part.number)
            return False
        return True

    async def _reload(self, part: Partition) -> None:
        """Forget the partition's in-memory progress and start again from its checkpoints and
        its mark (a fresh subscription: nothing fetched before is kept)."""
        if part.feed is not None:
            await part.feed.stop()
            part.feed = None
        p = part.number
        part.states = (await self.checkpoints.restore(frozenset({p}), self.partition_count))[p]
        part.dirty = set()
        part.last_msg, part.uncommitted = None, 0
        part.feed = await self._open_consumer(part)

    # --- the hot path -----------------------------------------------------------------------

    async def _handle_batch(self, part: Partition, msgs: list[Msg]) -> None:
        states = part.states
        for_workload = self.policies.for_workload
        kv_key = subjects.kv_key
        stored: list[int] = []  # when each decided sample was stored, ns
        decided = duplicates = 0
        for msg in msgs:
            seq, stored_ns = position_of(msg.reply)
            try:
                sample = UsageSample.model_validate_json(msg.data)
            except ValidationError as exc:
                await self._reject_sample(msg, exc)
                part.last_msg = msg
                part.uncommitted += 1
                continue
            wl = sample.workload
            key = kv_key(wl)
            state = states.get(key)
            first = state is None
            if not _on_its_subject(msg.subject, wl.namespace, wl.owner_name, slot_too=first):
                await self._misrouted(msg, f"{wl.namespace}/{wl.owner_name}")
                part.last_msg = msg
                part.uncommitted += 1
                continue
            if first and _of_another_partition(msg.subject, self.partition_count, part.number):
                await self._left_behind(msg, part.number)
                part.last_msg = msg
                part.uncommitted += 1
                continue
            if state is not None and state.position >= seq:
                duplicates += 1  # already in the history (delivered again after a move)
            else:
                policy = for_workload(wl)
                try:
                    new, decision = decide(state or _EMPTY, sample, policy, seq)
                except Exception as exc:  # a bug on one sample must not stop the partition
                    await self._reject_processing(msg, exc)
                    part.last_msg = msg
                    part.uncommitted += 1
                    continue
                if decision is not None:
                    # Published before the new history is kept: if publishing fails, the
                    # sample is decided again from the old history, with the same id.
                    await self._publish_decision(decision, policy, msg)
                states[key] = new
                part.dirty.add(key)  # not aliased: a checkpoint may swap the set meanwhile
                decided += 1
                stored.append(stored_ns)
            part.last_msg = msg
            part.uncommitted += 1
        self.samples.inc(decided)
        try:  # decided (and any decision published): acknowledged with everything before it
            await msgs[-1].ack()
        except Exception as exc:  # delivered again after the ack wait, recognised by position
            log.warning(
                "acknowledgement failed", extra={"partition": part.number, "error": repr(exc)}
            )
        now_ns = time.time_ns()
        for stored_ns in stored:
            self.lag.observe((now_ns - stored_ns) / 1e9)
        if duplicates:
            self.duplicates.inc(duplicates)
        part.last_sample_at = time.monotonic()
        if part.uncommitted * 2 > self.settings.max_unacked:
            self._commit_now.set()
        self._count_workloads()

    async def _publish_decision(self, decision: FractionDecision, policy: Policy, msg: Msg) -> None:
        bus = self.runtime.bus
        subject = subjects.decision_subject(decision.workload)
        with bus.tracer.start_as_current_span(
            f"consume {subjects.USAGE_PREFIX}",
            context=extract_trace(dict(msg.headers or {})),
            kind=SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination": msg.subject},
        ):
            await bus.publish(subject, decision, decision.decision_id)
        self.decisions.labels(decision.direction.value, decision.reason.value).inc()
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

    async def _reject_sample(self, msg: Msg, exc: ValidationError) -> None:
        errors = exc.errors(include_url=False)
        headers = dict(msg.headers or {})
        bus = self.runtime.bus
        if errors and errors[0]["type"] == "json_invalid":
            reason = f"not valid JSON: {errors[0]['msg']}"
            await bus.dead_letter(msg.subject, msg.data, headers, "decode", reason)
        else:
            reason = describe_validation_error(exc)
            await bus.dead_letter(msg.subject, msg.data, headers, "validation", reason)

    async def _refuse(self, msg: Msg, reason: str) -> None:
        headers = dict(msg.headers or {})
        await self.runtime.bus.dead_letter(msg.subject, msg.data, headers, "validation", reason)

    async def _misrouted(self, msg: Msg, tail: str) -> None:
        await self._refuse(
            msg,
            f"a sample of workload {tail} published on {msg.subject}: samples go on "
            "subjects.usage_subject(workload), which keeps each workload in its partition",
        )

    async def _left_behind(self, msg: Msg, partition: int) -> None:
        await self._refuse(
            msg,
            f"a sample stored in usage partition {partition} before the partition count "
            f"became {self.partition_count}: its workload is decided in another partition "
            "now (change the count with the decision service caught up: docs/performance.md)",
        )

    async def _reject_processing(self, msg: Msg, exc: Exception) -> None:
        log.exception("the engine failed on a sample", extra={"subject": msg.subject})
        await self.runtime.bus.dead_letter(
            msg.subject, msg.data, dict(msg.headers or {}), "processing", repr(exc)[:2000]
        )

    # --- checkpoints ------------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Checkpoint and mark every owned partition now (the interval does it too)."""
        for part in list(self.parts.values()):
            await self._commit(part)

    async def _commit_loop(self) -> None:
        """Checkpoint each partition every interval, or once it has gone quiet.

        Busy partitions are checkpointed one at a time, the most overdue first, one every
        ``interval / partitions``, so that at 100,000 workloads the writes flow evenly instead
        of every partition writing at once each interval (which stalled deciding for a second
        or two)."""
        interval = self.settings.checkpoint_interval_s
        idle = self.settings.checkpoint_when_idle_s
        spacing = interval / max(1, self.partition_count)
        tick = min(spacing, idle / 2 if idle else interval)
        last_due = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await self._commit_now.wait()
            urgent = self._commit_now.is_set()
            self._commit_now.clear()
            now = time.monotonic()
            parts = list(self.parts.values())
            quiet = [
                part
                for part in parts
                if idle and part.uncommitted > 0 and now - part.last_sample_at >= idle
            ]
            due = [part for part in parts if now - part.committed_at >= interval]
            overdue: Partition | None = None
            if urgent:
                chosen = parts
            else:
                overdue = min(due, key=lambda part: part.committed_at, default=None)
                if overdue is not None and now - last_due < spacing:
                    overdue = None  # the next busy partition at the next slot
                if overdue is not None:
                    last_due = now
                chosen = [*quiet, *([overdue] if overdue and overdue not in quiet else [])]
            for part in chosen:
                # The busy partition due now spreads its writes over half a slot; a quiet one
                # or an urgent round writes at once.
                spread = spacing / 2 if part is overdue else 0.0
                try:
                    await self._commit(part, spread)
                except Exception as exc:  # NATS trouble: the next round tries again
                    log.warning(
                        "checkpoint failed", extra={"partition": part.number, "error": repr(exc)}
                    )

    async def _commit(self, part: Partition, spread_s: float = 0.0) -> None:
        """Write the partition's changed states, then the mark: the position of the last sample
        handled before the write began. Every sample up to the mark is in a checkpoint.

        ``spread_s``: take about this long over the writes. At 100,000 workloads a partition's
        checkpoint is 6,000 states; written in one go, the serialising and the server's
        storing of them held up the samples behind them (p99 latency 490 ms instead of 145)."""
        async with part.commit_lock:
            part.committed_at = time.monotonic()
            msg, count = part.last_msg, part.uncommitted
            keys, part.dirty = part.dirty, set()
            if keys:
                failed = await self.checkpoints.write(part.states, keys, spread_s)
                if failed:
                    part.dirty |= failed
                    return
            ownership = self.ownership
            if msg is None or ownership is None or not ownership.holds(part.number):
                return
            await self.checkpoints.write_mark(
                part.number, position_of(msg.reply)[0], part.stream_made
            )
            if part.last_msg is msg:
                part.last_msg = None
            part.uncommitted -= count


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = DecisionSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(DecisionService(settings).run())


if __name__ == "__main__":
    main()
