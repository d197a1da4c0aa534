"""The GPU's model reaches each sample from the exporters' own labels (dcgm ``modelName``,
HAMi ``device_type`` and legacy ``devicetype``), so money saved is priced per card."""

from __future__ import annotations

import pytest

from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.owners import owner_from_pod_name
from fracpilot_libs.pricing import DEFAULT_GPU_PRICES, GpuPrices
from fracpilot_libs.usage.attribution import GpuInventory, observe_points
from fracpilot_libs.usage.mappings import MappingTable, gpu_model_name
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from support.gpu_exporter import Exposition, GpuState, PodOnGpu, dcgm_metrics, hami_metrics

T = 1_772_409_600.0  # 2026-03-02T00:00:00Z
CHAT = PodOnGpu("team-a", "chat-5c8d9f7b6-q2w4x", "server", util_pct=45, memory_used_mib=20_000)
EMBED = PodOnGpu("team-b", "embed-0", "worker", util_pct=25, memory_used_mib=8_000)
A100 = GpuState("GPU-0aaa", "node-1", "NVIDIA A100-SXM4-80GB", 81_920, 70, pods=[CHAT, EMBED])
T4 = GpuState("GPU-1bbb", "node-2", "Tesla T4", 15_360, 30, pods=[], index=1)


def samples(exposition: Exposition, families: tuple[str, ...]) -> list[UsageSample]:
    table = MappingTable.of(families)
    points = parse_exposition(exposition.text(), set(table.metric_names), "exporter:9400", T)
    observations, _ = observe_points(
        points, table, GpuInventory(default_device_memory_bytes=80 * 1024**3)
    )
    published = PublishedSeries()
    out = []
    for obs in observations:
        owner = owner_from_pod_name("test", obs.pod.namespace, obs.pod.pod)
        result = to_sample(obs, owner, "scrape", T, 3600, published)
        assert isinstance(result, UsageSample), result
        out.append(result)
    return out


@pytest.mark.parametrize(
    ("exposition", "families"),
    [
        (dcgm_metrics([A100, T4], per_process=True), ("dcgm", "dcgm-process")),
        (dcgm_metrics([A100, T4]), ("dcgm",)),
        (hami_metrics([A100, T4], names="current"), ("hami",)),
        (hami_metrics([A100, T4], names="legacy"), ("hami-legacy",)),
    ],
    ids=["dcgm-per-process", "dcgm-device", "hami", "hami-legacy"],
)
def test_every_exporter_names_the_card_as_dcgm_does(
    exposition: Exposition, families: tuple[str, ...]
) -> None:
    found = samples(exposition, families)
    assert {s.pod for s in found} >= {CHAT.pod}
    assert {s.gpu_model for s in found} == {"NVIDIA A100-SXM4-80GB"}


def test_the_model_prices_the_sample() -> None:
    (sample, *_) = samples(dcgm_metrics([A100], per_process=True), ("dcgm", "dcgm-process"))
    assert GpuPrices().hourly(sample.gpu_model) == DEFAULT_GPU_PRICES["A100 80GB"]


def test_a_series_without_a_model_label_leaves_it_empty() -> None:
    text = dcgm_metrics([A100], per_process=True).text().replace("modelName=", "model_x=")
    table = MappingTable.of(("dcgm", "dcgm-process"))
    points = parse_exposition(text, set(table.metric_names), "exporter:9400", T)
    observations, _ = observe_points(points, table, GpuInventory())
    assert observations
    assert {o.gpu_model for o in observations} == {""}


@pytest.mark.parametrize(
    ("label", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),  # dcgm modelName
        ("NVIDIA-NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),  # HAMi device_type
        ("NVIDIA-Tesla T4", "Tesla T4"),  # HAMi, an older card's NVML name
        ("  NVIDIA H100 80GB HBM3 ", "NVIDIA H100 80GB HBM3"),
        ("", ""),
        ("x" * 300, "x" * 128),  # bounded as UsageSample.gpu_model is
    ],
)
def test_gpu_model_name(label: str, model: str) -> None:
    assert gpu_model_name(label) == model


def test_the_test_exporter_renders_mig_instances_and_reserved_memory_as_dcgm_does() -> None:
    from support.gpu_exporter import MigInstanceState, dcgm_device_metrics

    pod = PodOnGpu("team-a", "chat-0", "server", util_pct=0, memory_used_mib=1_000)
    mig = GpuState(
        "GPU-0ccc",
        "node-3",
        "NVIDIA A100-SXM4-80GB",
        81_920,
        0,
        mig=[MigInstanceState(2, "3g.40gb", 40_192, 0.5, pod=pod)],
    )
    out = dcgm_device_metrics([mig])
    assert "DCGM_FI_DEV_GPU_UTIL" not in out.names()  # no value on an instance
    (labels,) = out.label_sets("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert labels[:7] == (
        "gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID"
    )  # fmt: skip
    assert out.value("DCGM_FI_DEV_FB_FREE", GPU_I_ID="2") == 40_192 - 1_000
    t4 = GpuState("GPU-1ddd", "n", "Tesla T4", 15_360, 0, [pod], memory_reserved_mib=447)
    rendered = dcgm_device_metrics([t4])
    assert rendered.value("DCGM_FI_DEV_FB_RESERVED", UUID="GPU-1ddd") == 447
    assert rendered.value("DCGM_FI_DEV_FB_FREE", UUID="GPU-1ddd") == 15_360 - 1_000 - 447
