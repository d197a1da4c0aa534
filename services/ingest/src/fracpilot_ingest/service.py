"""The ingest service: turns a usage source into validated ``UsageSample`` messages.

The walking skeleton has one source, the clearly named workload simulator; the Prometheus
and scrape sources arrive with their own issue. Which GPU and fraction a workload holds is
read from the allocations KV bucket that the actuator maintains, as a real source reads it
from the scheduler's annotations.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Gauge
from pydantic import Field, ValidationError

from fracpilot_ingest.simulator import SimulatedWorkload, demo_workloads, usage_at
from fracpilot_libs import subjects
from fracpilot_libs.bus import describe_validation_error
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Allocation, Attribution, UsageSample
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "ingest"


class IngestSettings(ServiceSettings):
    source: str = Field(default="simulator", description="usage source: simulator")
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
    sim_namespace: str = "inference"
    sim_cluster: str = "demo"


class IngestService:
    def __init__(self, settings: IngestSettings, span_processor: SpanProcessor | None = None):
        if settings.source != "simulator":
            raise ValueError(f"unknown source {settings.source!r}; this build has: simulator")
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.workloads: list[SimulatedWorkload] = demo_workloads(
            settings.sim_namespace, settings.sim_cluster
        )[: settings.sim_workloads]
        self.allocations: dict[str, Allocation] = {}
        self.finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        reg = self.runtime.registry
        self.published = Counter(
            "fracpilot_ingest_samples_published_total",
            "Samples published",
            ["source"],
            registry=reg,
        )
        self.rejected = Counter(
            "fracpilot_ingest_samples_rejected_total",
            "Samples rejected by validation",
            ["source", "reason"],
            registry=reg,
        )
        self.lag = Gauge(
            "fracpilot_ingest_sim_time_seconds",
            "Simulated time of the last sample (unix seconds)",
            registry=reg,
        )

    async def start(self) -> None:
        await self.runtime.bus.watch_kv(subjects.ALLOCATION_BUCKET, Allocation, self._on_allocation)
        self._task = asyncio.create_task(self._simulate(), name="simulate")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _on_allocation(self, _key: str, allocation: Allocation | None) -> None:
        if allocation is not None:
            self.allocations[allocation.workload.key] = allocation

    def sample(self, w: SimulatedWorkload, at: datetime) -> UsageSample:
        compute, memory = usage_at(w, at)
        alloc = self.allocations.get(w.workload.key)
        return UsageSample(
            sample_id=f"sim|{w.workload.key}|{int(at.timestamp())}",
            workload=w.workload,
            pod=alloc.pod if alloc else w.pod,
            node=alloc.node if alloc else "",
            gpu_uuid=alloc.gpu_uuid if alloc else "",
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
                await self._publish_one(w, at)
            self.lag.set(at.timestamp())
            n += 1
            at += step
            # Pace by the simulated clock, not by sleeps, so slow publishes do not drift.
            delay = started + n * s.sim_step_s / s.sim_speed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        log.info("simulation finished", extra={"steps": n, "sim_end": at.isoformat()})
        self.finished.set()

    async def _publish_one(self, w: SimulatedWorkload, at: datetime) -> None:
        tracer = self.runtime.bus.tracer
        with tracer.start_as_current_span(
            "ingest sample", kind=SpanKind.PRODUCER, attributes={"workload": w.workload.key}
        ):
            try:
                sample = self.sample(w, at)
            except ValidationError as exc:
                reason = describe_validation_error(exc)
                self.rejected.labels("simulator", "validation").inc()
                log.warning(
                    "rejected a sample", extra={"workload": w.workload.key, "reason": reason}
                )
                return
            await self.runtime.bus.publish(
                subjects.usage_subject(sample.workload), sample, sample.sample_id
            )
            self.published.labels("simulator").inc()

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = IngestSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(IngestService(settings).run())


if __name__ == "__main__":
    main()
