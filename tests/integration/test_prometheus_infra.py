"""The ingest test infrastructure is real: a real Prometheus scrapes the GPU test exporter.

Proves, against Debian's ``prometheus`` binary, that
- dcgm-exporter (device and per-process), HAMi (v2.9+ and legacy names) and vLLM samples arrive
  with the exact values the model says, in each format's units;
- with static target labels and ``honor_labels: false`` the exporter's ``pod``/``namespace``/
  ``container`` become ``exported_pod``/``exported_namespace``/``exported_container``, as in a
  cluster; without target labels they stay as they are, and empty ones vanish;
- Prometheus stopped and started again on the same data dir and port keeps the old samples,
  has none for the gap, and scrapes new ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from support.dcgm_prometheus import DCGM_POD
from support.gpu_exporter import (
    MIB,
    GpuState,
    GpuTestExporter,
    PodOnGpu,
    VllmState,
    dcgm_device_metrics,
    dcgm_metrics,
    hami_metrics,
    vllm_metrics,
    vllm_metrics_for_pod,
)
from support.prometheus_server import PrometheusServer, ScrapeTarget, sample_value, values_by

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NODE = "gpu-node-1"
MODEL = "NVIDIA A100-SXM4-80GB"
LLM = PodOnGpu(
    "team-a",
    "llm-0",
    "server",
    util_pct=45,
    memory_used_mib=20_000,
    memory_limit_mib=40_960,
    vllm=VllmState(kv_cache_usage=0.625, num_requests_waiting=3, num_requests_running=7),
)
NOTEBOOK = PodOnGpu("team-b", "nb-1", "jupyter", util_pct=25, memory_used_mib=8_000)
SHARED = GpuState("GPU-0aaa", NODE, MODEL, 81_920, util_pct=70, pods=[LLM, NOTEBOOK], index=0)
IDLE = GpuState("GPU-1bbb", NODE, MODEL, 81_920, util_pct=0, index=1)
GPUS = [SHARED, IDLE]

# The exporters' own pods, attached by Prometheus as target labels (as a ServiceMonitor would).
HAMI_POD = {"namespace": "kube-system", "pod": "hami-device-plugin-q9z", "container": "monitor"}


@pytest.fixture(scope="module")
def exporter() -> Iterator[GpuTestExporter]:
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_metrics(GPUS, per_process=True), "/dcgm")
        exporter.set_metrics(dcgm_device_metrics(GPUS, hostname_label="hostname"), "/dcgm-plain")
        exporter.set_metrics(hami_metrics(GPUS, names="both"), "/hami")
        exporter.set_metrics(vllm_metrics(GPUS, kv_cache_metric="both"), "/vllm")
        exporter.set_metrics(vllm_metrics_for_pod(LLM), "/vllm-llm-0")
        yield exporter


@pytest.fixture(scope="module")
def prom(exporter: GpuTestExporter) -> Iterator[PrometheusServer]:
    addr = exporter.address
    targets = [
        ScrapeTarget("dcgm", addr, "/dcgm", labels=DCGM_POD),
        ScrapeTarget("dcgm-plain", addr, "/dcgm-plain"),
        ScrapeTarget("hami", addr, "/hami", labels=HAMI_POD),
        ScrapeTarget("vllm", addr, "/vllm"),
        ScrapeTarget(
            "vllm-pod", addr, "/vllm-llm-0", labels={"namespace": "team-a", "pod": "llm-0"}
        ),
    ]
    with PrometheusServer(targets, scrape_interval=1.0) as server:
        server.wait_for_targets_up(timeout=15)
        yield server


def test_generated_config_and_lifecycle_flags(prom: PrometheusServer) -> None:
    config = prom.config_path.read_text()
    assert "scrape_interval: 1s" in config
    assert config.count("honor_labels: false") == 5
    flags = prom.api("status/flags")
    assert flags["web.enable-lifecycle"] == "true"
    assert flags["storage.tsdb.path"] == str(prom.data_dir)
    assert flags["web.listen-address"] == f"127.0.0.1:{prom.port}"
    assert prom.api("status/buildinfo")["version"].startswith("2.")


def test_dcgm_device_series_have_exported_pod_labels(prom: PrometheusServer) -> None:
    # Device series carry no pod_uid; the pod labels they had moved to exported_*.
    result = prom.wait_for_series(
        'DCGM_FI_DEV_FB_USED{job="dcgm",pod_uid=""}', timeout=15, min_series=3
    )
    by_pod = {
        (s["metric"]["UUID"], s["metric"].get("exported_pod", "")): s["metric"] for s in result
    }
    assert set(by_pod) == {("GPU-0aaa", "llm-0"), ("GPU-0aaa", "nb-1"), ("GPU-1bbb", "")}
    assert by_pod[("GPU-0aaa", "llm-0")] == {
        "__name__": "DCGM_FI_DEV_FB_USED",
        "job": "dcgm",
        "instance": prom.targets_config[0].address,
        "gpu": "0",
        "UUID": "GPU-0aaa",
        "pci_bus_id": "00000000:10:00.0",
        "device": "nvidia0",
        "modelName": MODEL,
        "Hostname": NODE,
        "vgpu": "0",
        # the target's labels win ...
        **DCGM_POD,
        # ... and the exporter's are kept under exported_* (honor_labels: false)
        "exported_namespace": "team-a",
        "exported_pod": "llm-0",
        "exported_container": "server",
    }
    # An idle GPU's empty pod labels are absent, so nothing is exported: pod is the exporter's.
    idle = by_pod[("GPU-1bbb", "")]
    assert idle["pod"] == DCGM_POD["pod"]
    assert not {"exported_pod", "exported_namespace", "exported_container"} & set(idle)

    # Device values: every copy of a shared GPU's series has the physical totals.
    used = values_by(result, "UUID", "exported_pod")
    assert used == {
        ("GPU-0aaa", "llm-0"): 28_000,
        ("GPU-0aaa", "nb-1"): 28_000,
        ("GPU-1bbb", ""): 0,
    }
    free = values_by(prom.query('DCGM_FI_DEV_FB_FREE{job="dcgm"}'), "UUID", "exported_pod")
    assert free[("GPU-0aaa", "llm-0")] == 81_920 - 28_000
    assert free[("GPU-1bbb", "")] == 81_920
    util = values_by(prom.query('DCGM_FI_DEV_GPU_UTIL{job="dcgm",pod_uid=""}'), "UUID", "vgpu")
    assert util == {("GPU-0aaa", "0"): 70, ("GPU-0aaa", "1"): 70, ("GPU-1bbb", ""): 0}
    gr = values_by(prom.query('DCGM_FI_PROF_GR_ENGINE_ACTIVE{job="dcgm"}'), "UUID", "vgpu")
    assert gr == {("GPU-0aaa", "0"): 0.7, ("GPU-0aaa", "1"): 0.7, ("GPU-1bbb", ""): 0}


def test_dcgm_per_process_series_carry_each_pods_share(prom: PrometheusServer) -> None:
    util = prom.wait_for_series('DCGM_FI_DEV_GPU_UTIL{job="dcgm",pod_uid!=""}', min_series=2)
    assert values_by(util, "exported_namespace", "exported_pod", "exported_container") == {
        ("team-a", "llm-0", "server"): 45,
        ("team-b", "nb-1", "jupyter"): 25,
    }
    assert {s["metric"]["pod_uid"] for s in util} == {LLM.uid, NOTEBOOK.uid}
    assert {s["metric"]["pod"] for s in util} == {DCGM_POD["pod"]}
    fb = prom.query('sum by (UUID) (DCGM_FI_DEV_FB_USED{job="dcgm",pod_uid!=""})')
    assert values_by(fb, "UUID") == {("GPU-0aaa",): 28_000}  # MiB


def test_dcgm_without_target_labels_keeps_exporter_labels(prom: PrometheusServer) -> None:
    result = prom.wait_for_series('DCGM_FI_DEV_GPU_UTIL{job="dcgm-plain"}', min_series=2)
    labels = {s["metric"]["UUID"]: s["metric"] for s in result}
    assert labels["GPU-0aaa"]["pod"] == "llm-0"  # one pod of a shared GPU gets the labels
    assert labels["GPU-0aaa"]["namespace"] == "team-a"
    assert labels["GPU-0aaa"]["hostname"] == NODE  # lower-case style (dcgm-exporter main)
    assert "Hostname" not in labels["GPU-0aaa"]
    assert "pod" not in labels["GPU-1bbb"]  # empty label == no label
    assert not any(k.startswith("exported_") for m in labels.values() for k in m)
    assert values_by(result, "UUID") == {("GPU-0aaa",): 70, ("GPU-1bbb",): 0}


def test_hami_current_names(prom: PrometheusServer) -> None:
    used = prom.wait_for_series('hami_vgpu_memory_used_bytes{job="hami"}', min_series=2)
    assert values_by(used, "exported_namespace", "exported_pod", "exported_container") == {
        ("team-a", "llm-0", "server"): 20_000 * MIB,
        ("team-b", "nb-1", "jupyter"): 8_000 * MIB,
    }
    one = next(s["metric"] for s in used if s["metric"]["exported_pod"] == "llm-0")
    assert one["device_uuid"] == "GPU-0aaa"
    assert one["vdevice_index"] == "0"
    assert one["zone"] == "vGPU"
    assert one["pod"] == HAMI_POD["pod"]

    limit = prom.query('hami_vgpu_memory_limit_bytes{job="hami"}')
    assert values_by(limit, "exported_pod") == {("llm-0",): 40_960 * MIB, ("nb-1",): 81_920 * MIB}
    util = prom.query('hami_container_device_utilization_ratio{job="hami"}')
    assert values_by(util, "exported_pod") == {("llm-0",): 45, ("nb-1",): 25}  # 0-100

    host = prom.query('hami_host_gpu_memory_used_bytes{job="hami"}')
    assert values_by(host, "node", "device_index", "device_uuid") == {
        (NODE, "0", "GPU-0aaa"): 28_000 * MIB,
        (NODE, "1", "GPU-1bbb"): 0,
    }
    assert {s["metric"]["device_type"] for s in host} == {f"NVIDIA-{MODEL}"}
    host_util = prom.query('hami_host_gpu_utilization_ratio{job="hami"}')
    assert values_by(host_util, "device_uuid") == {("GPU-0aaa",): 70, ("GPU-1bbb",): 0}


def test_hami_legacy_names(prom: PrometheusServer) -> None:
    used = prom.wait_for_series('vGPU_device_memory_usage_in_bytes{job="hami"}', min_series=2)
    # Legacy label names do not collide with the target's, so nothing is renamed.
    assert values_by(used, "podnamespace", "podname", "ctrname", "deviceuuid", "vdeviceid") == {
        ("team-a", "llm-0", "server", "GPU-0aaa", "0"): 20_000 * MIB,
        ("team-b", "nb-1", "jupyter", "GPU-0aaa", "0"): 8_000 * MIB,
    }
    assert {s["metric"]["pod"] for s in used} == {HAMI_POD["pod"]}
    limit = prom.query('vGPU_device_memory_limit_in_bytes{job="hami"}')
    assert values_by(limit, "podname") == {("llm-0",): 40_960 * MIB, ("nb-1",): 81_920 * MIB}
    util = prom.query('Device_utilization_desc_of_container{job="hami"}')
    assert values_by(util, "podname") == {("llm-0",): 45, ("nb-1",): 25}
    host = prom.query('HostGPUMemoryUsage{job="hami"}')
    assert values_by(host, "nodeid", "deviceidx", "deviceuuid") == {
        (NODE, "0", "GPU-0aaa"): 28_000 * MIB,
        (NODE, "1", "GPU-1bbb"): 0,
    }
    core = prom.query('HostCoreUtilization{job="hami"}')
    assert values_by(core, "deviceuuid") == {("GPU-0aaa",): 70, ("GPU-1bbb",): 0}


def test_vllm_metrics(prom: PrometheusServer) -> None:
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        result = prom.wait_for_series(f'{{__name__="{name}",job="vllm"}}')
        assert values_by(result, "namespace", "pod", "model_name") == {
            ("team-a", "llm-0", "meta-llama/Llama-3.1-8B-Instruct"): 0.625
        }
    waiting = prom.wait_for_series('{__name__="vllm:num_requests_waiting",job="vllm-pod"}')
    # Per-pod target: namespace/pod come from the target labels, as with a PodMonitor.
    assert values_by(waiting, "namespace", "pod", "engine") == {("team-a", "llm-0", "0"): 3}
    running = prom.query('{__name__="vllm:num_requests_running",job="vllm-pod"}')
    assert [sample_value(s) for s in running] == [7]


def test_new_values_arrive_after_exporter_change(
    exporter: GpuTestExporter, prom: PrometheusServer
) -> None:
    busier = GpuState("GPU-9zzz", NODE, MODEL, 81_920, util_pct=90, index=2)
    exporter.set_metrics(dcgm_device_metrics([busier]), "/dcgm-plain")
    try:
        result = prom.wait_for_series('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-9zzz"}', timeout=10)
        assert [sample_value(s) for s in result] == [90]
    finally:
        exporter.set_metrics(dcgm_device_metrics(GPUS, hostname_label="hostname"), "/dcgm-plain")


def test_restart_on_same_data_keeps_old_samples_and_catches_up() -> None:
    """Stop Prometheus, change the exporter during the gap, start it again on the same data."""
    before = GpuState("GPU-0aaa", NODE, MODEL, 81_920, util_pct=30, pods=[NOTEBOOK])
    after = GpuState("GPU-0aaa", NODE, MODEL, 81_920, util_pct=80, pods=[NOTEBOOK])
    selector = 'DCGM_FI_DEV_GPU_UTIL{job="dcgm",UUID="GPU-0aaa"}'
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_metrics([before]), "/dcgm")
        server = PrometheusServer([ScrapeTarget("dcgm", exporter.address, "/dcgm")])
        try:
            server.start()
            port, data_dir = server.port, server.data_dir
            first = server.wait_for_series(selector, timeout=10)
            t_first = float(first[0]["value"][0])
            exporter.wait_for_scrapes(1, "/dcgm", timeout=10)  # a second sample
            server.stop()
            t_stop = time.time()
            assert not server.running

            exporter.set_metrics(dcgm_metrics([after]), "/dcgm")
            scrapes_in_gap = exporter.scrape_count("/dcgm")
            time.sleep(1.5)  # the gap: nothing scrapes (and ~5 s more until the first scrape)
            assert exporter.scrape_count("/dcgm") == scrapes_in_gap

            t_restart = time.time()
            server.start()
            assert (server.port, server.data_dir) == (port, data_dir)
            server.wait_for_series(
                selector, timeout=10, predicate=lambda r: sample_value(r[0]) == 80
            )

            # Old samples are still there (range query over the time before the stop).
            old = server.query_range(selector, start=t_first, end=t_stop - 0.5, step=0.5)
            assert len(old) == 1
            assert {float(v) for _, v in old[0]["values"]} == {30.0}

            # Raw samples: 30 before the stop, none in the gap, 80 after the restart.
            window = int(time.time() - t_first) + 2
            raw = server.query(f"{selector}[{window}s]")
            samples = [(float(t), float(v)) for t, v in raw[0]["values"]]
            old_raw = [v for t, v in samples if t <= t_stop]
            new_raw = [v for t, v in samples if t >= t_restart]
            assert old_raw
            assert set(old_raw) == {30.0}
            assert not [t for t, _ in samples if t_stop < t < t_restart]
            assert new_raw
            assert set(new_raw) == {80.0}
        finally:
            server.cleanup()
        assert not server.base_dir.exists()
