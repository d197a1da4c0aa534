"""The decision service: a thin NATS adapter around the pure engine, partitioned by workload.

**Partitions.** Every sample is stored in one of ``FRACPILOT_DECISION_PARTITIONS`` usage
streams, chosen by its workload (see :mod:`fracpilot_libs.nats.subjects`; this service sets the
count: :mod:`fracpilot_libs.nats.usage_streams`). Replicas share the partitions through leases in KV
(:mod:`fracpilot_libs.leases.ownership`, balanced with minimal movement by
:mod:`fracpilot_libs.leases.balance`); each replica consumes only the partitions it owns, one
durable pull consumer per partition stream (``decision-p<k>``), in stream order, so each workload's
samples are decided in order by exactly one replica, and keeps only those workloads' histories.

**Hot path** (:mod:`fracpilot_decision.deciding`). Samples are fetched in batches and parsed
once into the wire model; the engine decides; a decision (only when the fraction should
change) is published, in a span joined to the sample's trace, before the new history is kept.
Nothing else is awaited per sample.

**No sample lost, no history reset.** A partition's samples are acknowledged as soon as a batch
is decided (all-up-to, ``AckPolicy.ALL``: nats-server keeps next to no pending state, which
when acknowledging at checkpoints cost it half its CPU at 100,000 workloads). Durability is
the **mark** each checkpoint ends with: the stream position up to which every workload state
the partition's samples changed is written
to the checkpoint bucket (in batches, every ``checkpoint.interval_s`` or sooner when many are
waiting; see :mod:`fracpilot_decision.checkpoint_schedule` and
:mod:`fracpilot_decision.checkpoints`). Each state records the stream position of
its last sample, so a sample delivered again is not counted twice. A replica that claims a
partition restores its workloads' checkpoints, then moves the partition's consumer back to the
sample after the mark (a consumer reset, :mod:`fracpilot_decision.consumers`: what a dead
owner decided but never checkpointed comes again at once, in order); a graceful hand-over
checkpoints before it releases the lease.

This module is the adapter between them: the life cycle, and the partitions coming and going
as the ownership says, each owned one run by :mod:`fracpilot_decision.worker`.
:mod:`fracpilot_decision.app` runs it.

Each sample is decided with the effective policy for its workload (see
:mod:`fracpilot_libs.sizing.policies`), followed live from the policy KV bucket; the service
also answers the policy set/get/list requests (every replica, in a queue group).
"""

from __future__ import annotations

import asyncio
import logging
from collections import ChainMap
from collections.abc import Mapping

from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter

from fracpilot_decision.checkpoint_schedule import CheckpointScheduler
from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.consumers import PartitionConsumers
from fracpilot_decision.deciding import Decider
from fracpilot_decision.heap import HeapFreezer
from fracpilot_decision.metrics import DecisionMetrics, RecommendationMetrics, ownership_metrics
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.policy_store import PolicyStore
from fracpilot_decision.settings import DecisionSettings
from fracpilot_decision.worker import PartitionWorker
from fracpilot_libs.contracts import Policy
from fracpilot_libs.deadlines import event_set
from fracpilot_libs.leases.ownership import Ownership, default_replica_id
from fracpilot_libs.nats import subjects
from fracpilot_libs.runtime import ServiceRuntime
from fracpilot_libs.sizing.policies import LivePolicies, cluster_default
from fracpilot_libs.sizing.state import WorkloadState

log = logging.getLogger(__name__)
SERVICE = "decision"

__all__ = ["SERVICE", "DecisionService", "DecisionSettings", "Partition"]


class _Started:
    """What exists once the service is connected (made in :meth:`DecisionService.start`)."""

    def __init__(
        self,
        checkpoints: Checkpointer,
        consumers: PartitionConsumers,
        scheduler: CheckpointScheduler,
        ownership: Ownership,
        worker: PartitionWorker,
    ) -> None:
        self.checkpoints = checkpoints
        self.consumers = consumers
        self.scheduler = scheduler
        self.ownership = ownership
        self.worker = worker


