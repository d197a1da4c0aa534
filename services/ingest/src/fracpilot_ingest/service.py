"""The ingest service: usage sources in, validated ``UsageSample`` messages out.

Sources, selected by configuration (several at once allowed), are run alike
(:mod:`fracpilot_ingest.sources`): ``prometheus`` (range queries from a cursor in NATS KV),
``scrape`` (exporters' ``/metrics`` read directly) and ``simulator`` (the demo's workloads).
Points are attributed to pods and GPUs (:mod:`fracpilot_libs.usage.attribution`) and validated
into samples (:mod:`fracpilot_libs.usage.samples`). Which GPU and fraction each pod holds comes
from the allocations bucket (and, with the Kubernetes resolver, KAI's GPU groups and HAMi's
node register: :mod:`fracpilot_ingest.pod_facts`, :mod:`fracpilot_ingest.node_facts`); owners
come from the pod-name resolver (or the Kubernetes resolver, when configured). OOM kills and
vLLM preemptions become one-shot signals on samples (:mod:`fracpilot_libs.usage.signals`).
Each source runs under :mod:`fracpilot_ingest.supervision`: one that raises is logged,
counted and restarted. :mod:`fracpilot_ingest.app` wires and runs it.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind

from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_ingest.node_facts import hami_device_memory
from fracpilot_ingest.owners import KubernetesOwners, OwnerResolver, PodNameOwners, make_owners
from fracpilot_ingest.pod_facts import kai_shared_gpus, oom_kills
from fracpilot_ingest.settings import IngestSettings, mapping_table
from fracpilot_ingest.shard_plan import encode_by_shard, gpu_label_groups
from fracpilot_ingest.shards import IngestShards
from fracpilot_ingest.sources import make_sources
from fracpilot_ingest.sources.base import Reading, Source, SourceContext
from fracpilot_ingest.supervision import SourceSupervisor
from fracpilot_libs.contracts import Allocation, UsageSample
from fracpilot_libs.deadlines import event_set, within
from fracpilot_libs.gc_pause import gc_paused
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.publish_window import OnAcked, PublishWindow
from fracpilot_libs.nats.usage_batch import EncodedBatch, encode_samples
from fracpilot_libs.runtime import ServiceRuntime
from fracpilot_libs.usage.attribution import (
    GpuInventory,
    MetricPoint,
    Observation,
    PodKey,
    Rejection,
    observe_points,
)
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from fracpilot_libs.usage.signals import SignalTracker

log = logging.getLogger(__name__)
SERVICE = "ingest"
GIB = 1024**3
_ATTRIBUTION = operator.attrgetter("attribution")  # in C, for every sample of a batch


class IngestService:
    def __init__(
        self,
        settings: IngestSettings,
        span_processor: SpanProcessor | None = None,
        owners: OwnerResolver | None = None,
    ):
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.metrics = IngestMetrics(
            self.runtime.registry,
            settings.prices,
            settings.workload_metrics_limit,
            settings.workload_metrics_ttl_s,
        )
        self.table = mapping_table(settings)
        self.owners: OwnerResolver = owners or make_owners(
            settings.owners, settings.cluster, settings.kubeconfig, nodes=settings.hami_nodes
        )
        self.allocations: dict[str, Allocation] = {}
        self.published_series = PublishedSeries()
        # Sharded: this replica publishes the GPUs of the shards it holds a lease on.
        self.shards = (
            IngestShards(settings.ingest, self.runtime.registry, gpu_label_groups(self.table))
            if settings.ingest.sharded
            else None
        )
        # An OOM kill this much older than first seen is history (ingest restarted since).
        self.signals = SignalTracker(window_s=max(300.0, 4 * settings.interval_s))
        self.sources: list[Source] = make_sources(
            settings,
            SourceContext(
                metrics=self.metrics,
                metric_names=self.table.metric_names,
                published_series=self.published_series,
                allocations=self.allocations,
                state=lambda: self.runtime.bus.kv(subjects.INGEST_STATE_BUCKET),
                shards=self.shards,
            ),
        )
        self.supervisor = SourceSupervisor(
            self._run_source,
            self.metrics.source_crashes,
            backoff_s=settings.restarts.backoff_s,
            backoff_max_s=settings.restarts.backoff_max_s,
            failing_after=settings.restarts.failing_after,
        )
        self.runtime.health.add_check(self.supervisor.problem)
        self.finished = asyncio.Event()  # a source produced all it will (the simulator's span)
        self.cycles = 0  # completed reads of the sources
        self._tasks: list[asyncio.Task[None]] = []
        # Ends the sources' loops after the reading in hand even if the stop's cancel is lost
        # (nats-py awaits each reply through asyncio.wait_for: see fracpilot_libs.deadlines).
        self._stopping = asyncio.Event()
        self.windows: dict[str, PublishWindow] = {}  # by source
        # The usage partition count batches are grouped by: read before each reading.
        self.partitions = settings.decision_partitions

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if isinstance(self.owners, KubernetesOwners):
            self.owners.start()
            await self.owners.wait_synced(30.0)
        initial = await self.runtime.bus.watch_kv(
            subjects.ALLOCATION_BUCKET, Allocation, self._on_allocation
        )
        await within(initial.wait(), 30)
        if self.shards is not None:
            await self.shards.start(self.runtime.bus.nc, self.runtime.bus.replicas)
        for source in self.sources:
            self._tasks.append(
                asyncio.create_task(self.supervisor.supervise(source), name=source.name)
            )

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        # Awaited: the loops have ended, and their pauses of the collector with them, before
        # the shards are handed over and before the caller goes on (a task cancelled and never
        # resumed, its event loop closed, would leave the collector off in this process).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shards is not None:
            await self.shards.stop()  # hand the shards over, their cursors as they are
        if isinstance(self.owners, KubernetesOwners):
            self.owners.stop()

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)

    async def _on_allocation(self, _key: str, allocation: Allocation | None) -> None:
        if allocation is not None:
            self.allocations[allocation.workload.key] = allocation

    def inventory(self) -> GpuInventory:
        inv = GpuInventory(
            default_device_memory_bytes=int(self.settings.default_device_memory_gib * GIB)
            if self.settings.default_device_memory_gib
            else None
        )
        for a in self.allocations.values():
            inv.device_memory_bytes[a.gpu_uuid] = a.device_memory_bytes
            pod = PodKey(a.workload.namespace, a.pod)
            inv.fractions.setdefault(a.gpu_uuid, {})[pod] = a.fraction
            inv.workloads[pod] = a.workload
        if isinstance(self.owners, KubernetesOwners) and self.owners.nodes is not None:
            registered = hami_device_memory(self.owners.nodes.store.values())
            for uuid, memory in registered.items():
                inv.device_memory_bytes.setdefault(uuid, memory)
        if isinstance(self.owners, KubernetesOwners):
            # KAI's GPU groups name the pods sharing a GPU that no allocation records.
            shared = kai_shared_gpus(
                self.owners.pods.store.values(),
                inv.device_memory_bytes,
                self.settings.kai.reservation,
            )
            for uuid, pods in shared.items():
                on_gpu = inv.fractions.setdefault(uuid, {})
                for (namespace, name), fraction in pods.items():
                    on_gpu.setdefault(PodKey(namespace, name), fraction)
        return inv

    # --- the sources --------------------------------------------------------------------------

    async def _run_source(self, source: Source) -> None:
        """Read, publish, let the source move on, wait as long as it says; until it ends.
        (Run by :attr:`supervisor`, which restarts it when it raises.) The source moves on
        only once every batch of the reading is acknowledged: one that failed raises, and the
        restarted source reads the same instants again (the same batch ids: stored once)."""
        if self._stopping.is_set():  # restarted after a crash during the stop
            return
        await source.open()
        window = self._window(source.name)
        try:
            while not self._stopping.is_set():
                # One pause over a reading's whole life, from the query to its release
                # (libs.gc_pause): resumed while the reading was still held, the collector
                # walked all of it, two or three generations, and more as the process aged
                # (100,000 GPUs: ~1.2 s of CPU in a first cycle, ~2.2 s from the third on).
                with gc_paused():
                    if (reading := await source.read()) is None:
                        break
                    await self._publish_reading(source, reading, window)
                    del reading  # freed by reference counting, inside the pause (a failed
                    # reading goes with its traceback, the collector on again)
                self.metrics.usage.expire(time.time())  # gone workloads leave no frozen series
                self.cycles += 1
                self.supervisor.progressed(source)
                delay = source.next_read_in()
                if delay > 0:
                    await event_set(self._stopping, delay)
        finally:
            await window.cancel()  # what a failed or stopped reading left: read again
        if not self._stopping.is_set():
            self.finished.set()

    async def _publish_reading(
        self, source: Source, reading: Reading, window: PublishWindow
    ) -> None:
        """Every instant of the reading into the window, one drain, then the source moves on
        (its cursor) once all is acknowledged."""
        if self.settings.usage_wire == "batch":
            self.partitions = await self.runtime.bus.usage_partitions()
        if reading.instants:
            self.note_oom_kills()
            inventory = self.inventory()
            for points in reading.instants:
                await self.publish_instant(
                    source.name, points, inventory, reading.step_s, wait=False, keep=reading.keep
                )
        await self.publish_samples(source.name, reading.samples, reading.step_s)
        await window.drain()
        await source.published(reading)

    def note_oom_kills(self) -> None:
        """OOM kills in the pods cache (owners=kubernetes) become pending events."""
        kills = (
            oom_kills(self.owners.pods.store.values())
            if isinstance(self.owners, KubernetesOwners)
            else []
        )
        self.signals.note_kills(kills, time.time())

    # --- publishing ---------------------------------------------------------------------------

    def _reject(self, source: str, rejections: list[Rejection]) -> None:
        if not rejections:
            return
        for r in rejections:
            self.metrics.rejected.labels(source, r.reason).inc()
        reasons = Tally(r.reason for r in rejections)
        log.warning(
            "rejected points",
            extra={
                "source": source,
                "by_reason": dict(reasons),
                "example": rejections[0].detail[:300],
            },
        )

    async def publish_instant(
        self,
        source: str,
        points: list[MetricPoint],
        inventory: GpuInventory,
        step_s: float | None = None,
        *,
        wait: bool = True,
        keep: Callable[[list[Observation]], list[Observation]] | None = None,
    ) -> int:
        """Attribute, validate and publish the points of one instant; returns samples sent.

        ``step_s``: the time each sample stands for (default: the interval). ``wait``: return
        once every batch is acknowledged (else they are left in the source's window).
        ``keep``: sharded, the observations this replica publishes (its shards' past their
        cursors)."""
        step = self.settings.interval_s if step_s is None else step_s
        with gc_paused():  # a burst of objects without cycles (fracpilot_libs.gc_pause)
            observations, rejections = observe_points(points, self.table, inventory)
            if keep is not None:
                observations = keep(observations)
            now = time.time()
            ready = await self.samples_of(source, observations, inventory, now, rejections)
            self._reject(source, rejections)
            await self._send(source, ready, step, now, wait=wait, one_instant=True)
        return len(ready)

    async def samples_of(
        self,
        source: str,
        observations: list[Observation],
        inventory: GpuInventory,
        now: float,
        rejections: list[Rejection],
    ) -> list[tuple[UsageSample, Observation | None]]:
        """The observations of one instant as validated samples, each with its observation
        (marked by the signals); the refused ones appended to ``rejections``. A pod the
        actuator placed belongs to the workload it recorded (so that decisions name the
        workload the actuator knows); any other pod is resolved by its owners."""
        ready: list[tuple[UsageSample, Observation | None]] = []
        mark, workloads, resolve = self.signals.mark, inventory.workloads, self.owners.resolve
        # The tracker's own set (a kill noted meanwhile is seen): with none pending, only a
        # sample with a preemption counter has anything to mark (no call for the others).
        pending_oom = self.signals.pending_oom
        # Owners by pod name need no coroutine per sample (nothing there waits).
        owner_of = self.owners.owner_of if isinstance(self.owners, PodNameOwners) else None
        fractions, max_age = inventory.fractions, self.settings.max_sample_age_s
        published, new_tuple = self.published_series, tuple.__new__
        for obs in observations:
            if pending_oom or obs.preemptions_total is not None:
                obs = mark(obs)
            namespace, name, _ = obs.pod
            pod = new_tuple(PodKey, (namespace, name, ""))
            if (workload := workloads.get(pod)) is None:
                if owner_of is not None:
                    workload = owner_of(namespace, name)
                else:
                    workload = await resolve(namespace, name)
            on_gpu = fractions.get(obs.gpu_uuid)
            fraction = on_gpu.get(pod) if on_gpu is not None else None
            result = to_sample(obs, workload, source, now, max_age, published, fraction)
            if isinstance(result, Rejection):
                rejections.append(result)
                continue
            ready.append((result, obs))
        return ready

    async def publish_samples(
        self, source: str, samples: Sequence[UsageSample], step_s: float, *, wait: bool = False
    ) -> None:
        """Publish samples a source made itself (the simulator's)."""
        await self._send(source, [(s, None) for s in samples], step_s, time.time(), wait=wait)

    async def publish_sample(self, source: str, sample: UsageSample, step_s: float) -> None:
        """Publish one sample alone and wait for it (the one-sample format)."""
        stored = await self._publish(sample)
        self._published(source, sample, None, step_s, time.time(), stored)

    async def _send(
        self,
        source: str,
        ready: list[tuple[UsageSample, Observation | None]],
        step_s: float,
        now: float,
        *,
        wait: bool,
        one_instant: bool = False,
    ) -> None:
        if self.settings.usage_wire == "sample":
            for sample, obs in ready:  # one at a time, each acknowledged before the next
                self._published(source, sample, obs, step_s, now, await self._publish(sample))
            return
        window = self._window(source)
        by_id = {sample.sample_id: (sample, obs) for sample, obs in ready}
        # One instant's batches of a partition go out together (each still after the instants
        # before it); the simulator's samples, of any instants, one batch at a time.
        round_id = object() if one_instant else None
        for batch in self._encode([s for s, _ in ready]):
            rows = [by_id[sample_id] for sample_id in batch.sample_ids]
            lines = batch.text.split(b"\n")[1:] if self.settings.usage_view else []

            acked = self._on_batch_acked(source, rows, lines, step_s, now)
            # Back-pressure: waits here while the window is full.
            key = batch.subject
            await window.submit(key, batch.subject, batch.payload, batch.batch_id, acked, round_id)
        if wait:
            await window.drain()

    def _encode(self, samples: list[UsageSample]) -> list[EncodedBatch]:
        """Sharded, each shard's samples in batches of their own: the same batches, with the
        same ids, whichever replica publishes the shard (:mod:`fracpilot_ingest.shard_plan`)."""
        if self.shards is None:
            return encode_samples(samples, self.partitions)
        return encode_by_shard(samples, self.shards.count, self.partitions)

    def _on_batch_acked(
        self,
        source: str,
        rows: list[tuple[UsageSample, Observation | None]],
        lines: list[bytes],
        step_s: float,
        now: float,
    ) -> OnAcked:
        async def acked(stored: bool) -> None:
            at = time.time()
            # What _published does for each sample, for the whole batch at once.
            samples = [sample for sample, _ in rows]
            if stored:
                self.metrics.usage.observe_all(samples, step_s, at)
            self.signals.published_all([obs for _, obs in rows], now)
            if last := next((obs for _, obs in reversed(rows) if obs is not None), None):
                self.metrics.lag.labels(source).set(max(0.0, now - last.timestamp))  # once
            for attribution, n in Tally(map(_ATTRIBUTION, samples)).items():
                self.metrics.published.labels(source, attribution.value).inc(n)  # once a batch
            if stored and lines:  # the per-workload view: each sample's own JSON, as stored
                bus = self.runtime.bus
                for (sample, _), line in zip(rows, lines, strict=True):
                    await bus.publish_core(subjects.usage_view_subject(sample.workload), line)

        return acked

    def _published(
        self,
        source: str,
        sample: UsageSample,
        obs: Observation | None,
        step_s: float,
        now: float,
        stored: bool,
        at: float | None = None,
        *,
        alone: bool = True,
    ) -> None:
        """A sample acknowledged: counted (its usage and cost only when first stored). Not
        ``alone`` (one of a batch): the caller counts it as published and sets the lag, once
        for the batch."""
        if stored:
            self.metrics.usage.observe(sample, step_s, at or time.time())
        if alone:
            self.metrics.published.labels(source, sample.attribution.value).inc()
        if obs is not None:
            self.signals.published(obs, now)
            if alone:
                self.metrics.lag.labels(source).set(max(0.0, now - obs.timestamp))

    def _window(self, source: str) -> PublishWindow:
        """The source's window of outstanding batches (each source drains its own)."""
        if (window := self.windows.get(source)) is None:
            window = self.windows[source] = self.runtime.bus.publish_window(
                self.settings.publish_window
            )
        return window

    async def _publish(self, sample: UsageSample) -> bool:
        """Publish one sample; False when NATS already had it (a re-read instant)."""
        with self.runtime.bus.tracer.start_as_current_span(
            "ingest sample",  # its child, the publish, is the PRODUCER span
            kind=SpanKind.INTERNAL,
            attributes={"workload": sample.workload.key, "source": sample.source},
        ):
            return await self.runtime.bus.publish(
                subjects.usage_subject(sample.workload), sample, sample.sample_id
            )
