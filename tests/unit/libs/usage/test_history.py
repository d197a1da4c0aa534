"""History read back from Prometheus becomes samples through ingest's own steps."""

from __future__ import annotations

from fracpilot_libs.owners import owner_from_pod_name
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.history import History
from fracpilot_libs.usage.mappings import MappingTable

T0 = 1_772_409_600.0
GPU = "GPU-11111111-2222-3333-4444-555555555555"
DEVICE = {"UUID": GPU, "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-a"}
POD = {"namespace": "genai", "pod": "chat-0", "container": "main"}


def history() -> History:
    return History(MappingTable.of(), lambda ns, pod: owner_from_pod_name("c", ns, pod))


def dcgm(at: float, active: float, used_mib: int, **extra: str) -> list[MetricPoint]:
    labels = {**DEVICE, **POD, **extra}
    return [
        MetricPoint("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, active, at),
        MetricPoint("DCGM_FI_DEV_FB_USED", labels, used_mib, at),
        MetricPoint("DCGM_FI_DEV_FB_FREE", labels, 81920 - used_mib, at),
    ]


def test_instants_become_samples_of_the_pods_workload() -> None:
    h = history()
    h.add_all([dcgm(T0, 0.25, 1024), dcgm(T0 + 300, 0.5, 2048)])
    (key,) = h.samples
    series = h.samples[key]
    assert [s.compute for s in series] == [0.25, 0.5]
    assert series[1].memory_used_bytes == 2048 * 1024 * 1024
    assert series[0].memory_total_bytes == 81920 * 1024 * 1024
    assert series[0].workload.owner_kind == "StatefulSet"
    assert series[0].workload.owner_name == "chat"
    assert h.families == {"dcgm"}
    assert not h.enforced_pods


def test_a_reread_instant_is_a_duplicate_and_history_is_never_stale() -> None:
    h = history()
    h.add(dcgm(T0 - 90 * 86_400, 0.1, 100))  # months old: history, not stale
    h.add(dcgm(T0 - 90 * 86_400, 0.1, 100))
    assert h.sample_count == 1
    assert h.rejected["duplicate"] == 1


def test_bad_points_are_counted_with_an_example() -> None:
    h = history()
    h.add(dcgm(T0, 1.5, 100))
    assert h.sample_count == 0
    assert h.rejected["above_100_percent"] == 1
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in h.first_rejection["above_100_percent"]


def test_hami_container_series_mark_the_pod_enforced() -> None:
    h = history()
    host = {"device_uuid": GPU, "node": "node-a", "device_type": "NVIDIA-NVIDIA A100"}
    ctr = {"device_uuid": GPU, "namespace": "genai", "pod": "chat-0", "container": "main"}
    h.add(
        [
            MetricPoint("hami_host_gpu_utilization_ratio", host, 30.0, T0),
            MetricPoint("hami_gpu_memory_limit_bytes", host, 80 * 1024**3, T0),
            MetricPoint("hami_container_device_utilization_ratio", ctr, 30.0, T0),
            MetricPoint("hami_vgpu_memory_used_bytes", ctr, 1024**3, T0),
        ]
    )
    assert h.sample_count == 1
    assert h.enforced_pods == {("genai", "chat-0")}
    assert "hami" in h.families


def test_vllm_preemptions_become_a_contention_event_once() -> None:
    h = history()
    for i, count in enumerate((3.0, 3.0, 5.0, 5.0)):
        at = T0 + 300 * i
        vllm = MetricPoint("vllm:num_preemptions_total", {**POD, "model_name": "m"}, count, at)
        h.add([*dcgm(at, 0.2, 100), vllm])
    (series,) = h.samples.values()
    events = [bool(s.signals and s.signals.contention_event) for s in series]
    assert events == [False, False, True, False]


def test_a_workloads_samples_of_an_instant_are_in_gpu_uuid_order_whatever_the_sources() -> None:
    # Two pods of one StatefulSet on two GPUs: the report weighs and sizes a workload's samples
    # of one instant in order (analysis.accounting), so it must not follow Prometheus' order.
    def gpu_points(gpu: str, pod: str, active: float) -> list[MetricPoint]:
        return [
            MetricPoint(p.metric, {**p.labels, "UUID": gpu, "pod": pod}, p.value, p.timestamp)
            for p in dcgm(T0, active, 1024)
        ]

    low, high = "GPU-00000000-0000-0000-0000-00000000000a", GPU
    first, second = gpu_points(high, "chat-0", 0.5), gpu_points(low, "chat-1", 0.25)
    orders = []
    for points in (first + second, second + first):
        h = history()
        h.add(points)
        (series,) = h.samples.values()
        orders.append([(s.gpu_uuid, s.pod, s.compute) for s in series])
    assert orders[0] == orders[1] == [(low, "chat-1", 0.25), (high, "chat-0", 0.5)]
