"""The dcgm-exporter simulator of the Compose stack: what it serves is dcgm-exporter's format,
and ingest reads back from it exactly the usage the workload simulator gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fracpilot_ingest.simulated.dcgm_exporter import (
    DcgmSample,
    SimulatedClock,
    dcgm_samples,
    metric_families,
    placed_pods,
)
from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.contracts import Allocation, WorkloadRef
from fracpilot_libs.simulation.workloads import demo_workloads, usage_at
from fracpilot_libs.usage.attribution import GpuInventory, PodKey, observe_points
from fracpilot_libs.usage.mappings import MappingTable
from support.gpu_exporter import GpuState, PodOnGpu, dcgm_metrics

GIB = 1024**3
MIB = 1024**2
AT = datetime(2026, 3, 2, 15, tzinfo=UTC)
WORKLOADS = demo_workloads("inference", "demo")


def allocation(name: str, pod: str, node: str, gpu: str, fraction: float) -> Allocation:
    return Allocation(
        workload=WorkloadRef(cluster="demo", namespace="inference", owner_name=name),
        pod=pod,
        node=node,
        gpu_uuid=gpu,
        fraction=fraction,
        device_memory_bytes=80 * GIB,
        updated_at=AT,
    )


ALLOCATIONS = [
    allocation("chat-llama-8b", "chat-llama-8b-0", "sim-node-0", "GPU-sim-node-0-0", 0.5),
    allocation("embed-bge", "embed-bge-0", "sim-node-0", "GPU-sim-node-0-0", 0.5),
    allocation("sdxl-images", "sdxl-images-3fa2c", "sim-node-1", "GPU-sim-node-1-1", 0.75),
    allocation("not-simulated", "other-0", "sim-node-1", "GPU-sim-node-1-1", 0.25),
]


def served_text(samples: list[DcgmSample]) -> str:
    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            yield from metric_families(samples)

    registry = CollectorRegistry()
    registry.register(Collector())
    return generate_latest(registry).decode()


def test_only_simulated_workloads_are_served() -> None:
    pods = placed_pods(ALLOCATIONS, WORKLOADS)
    assert [p.allocation.pod for p in pods] == [
        "chat-llama-8b-0",
        "embed-bge-0",
        "sdxl-images-3fa2c",
    ]


def test_label_sets_are_dcgm_exporters_with_virtual_gpus() -> None:
    ours = dcgm_samples(placed_pods(ALLOCATIONS, WORKLOADS), AT)
    reference = dcgm_metrics(
        [
            GpuState(
                "GPU-x",
                "node",
                "NVIDIA A100-SXM4-80GB",
                81_920,
                10,
                pods=[PodOnGpu("ns", "p", "c", util_pct=5, memory_used_mib=1)],
            )
        ],
        per_process=True,
    )
    for name in reference.names():
        our_sets = {tuple(s.labels) for s in ours if s.name == name}
        assert our_sets == set(reference.label_sets(name)), name


def test_ingest_reads_back_the_simulated_usage_exactly() -> None:
    samples = dcgm_samples(placed_pods(ALLOCATIONS, WORKLOADS), AT)
    table = MappingTable.of(("dcgm", "dcgm-process"))
    points = parse_exposition(served_text(samples), set(table.metric_names), "sim:9400", 0.0)
    observations, rejections = observe_points(points, table, GpuInventory())
    assert rejections == []
    by_pod = {o.pod.pod: o for o in observations}
    assert set(by_pod) == {"chat-llama-8b-0", "embed-bge-0", "sdxl-images-3fa2c"}
    for w in WORKLOADS:
        alloc = next(
            (a for a in ALLOCATIONS if a.workload.owner_name == w.workload.owner_name), None
        )
        if alloc is None:
            continue
        obs = by_pod[alloc.pod]
        compute, memory = usage_at(w, AT, alloc.fraction)
        assert obs.exact
        assert obs.pod == PodKey("inference", alloc.pod, "server")
        assert obs.gpu_uuid == alloc.gpu_uuid
        assert obs.node == alloc.node
        assert obs.gpu_model == "NVIDIA A100-SXM4-80GB"
        assert obs.compute == pytest.approx(compute, abs=0.005)  # whole percent, as dcgm
        assert obs.memory_used_bytes == pytest.approx(memory, abs=MIB)  # whole MiB
        assert obs.memory_total_bytes == 80 * GIB  # FB_USED + FB_FREE


def test_device_numbers_add_up_the_pods_sharing_the_gpu() -> None:
    samples = dcgm_samples(placed_pods(ALLOCATIONS, WORKLOADS), AT)
    shared = [
        s for s in samples if s.labels["UUID"] == "GPU-sim-node-0-0" and "pod_uid" not in s.labels
    ]
    own = [s for s in samples if s.labels["UUID"] == "GPU-sim-node-0-0" and "pod_uid" in s.labels]
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        device = {s.value for s in shared if s.name == name}
        assert len(device) == 1  # one value, copied to every pod (vgpu)
        assert device.pop() == sum(s.value for s in own if s.name == name)
    used = next(s.value for s in shared if s.name == "DCGM_FI_DEV_FB_USED")
    free = next(s.value for s in shared if s.name == "DCGM_FI_DEV_FB_FREE")
    assert used + free == 80 * 1024


def test_a_moved_pod_is_served_where_the_actuator_put_it() -> None:
    moved = [
        *ALLOCATIONS[1:],
        allocation("chat-llama-8b", "chat-llama-8b-9c1d0", "sim-node-2", "GPU-sim-node-2-0", 0.75),
    ]
    samples = dcgm_samples(placed_pods(moved, WORKLOADS), AT)
    chat = {
        (s.labels["pod"], s.labels["Hostname"], s.labels["UUID"])
        for s in samples
        if "chat" in s.labels["pod"]
    }
    assert chat == {("chat-llama-8b-9c1d0", "sim-node-2", "GPU-sim-node-2-0")}


def test_the_usage_follows_the_simulated_clock() -> None:
    clock = SimulatedClock(AT, speed=720.0, started=1000.0)
    assert clock.at(1000.0) == AT
    assert clock.at(1005.0) == AT + timedelta(hours=1)
    pods = placed_pods(ALLOCATIONS, WORKLOADS)
    noon, evening = dcgm_samples(pods, clock.at(1000.0)), dcgm_samples(pods, clock.at(1030.0))
    assert noon != evening
