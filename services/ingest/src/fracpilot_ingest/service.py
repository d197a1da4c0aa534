"""The ingest service: usage sources in, validated ``UsageSample`` messages out.

Sources, selected by configuration (several at once allowed):
- ``prometheus``: range queries on an interval from a cursor kept in NATS KV, so a restart or an
  outage of Prometheus is caught up (the missed range, once) and a first start back-fills;
- ``scrape``: exporters' ``/metrics`` read directly;
- ``simulator``: the clearly named workload simulator of the demo.
Which GPU and fraction each pod holds comes from the allocations bucket; owners come from the
pod-name resolver (or the Kubernetes resolver, when configured).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field, TypeAdapter

from fracpilot_ingest.attribution import (
    GpuInventory,
    MetricPoint,
    Observation,
    PodKey,
    Rejection,
    observe_points,
)
from fracpilot_ingest.mappings import MappingTable, MetricMapping
from fracpilot_ingest.owners import KubernetesOwners, OwnerResolver, PodNameOwners
from fracpilot_ingest.samples import PublishedSeries, to_sample
from fracpilot_ingest.simulator import SimulatedWorkload, demo_workloads, usage_at
from fracpilot_ingest.sources.prometheus import PrometheusSource, aligned
from fracpilot_ingest.sources.scrape import ScrapeSource
from fracpilot_ingest.usage_metrics import WorkloadUsageMetrics
from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Allocation, Attribution, UsageSample
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "ingest"
SOURCES = ("simulator", "prometheus", "scrape")
GIB = 1024**3
CURSOR_KEY = "prometheus.cursor"


class IngestSettings(ServiceSettings):
    sources: str = Field(
        default="simulator", description="comma-separated: simulator, prometheus, scrape"
    )
    interval_s: float = Field(default=15.0, gt=0, description="query and scrape interval")
    cluster: str = Field(default="default", description="cluster name in workload identities")
    prometheus_url: str = "http://127.0.0.1:9090"
    prometheus_matchers: str = Field(
        default="", description='extra PromQL label matchers, e.g. job="dcgm-exporter"'
    )
    prometheus_delay_s: float = Field(
        default=0.0, ge=0, description="query only up to now minus this (ingestion delay)"
    )
    backfill_s: float = Field(
        default=3600.0, ge=0, description="history read on a first start, seconds"
    )
    max_sample_age_s: float = Field(
        default=7 * 86_400.0, gt=0, description="older samples are rejected as stale"
    )
    scrape_targets: str = Field(default="", description="comma-separated host:port or URLs")
    mapping_families: str = "dcgm,dcgm-process,hami,hami-legacy,vllm"
    extra_mappings_json: str | None = Field(
        default=None, description="more MetricMapping rows as a JSON list"
    )
    owners: str = Field(
        default="pod-name",
        description="how pods map to workloads: pod-name (conventions) or kubernetes (watches)",
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file for owners=kubernetes; in-cluster if unset"
    )
    default_device_memory_gib: float | None = Field(
        default=None, gt=0, description="device memory when no metric or allocation says"
    )
    sim_start: datetime = Field(
        default=datetime(2026, 3, 2, tzinfo=UTC), description="simulated time of the first sample"
    )
    sim_step_s: float = Field(default=60.0, gt=0, description="simulated seconds between samples")
    sim_speed: float = Field(
        default=720.0, gt=0, description="simulated seconds per real second (720: a day in 2 min)"
    )
    sim_duration_s: float = Field(
        default=86_400.0, ge=0, description="simulated span to produce; 0 runs forever"
    )
    sim_workloads: int = Field(default=8, ge=1, le=8)
    workload_metrics_limit: int = Field(
        default=500,
        ge=0,
        description="workloads with their own series in the per-workload metrics; the rest "
        'are counted under workload="_other"',
    )
    sim_namespace: str = "inference"
    sim_cluster: str = "demo"

    @property
    def source_list(self) -> list[str]:
        return [s.strip() for s in self.sources.split(",") if s.strip()]


def mapping_table(settings: IngestSettings) -> MappingTable:
    extra: tuple[MetricMapping, ...] = ()
    if settings.extra_mappings_json:
        extra = tuple(TypeAdapter(list[MetricMapping]).validate_json(settings.extra_mappings_json))
    families = tuple(f.strip() for f in settings.mapping_families.split(",") if f.strip())
    return MappingTable.of(families, extra)


class IngestService:
    def __init__(
        self,
        settings: IngestSettings,
        span_processor: SpanProcessor | None = None,
        owners: OwnerResolver | None = None,
    ):
        unknown = [s for s in settings.source_list if s not in SOURCES]
        if unknown or not settings.source_list:
            raise ValueError(f"unknown source(s) {unknown}; known: {', '.join(SOURCES)}")
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.table = mapping_table(settings)
        if settings.owners not in ("pod-name", "kubernetes"):
            raise ValueError(f"unknown owners resolver {settings.owners!r}")
        self.owners: OwnerResolver = owners or PodNameOwners(settings.cluster)
        self._kube_owners: KubernetesOwners | None = None
        self.workloads: list[SimulatedWorkload] = demo_workloads(
            settings.sim_namespace, settings.sim_cluster
        )[: settings.sim_workloads]
        self.allocations: dict[str, Allocation] = {}
        self.published_series = PublishedSeries()
        self.finished = asyncio.Event()  # the simulator produced its whole span
        self.cycles = 0  # completed polling cycles of the real sources
        self._tasks: list[asyncio.Task[None]] = []
        reg = self.runtime.registry
        self.published = Counter(
            "fracpilot_ingest_samples_published_total",
            "Samples published",
            ["source", "attribution"],
            registry=reg,
        )
        self.rejected = Counter(
            "fracpilot_ingest_samples_rejected_total",
            "Points or samples rejected, by reason",
            ["source", "reason"],
            registry=reg,
        )
        self.source_errors = Counter(
            "fracpilot_ingest_source_errors_total",
            "Failed queries or scrapes",
            ["source"],
            registry=reg,
        )
        self.query_seconds = Histogram(
            "fracpilot_ingest_query_seconds",
            "Time to query or scrape a source",
            ["source"],
            registry=reg,
        )
        self.lag = Gauge(
            "fracpilot_ingest_lag_seconds",
            "How far the newest published sample is behind now",
            ["source"],
            registry=reg,
        )
        self.sim_time = Gauge(
            "fracpilot_ingest_sim_time_seconds",
            "Simulated time of the last sample (unix seconds)",
            registry=reg,
        )
        self.usage_metrics = WorkloadUsageMetrics(
            reg, settings.prices, settings.workload_metrics_limit
        )

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.owners == "kubernetes" and isinstance(self.owners, PodNameOwners):
            self._kube_owners = KubernetesOwners(
                _kube_api(self.settings.kubeconfig), self.settings.cluster
            )
            self._kube_owners.start()
            await asyncio.to_thread(self._kube_owners.wait_synced, 30.0)
            self.owners = self._kube_owners
        initial = await self.runtime.bus.watch_kv(
            subjects.ALLOCATION_BUCKET, Allocation, self._on_allocation
        )
        await asyncio.wait_for(initial.wait(), timeout=30)
        loops = {
            "simulator": self._simulate,
            "prometheus": self._poll_prometheus,
            "scrape": self._poll_scrape,
        }
        for source in self.settings.source_list:
            self._tasks.append(asyncio.create_task(loops[source](), name=source))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._kube_owners is not None:
            self._kube_owners.stop()

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
        return inv

    # --- publishing ---------------------------------------------------------------------------

    def _reject(self, source: str, rejections: list[Rejection]) -> None:
        if not rejections:
            return
        for r in rejections:
            self.rejected.labels(source, r.reason).inc()
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
        self, source: str, points: list[MetricPoint], inventory: GpuInventory
    ) -> int:
        """Attribute, validate and publish the points of one instant; returns samples sent."""
        observations, rejections = observe_points(points, self.table, inventory)
        now = time.time()
        sent = 0
        for obs in observations:
            result = self._to_sample(source, obs, inventory, now)
            if isinstance(result, Rejection):
                rejections.append(result)
                continue
            if await self._publish(result):
                self.usage_metrics.observe(result, self.settings.interval_s)
            self.published.labels(source, result.attribution.value).inc()
            self.lag.labels(source).set(max(0.0, now - obs.timestamp))
            sent += 1
        self._reject(source, rejections)
        return sent

    def _to_sample(
        self, source: str, obs: Observation, inventory: GpuInventory, now: float
    ) -> UsageSample | Rejection:
        # A pod the actuator placed belongs to the workload it recorded (so that decisions
        # name the workload the actuator knows); any other pod is resolved by its owners.
        workload = inventory.workloads.get(
            PodKey(obs.pod.namespace, obs.pod.pod)
        ) or self.owners.resolve(obs.pod.namespace, obs.pod.pod)
        fraction = inventory.fractions.get(obs.gpu_uuid, {}).get(
            PodKey(obs.pod.namespace, obs.pod.pod)
        )
        return to_sample(
            obs,
            workload,
            source,
            now,
            self.settings.max_sample_age_s,
            self.published_series,
            fraction,
        )

    async def _publish(self, sample: UsageSample) -> bool:
        """Publish one sample; False when NATS already had it (a re-read instant)."""
        with self.runtime.bus.tracer.start_as_current_span(
            "ingest sample",
            kind=SpanKind.PRODUCER,
            attributes={"workload": sample.workload.key, "source": sample.source},
        ):
            return await self.runtime.bus.publish(
                subjects.usage_subject(sample.workload), sample, sample.sample_id
            )

    # --- prometheus ---------------------------------------------------------------------------

    async def _poll_prometheus(self) -> None:
        s = self.settings
        source = PrometheusSource(
            s.prometheus_url, self.table.metric_names, s.interval_s, matchers=s.prometheus_matchers
        )
        kv = await self.runtime.bus.kv(subjects.INGEST_STATE_BUCKET)
        cursor = await _read_cursor(kv)
        if cursor is None:
            cursor = aligned(time.time() - s.backfill_s, s.interval_s) - s.interval_s
            log.info("first start: back-filling", extra={"seconds": s.backfill_s})
        while True:
            end = aligned(time.time() - s.prometheus_delay_s, s.interval_s)
            if end > cursor:
                try:
                    with self.query_seconds.labels("prometheus").time():
                        instants = await asyncio.to_thread(source.fetch, cursor + s.interval_s, end)
                except Exception as exc:  # Prometheus down or broken: keep the cursor
                    self.source_errors.labels("prometheus").inc()
                    log.warning(
                        "prometheus query failed; will catch up",
                        extra={"error": str(exc)[:300], "since": cursor},
                    )
                else:
                    inventory = self.inventory()
                    for points in instants.values():
                        await self.publish_instant("prometheus", points, inventory)
                    if end - cursor > 2 * s.interval_s:
                        log.info(
                            "caught up",
                            extra={"from": cursor, "to": end, "instants": len(instants)},
                        )
                    cursor = end
                    await kv.put(CURSOR_KEY, f"{cursor:.3f}".encode())
                    self.published_series.forget_before(cursor - 2 * s.backfill_s - 3600)
            self.cycles += 1
            await asyncio.sleep(max(0.05, end + s.interval_s - time.time()))

    # --- scrape -------------------------------------------------------------------------------

    async def _poll_scrape(self) -> None:
        s = self.settings
        targets = [t.strip() for t in s.scrape_targets.split(",") if t.strip()]
        source = ScrapeSource(targets, self.table.metric_names, s.interval_s)
        while True:
            now = time.time()
            points: list[MetricPoint] = []
            for target in targets:
                try:
                    with self.query_seconds.labels("scrape").time():
                        points.extend(await asyncio.to_thread(source.scrape, target, now))
                except Exception as exc:  # one target down never stops the others
                    self.source_errors.labels("scrape").inc()
                    log.warning("scrape failed", extra={"target": target, "error": str(exc)[:300]})
            if points:
                await self.publish_instant("scrape", points, self.inventory())
            self.cycles += 1
            await asyncio.sleep(max(0.05, aligned(now, s.interval_s) + s.interval_s - time.time()))

    # --- simulator ----------------------------------------------------------------------------

    def simulated_sample(self, w: SimulatedWorkload, at: datetime) -> UsageSample:
        compute, memory = usage_at(w, at)
        alloc = self.allocations.get(w.workload.key)
        return UsageSample(
            sample_id=f"sim|{w.workload.key}|{int(at.timestamp())}",
            workload=w.workload,
            pod=alloc.pod if alloc else w.pod,
            node=alloc.node if alloc else "",
            gpu_uuid=alloc.gpu_uuid if alloc else "",
            gpu_model=w.gpu_model,
            timestamp=at,
            compute=compute,
            memory_used_bytes=memory,
            memory_total_bytes=w.device_memory_bytes,
            allocated_fraction=alloc.fraction if alloc else None,
            source="simulator",
            attribution=Attribution.EXACT,
        )

    async def _simulate(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        started = loop.time()
        step = timedelta(seconds=s.sim_step_s)
        at, end = s.sim_start, s.sim_start + timedelta(seconds=s.sim_duration_s)
        n = 0
        while s.sim_duration_s == 0 or at < end:
            for w in self.workloads:
                sample = self.simulated_sample(w, at)
                if await self._publish(sample):
                    self.usage_metrics.observe(sample, s.sim_step_s)
                self.published.labels("simulator", sample.attribution.value).inc()
            self.sim_time.set(at.timestamp())
            n += 1
            at += step
            # Pace by the simulated clock, not by sleeps, so slow publishes do not drift.
            delay = started + n * s.sim_step_s / s.sim_speed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        log.info("simulation finished", extra={"steps": n, "sim_end": at.isoformat()})
        self.finished.set()

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def _kube_api(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


async def _read_cursor(kv: KeyValue) -> float | None:
    try:
        entry = await kv.get(CURSOR_KEY)
    except KeyNotFoundError:
        return None
    try:
        return float((entry.value or b"").decode())
    except ValueError:
        log.error("ingest cursor is corrupt; back-filling again")
        return None


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = IngestSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(IngestService(settings).run())


if __name__ == "__main__":
    main()