class DecisionService:
    """Owns partitions as the leases say, and runs a worker per partition owned."""

    def __init__(self, settings: DecisionSettings, span_processor: SpanProcessor | None = None):
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.replica = settings.replica_id or default_replica_id()
        self.partition_count = settings.decision_partitions
        self.parts: dict[int, Partition] = {}
        self.policies = LivePolicies(cluster_default(settings.policy_json))
        self.store: PolicyStore | None = None
        self.ownership: Ownership | None = None
        self._started: _Started | None = None
        self.heap = HeapFreezer.configured(settings.gc, self.runtime.registry)
        self._stopping = False
        self._abandoned = False
        self.metrics = DecisionMetrics(self.runtime.registry)
        self.decider = Decider(
            self.runtime.bus,
            self.policies,
            self.metrics,
            partition_count=self.partition_count,
            max_unacked=settings.max_unacked,
            urge_checkpoint=self._urge_checkpoint,
            recommendations=RecommendationMetrics(
                self.runtime.registry,
                settings.workload_metrics_limit,
                settings.workload_metrics_ttl_s,
            ),
        )

    @property
    def samples(self) -> Counter:
        """Samples decided on (``fracpilot_decision_samples_total``)."""
        return self.metrics.samples

    @property
    def histories(self) -> Mapping[str, WorkloadState]:
        """Every workload state this replica holds, by ``subjects.kv_key``."""
        return ChainMap(*(p.states for p in self.parts.values()))

    @property
    def started(self) -> _Started:
        if self._started is None:
            raise RuntimeError("the service is not started")
        return self._started

    @property
    def checkpoints(self) -> Checkpointer:
        return self.started.checkpoints

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        bus = self.runtime.bus
        # This service owns the partition count: it assigns the slots to the usage streams.
        await bus.ensure_streams(assign_partitions=True)
        checkpoints = Checkpointer(bus.nc, self.runtime.registry, bus.replicas)
        await checkpoints.open()
        # Policies first, so the first sample is decided as before a restart.
        policies_loaded = await bus.watch_kv(subjects.POLICY_BUCKET, Policy, self._on_policy_change)
        if not await event_set(policies_loaded, 30):
            log.warning("stored policies not all loaded in time, starting anyway")
        self.store = await PolicyStore.open(bus, self.policies.default, self.policies.apply)
        await self.store.serve()
        self.ownership = ownership = Ownership(
            bus.nc,
            self,
            partitions=self.partition_count,
            replica=self.replica,
            lease_s=self.settings.partition.lease_s,
            metrics=ownership_metrics(self.runtime.registry),
            bucket=subjects.DECISION_PARTITION_BUCKET,
            replicas=bus.replicas,
        )
        await ownership.open()
        scheduler = CheckpointScheduler(
            checkpoints, self.parts, ownership.holds, self.settings.checkpoint, self.partition_count
        )
        consumers = PartitionConsumers(bus.nc, checkpoints, self.settings)
        worker = PartitionWorker(
            checkpoints,
            consumers,
            ownership,
            self.decider,
            partition_count=self.partition_count,
            after_batch=self._count_workloads,
        )
        self._started = _Started(checkpoints, consumers, scheduler, ownership, worker)
        scheduler.start()
        self.heap.start()
        await ownership.start()  # a lone replica owns every partition from here
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
        if self._started is not None:
            await self._started.scheduler.stop()
        await self.heap.stop()
        log.info("partitions handed over", extra={"replica": self.replica})

    async def abandon(self) -> None:
        """Stop as a crash would: nothing more checkpointed or marked, leases left to run
        out, so the other replicas take over from the last checkpoint (tests, the bench).
        The runtime's shutdown after it hands nothing over."""
        self._stopping = self._abandoned = True
        if self.ownership is not None:
            await self.ownership.stop(hand_over=False)
        if self._started is not None:
            await self._started.scheduler.stop()
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
        started = self.started
        ownership = started.ownership
        for p in partitions:
            self.parts[p] = Partition(p)
        try:
            restored = await started.checkpoints.restore(partitions, self.partition_count)
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
                part.feed = await started.consumers.open(part)
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
            part.task = asyncio.create_task(started.worker.run(part), name=f"partition-{p}")
            part.lag = self.runtime.bus.watch_consumer_lag(
                subjects.usage_stream(p), subjects.decision_consumer(p)
            )
        self._count_workloads()

    async def hand_over(self, partition: int) -> None:
        part = self.parts.get(partition)
        if part is None:
            return
        await self._stop_worker(part)
        try:
            await self.started.scheduler.commit(part)
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
        self.metrics.workloads.set(sum(len(p.states) for p in self.parts.values()))

    # --- checkpoints ------------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Checkpoint and mark every owned partition now (the schedule does it too)."""
        await self.started.scheduler.commit_all()

    def _urge_checkpoint(self) -> None:
        if self._started is not None:
            self._started.scheduler.urge()
