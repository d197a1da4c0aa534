"""A simulator of NVIDIA's dcgm-exporter, for the Docker Compose stack (never for tests of real
sources): ``/metrics`` in dcgm-exporter's format for the demo's inference workloads.

It follows the allocations bucket, where the actuator (with its simulated cluster) records
which pod of each workload runs on which GPU of which node, and serves, for every placed pod,
the usage the demo's workload simulator (:mod:`fracpilot_libs.simulation.workloads`) gives at the
simulated time. So the loop closes as in a cluster: Prometheus scrapes this, ingest reads it
from Prometheus, decision sizes the workload, the actuator resizes or moves its pod, and the
next scrape shows the pod where the actuator put it.

The format is dcgm-exporter's with Kubernetes pod mapping and ``--kubernetes-virtual-gpus``
(tags up to 4.5.3-4.8.2): device series (``DCGM_FI_DEV_GPU_UTIL`` in %,
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` as a ratio, ``DCGM_FI_DEV_FB_USED``/``FREE`` in MiB), one
copy per pod sharing the GPU with a ``vgpu`` label, plus per-process series
(``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED`` with ``pod_uid``) holding each pod's own
numbers. Labels: ``gpu, UUID, pci_bus_id, device, modelName, Hostname, container, namespace,
pod``.

Simulated time runs ``FRACPILOT_SIM_SPEED`` times faster than the clock from
``FRACPILOT_SIM_START``. Run it with ``python -m fracpilot_ingest.simulated.dcgm_exporter``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as uuidlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, Field

from fracpilot_ingest.settings import SimulatorSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Allocation
from fracpilot_libs.deadlines import within
from fracpilot_libs.nats import subjects
from fracpilot_libs.runtime import ServiceRuntime
from fracpilot_libs.simulation.workloads import SimulatedWorkload, demo_workloads, usage_at
from fracpilot_libs.telemetry import TelemetryServer

log = logging.getLogger(__name__)
SERVICE = "dcgm-exporter-simulator"
MIB = 1024 * 1024
CONTAINER = "server"

HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
}


class ExporterSettings(BaseModel):
    """FRACPILOT_EXPORTER_*: where /metrics is served."""

    host: str = Field(default="127.0.0.1", description="where /metrics is served")
    port: int = Field(default=9400, ge=0, le=65535, description="dcgm-exporter's port")


class ExporterSimulationSettings(SimulatorSettings):
    """FRACPILOT_SIM_*, as the exporter reads them (its clock starts at noon)."""

    start: datetime = Field(
        default=datetime(2026, 3, 2, 12, tzinfo=UTC),
        description="simulated time when the simulator starts",
    )


class DcgmSimulatorSettings(ServiceSettings):
    exporter: ExporterSettings = Field(default_factory=ExporterSettings)
    sim: ExporterSimulationSettings = Field(default_factory=ExporterSimulationSettings)


@dataclass(frozen=True, slots=True)
class PodOnSimulatedGpu:
    """A placed pod of a simulated workload: where the actuator put it, what it runs."""

    workload: SimulatedWorkload
    allocation: Allocation

    @property
    def uid(self) -> str:
        a = self.allocation
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pod://{a.workload.namespace}/{a.pod}"))


@dataclass(frozen=True, slots=True)
class DcgmSample:
    name: str
    labels: dict[str, str]
    value: float


def placed_pods(
    allocations: Iterable[Allocation], workloads: Iterable[SimulatedWorkload]
) -> list[PodOnSimulatedGpu]:
    """The allocations of simulated workloads (others are not this simulator's), in order."""
    by_name = {(w.workload.namespace, w.workload.owner_name): w for w in workloads}
    pods = []
    for a in allocations:
        w = by_name.get((a.workload.namespace, a.workload.owner_name))
        if w is not None:
            pods.append(PodOnSimulatedGpu(w, a))
    return sorted(pods, key=lambda p: (p.allocation.node, p.allocation.gpu_uuid, p.allocation.pod))


def dcgm_samples(pods: Iterable[PodOnSimulatedGpu], at: datetime) -> list[DcgmSample]:
    """What dcgm-exporter would serve for these pods at simulated time ``at`` (pure)."""
    gpus: dict[str, list[PodOnSimulatedGpu]] = defaultdict(list)
    for pod in pods:
        gpus[pod.allocation.gpu_uuid].append(pod)
    index_on_node: dict[str, int] = {}
    per_node: dict[str, list[str]] = defaultdict(list)
    for uuid in sorted(gpus):
        per_node[gpus[uuid][0].allocation.node].append(uuid)
    for uuids in per_node.values():
        index_on_node.update({uuid: i for i, uuid in enumerate(uuids)})

    device: list[DcgmSample] = []
    process: list[DcgmSample] = []
    for uuid in sorted(gpus):
        on_gpu = gpus[uuid]
        first = on_gpu[0]
        index = index_on_node[uuid]
        base = {
            "gpu": str(index),
            "UUID": uuid,
            "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
            "device": f"nvidia{index}",
            "modelName": first.workload.gpu_model,
            "Hostname": first.allocation.node,
        }
        total_mib = first.allocation.device_memory_bytes // MIB
        usage = [usage_at(p.workload, at, p.allocation.fraction) for p in on_gpu]
        util = [round(compute * 100) for compute, _ in usage]
        used = [memory // MIB for _, memory in usage]
        fb_used = min(total_mib, sum(used))
        values = {
            "DCGM_FI_DEV_GPU_UTIL": float(min(100, sum(util))),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(min(1.0, sum(c for c, _ in usage)), 6),
            "DCGM_FI_DEV_FB_USED": float(fb_used),
            "DCGM_FI_DEV_FB_FREE": float(total_mib - fb_used),
        }
        for vgpu, (pod, pod_util, pod_used) in enumerate(zip(on_gpu, util, used, strict=True)):
            labels = {
                **base,
                "container": CONTAINER,
                "namespace": pod.allocation.workload.namespace,
                "pod": pod.allocation.pod,
            }
            for name, value in values.items():
                device.append(DcgmSample(name, {**labels, "vgpu": str(vgpu)}, value))
            own = {**labels, "pod_uid": pod.uid, "vgpu": str(vgpu)}
            process.append(DcgmSample("DCGM_FI_DEV_GPU_UTIL", own, float(pod_util)))
            process.append(DcgmSample("DCGM_FI_DEV_FB_USED", own, float(pod_used)))
    return device + process


def metric_families(samples: Iterable[DcgmSample]) -> list[Metric]:
    """Samples grouped into one gauge family per metric name, in HELP order."""
    families: dict[str, Metric] = {}
    for s in samples:
        family = families.get(s.name)
        if family is None:
            family = families[s.name] = Metric(s.name, HELP.get(s.name, s.name), "gauge")
        family.add_sample(s.name, s.labels, s.value)
    return [families[name] for name in HELP if name in families]


class SimulatedClock:
    """Simulated time: ``start`` when the clock started, then ``speed`` times faster."""

    def __init__(self, start: datetime, speed: float, started: float | None = None) -> None:
        self.start = start
        self.speed = speed
        self.started = time.time() if started is None else started

    def at(self, now: float) -> datetime:
        return self.start + timedelta(seconds=(now - self.started) * self.speed)


class _Collector:
    """prometheus_client calls ``collect`` on every scrape: the values are those of now."""

    def __init__(self, simulator: DcgmExporterSimulator) -> None:
        self._simulator = simulator

    def collect(self) -> Iterator[Metric]:
        yield from metric_families(self._simulator.samples_now())


class DcgmExporterSimulator:
    def __init__(self, settings: DcgmSimulatorSettings) -> None:
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings)
        sim = settings.sim
        self.workloads = demo_workloads(sim.namespace, sim.cluster)[: sim.workloads]
        self.allocations: dict[str, Allocation] = {}
        self.clock = SimulatedClock(sim.start, sim.speed)
        registry = CollectorRegistry()
        registry.register(_Collector(self))
        self.exporter = TelemetryServer(registry, self.runtime.health)

    def samples_now(self) -> list[DcgmSample]:
        pods = placed_pods(list(self.allocations.values()), self.workloads)
        return dcgm_samples(pods, self.clock.at(time.time()))

    async def _on_allocation(self, key: str, allocation: Allocation | None) -> None:
        if allocation is None:
            self.allocations.pop(key, None)
        else:
            self.allocations[key] = allocation

    async def start(self) -> None:
        initial = await self.runtime.bus.watch_kv(
            subjects.ALLOCATION_BUCKET, Allocation, self._on_allocation
        )
        await within(initial.wait(), 30)
        await self.exporter.start(self.settings.exporter.host, self.settings.exporter.port)
        log.info(
            "dcgm-exporter simulator serving /metrics",
            extra={
                "host": self.settings.exporter.host,
                "port": self.exporter.port,
                "placed_pods": len(self.allocations),
                "sim_start": self.settings.sim.start.isoformat(),
                "sim_speed": self.settings.sim.speed,
            },
        )

    async def stop(self) -> None:
        await self.exporter.stop()

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = DcgmSimulatorSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(DcgmExporterSimulator(settings).run())


if __name__ == "__main__":
    main()
