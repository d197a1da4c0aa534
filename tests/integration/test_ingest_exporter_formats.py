"""Ingest of what real exporters serve in cases real clusters have, through a real Prometheus.

- a T4 whose driver reserves memory (``DCGM_FI_DEV_FB_RESERVED``): the device's total is the
  card's, not used + free;
- two MIG 3g.40gb instances of one A100, one pod each: each pod gets its own instance's
  numbers, exactly (compute as a share of the whole card);
- a lone labelled pod on a GPU the allocations say is shared: an estimated split;
- HAMi with the chart's defaults (no device-memory default configured): samples flow, the
  device memory from HAMi's scheduler series;
- vLLM's preemption counter rising: one sample says ``contention_event``, and the engine
  upsizes on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import (
    Allocation,
    Attribution,
    Policy,
    ReasonCode,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState
from helpers import put_allocations, read_usage, reset_nats, running, wait_for
from support.dcgm_prometheus import DCGM_POD
from support.gpu_exporter import (
    GpuState,
    GpuTestExporter,
    MigInstanceState,
    PodOnGpu,
    VllmState,
    dcgm_device_metrics,
    hami_metrics,
    hami_scheduler_metrics,
    vllm_metrics_for_pod,
)
from support.prometheus_server import PrometheusServer, ScrapeTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1024 * 1024
GIB = 1024 * MIB
STEP = 1.0

# A T4 as nvidia-smi and dcgm-exporter show one: 15360 MiB card, 447 MiB reserved.
T4_CARD_MIB = 15_360
T4_POD = PodOnGpu("team-t", "asr-0", "server", util_pct=30, memory_used_mib=5_120)
T4 = GpuState(
    "GPU-7a4e0c1d-0000-4000-8000-0000000000t4",
    "gpu-node-t4",
    "Tesla T4",
    5_120 + 9_791 + 447,
    util_pct=30,
    pods=[T4_POD],
    memory_reserved_mib=447,
)

A100_UUID = "GPU-3f0a1b2c-0000-4000-8000-000000000a10"
MIG_CHAT = PodOnGpu("team-a", "chat-5c8d9f7b6-q2w4x", "server", util_pct=0, memory_used_mib=20_000)
MIG_EMBED = PodOnGpu("team-b", "embed-0", "worker", util_pct=0, memory_used_mib=8_000)
MIG_A100 = GpuState(
    A100_UUID,
    "gpu-node-mig",
    "NVIDIA A100-SXM4-80GB",
    81_920,
    util_pct=0,
    mig=[
        MigInstanceState(1, "3g.40gb", 40_192, gr_engine_active=0.6, pod=MIG_CHAT),
        MigInstanceState(2, "3g.40gb", 40_192, gr_engine_active=0.35, pod=MIG_EMBED),
    ],
)

SHARED_UUID = "GPU-5b6c7d8e-0000-4000-8000-0000000000sh"
LONE = PodOnGpu("team-c", "rag-6d9f8c7b5-z8x7c", "server", util_pct=0, memory_used_mib=0)
NEIGHBOUR = PodOnGpu("team-c", "ocr-0", "worker", util_pct=0, memory_used_mib=0)
# dcgm without virtual GPUs: the device series name only the first pod of a shared GPU.
SHARED = GpuState(
    SHARED_UUID,
    "gpu-node-2",
    "NVIDIA A100-SXM4-80GB",
    81_920,
    util_pct=80,
    pods=[LONE, NEIGHBOUR],
    memory_used_mib=30_000,
)


HAMI_POD = PodOnGpu(
    "team-h", "tts-7d8f9c6b5-k2j4h", "server", util_pct=40, memory_used_mib=6_000,
    memory_limit_mib=12_000,
)  # fmt: skip
HAMI_GPU = GpuState(
    "GPU-9c8d7e6f-0000-4000-8000-00000000hami",
    "gpu-node-hami",
    "NVIDIA L4",
    23_034,
    util_pct=40,
    pods=[HAMI_POD],
)
LLM = PodOnGpu(
    "team-l", "llm-6c7d8f9b5-r4t6y", "vllm", util_pct=50, memory_used_mib=30_000,
    vllm=VllmState(kv_cache_usage=0.9, num_preemptions=3),
)  # fmt: skip
LLM_GPU = GpuState(
    "GPU-1c2d3e4f-0000-4000-8000-0000000000ll", "gpu-node-3", "NVIDIA L40S", 46_068, 50, [LLM]
)
LLM_TARGET = {"namespace": LLM.namespace, "pod": LLM.pod, "container": LLM.container}
HAMI_MONITOR_POD = {"namespace": "kube-system", "pod": "hami-device-plugin-4xk8q"}
HAMI_SCHEDULER_POD = {"namespace": "kube-system", "pod": "hami-scheduler-6b9f7d5c4-p2m8n"}


@pytest.fixture(scope="module")
def exporter() -> Iterator[GpuTestExporter]:
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_device_metrics([T4]), "/t4")
        exporter.set_metrics(dcgm_device_metrics([MIG_A100]), "/mig")
        exporter.set_metrics(dcgm_device_metrics([SHARED]), "/shared")
        exporter.set_metrics(hami_metrics([HAMI_GPU]), "/hami-monitor")
        exporter.set_metrics(hami_scheduler_metrics([HAMI_GPU]), "/hami-scheduler")
        exporter.set_metrics(dcgm_device_metrics([LLM_GPU]), "/llm-dcgm")
        exporter.set_metrics(vllm_metrics_for_pod(LLM), "/llm-vllm")
        yield exporter


@pytest.fixture(scope="module")
def prom(exporter: GpuTestExporter) -> Iterator[PrometheusServer]:
    addr = exporter.address
    targets = [
        ScrapeTarget("t4", addr, "/t4", labels=DCGM_POD),
        ScrapeTarget("mig", addr, "/mig", labels=DCGM_POD),
        ScrapeTarget("shared", addr, "/shared", labels=DCGM_POD),
        # HAMi's chart's ServiceMonitors scrape vGPUmonitor and the scheduler alike.
        ScrapeTarget("hami-monitor", addr, "/hami-monitor", labels=HAMI_MONITOR_POD),
        ScrapeTarget("hami-scheduler", addr, "/hami-scheduler", labels=HAMI_SCHEDULER_POD),
        ScrapeTarget("llm-dcgm", addr, "/llm-dcgm", labels=DCGM_POD),
        # vLLM names no pod: a PodMonitor's target labels do.
        ScrapeTarget("llm-vllm", addr, "/llm-vllm", labels=LLM_TARGET),
    ]
    with PrometheusServer(targets, scrape_interval=STEP) as server:
        server.wait_for_targets_up(timeout=30)
        for job in ("t4", "mig", "shared"):
            server.wait_for_series(f'DCGM_FI_DEV_FB_USED{{job="{job}"}}', timeout=30)
        server.wait_for_series("hami_gpu_memory_limit_bytes", timeout=30)
        yield server


def settings(nats_url: str, **overrides: object) -> IngestSettings:
    base: dict[str, object] = {
        "nats": {"url": nats_url},
        "interval_s": STEP,
        "backfill_s": 5.0,
        "cluster": "test",
        "sources": "prometheus",
    }
    base.update(overrides)
    return IngestSettings(**base)  # type: ignore[arg-type]


def _published(service: IngestService) -> float:
    return sum(
        s.value
        for m in service.metrics.published.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


async def ingest_latest(service: IngestService, url: str, pods: int) -> dict[str, UsageSample]:
    async with running(service):
        await wait_for(lambda: service.cycles >= 2, timeout=30)
        await wait_for(lambda: _published(service) >= pods, timeout=30)
    latest: dict[str, UsageSample] = {}
    samples = [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]
    for s in sorted(samples, key=lambda s: s.timestamp):
        latest[s.pod] = s
    return latest


async def test_t4_device_memory_counts_the_reserved_memory(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        settings(nats_url, prometheus={"url": prom.url, "matchers": 'job="t4"'})
    )
    latest = await ingest_latest(service, nats_url, pods=1)
    sample = latest[T4_POD.pod]
    card = T4_CARD_MIB * MIB
    assert abs(sample.memory_total_bytes - card) / card < 0.005
    assert sample.memory_used_bytes == 5_120 * MIB
    assert sample.attribution is Attribution.EXACT


async def test_two_mig_instances_of_one_card_are_two_devices(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        settings(nats_url, prometheus={"url": prom.url, "matchers": 'job="mig"'})
    )
    latest = await ingest_latest(service, nats_url, pods=2)
    chat, embed = latest[MIG_CHAT.pod], latest[MIG_EMBED.pod]
    assert chat.gpu_uuid == f"{A100_UUID}/GI1"
    assert embed.gpu_uuid == f"{A100_UUID}/GI2"
    assert chat.gpu_model == embed.gpu_model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    # GR_ENGINE_ACTIVE is relative to the instance: a 3g instance is 3/7 of the card.
    assert chat.compute == pytest.approx(0.6 * 3 / 7)
    assert embed.compute == pytest.approx(0.35 * 3 / 7)
    assert chat.memory_used_bytes == 20_000 * MIB
    assert embed.memory_used_bytes == 8_000 * MIB
    # memory on the card's scale too: a 3g.40gb holds 4 of the card's 8 memory slices
    assert chat.memory_total_bytes == embed.memory_total_bytes == 2 * 40_192 * MIB
    assert chat.attribution is Attribution.EXACT
    assert embed.attribution is Attribution.EXACT


async def test_lone_labelled_pod_on_a_gpu_with_two_allocations_is_split(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    await put_allocations(
        nats_url,
        *(
            Allocation(
                workload=WorkloadRef(
                    cluster="test", namespace=pod.namespace, owner_kind=kind, owner_name=owner
                ),
                pod=pod.pod,
                node="gpu-node-2",
                gpu_uuid=SHARED_UUID,
                fraction=fraction,
                device_memory_bytes=80 * GIB,
                updated_at=datetime.now(UTC),
            )
            for pod, owner, kind, fraction in (
                (LONE, "rag", "Deployment", 0.5),
                (NEIGHBOUR, "ocr", "StatefulSet", 0.25),
            )
        ),
    )
    service = IngestService(
        settings(nats_url, prometheus={"url": prom.url, "matchers": 'job="shared"'})
    )
    latest = await ingest_latest(service, nats_url, pods=2)
    lone, neighbour = latest[LONE.pod], latest[NEIGHBOUR.pod]
    assert lone.attribution is Attribution.ESTIMATED
    assert neighbour.attribution is Attribution.ESTIMATED
    assert lone.compute == pytest.approx(0.8 * 2 / 3)
    assert neighbour.compute == pytest.approx(0.8 * 1 / 3)
    assert lone.memory_used_bytes == pytest.approx(30_000 * MIB * 2 / 3, abs=1)
    assert neighbour.memory_used_bytes == pytest.approx(30_000 * MIB * 1 / 3, abs=1)


async def test_hami_with_the_charts_defaults_takes_device_memory_from_the_scheduler(
    nats_url: str, prom: PrometheusServer
) -> None:
    # The chart's defaults: every mapping family, no default device memory.
    assert IngestSettings().default_device_memory_gib is None
    await reset_nats(nats_url)
    service = IngestService(
        settings(nats_url, prometheus={"url": prom.url, "matchers": 'job=~"hami-.*"'})
    )
    latest = await ingest_latest(service, nats_url, pods=1)
    sample = latest[HAMI_POD.pod]
    assert sample.memory_total_bytes == 23_034 * MIB
    assert (sample.compute, sample.memory_used_bytes) == (0.40, 6_000 * MIB)
    assert sample.attribution is Attribution.EXACT
    assert sample.gpu_model == "NVIDIA L4"


async def test_vllm_preemptions_rising_is_a_contention_signal_the_engine_upsizes_on(
    nats_url: str, prom: PrometheusServer, exporter: GpuTestExporter
) -> None:
    await reset_nats(nats_url)
    workload = WorkloadRef(cluster="test", namespace=LLM.namespace, owner_name="llm")
    allocation = Allocation(
        workload=workload,
        pod=LLM.pod,
        node=LLM_GPU.node,
        gpu_uuid=LLM_GPU.uuid,
        fraction=0.5,
        device_memory_bytes=LLM_GPU.memory_total_mib * MIB,
        updated_at=datetime.now(UTC),
    )
    await put_allocations(nats_url, allocation)
    service = IngestService(
        settings(nats_url, prometheus={"url": prom.url, "matchers": 'job=~"llm-.*"'})
    )
    async with running(service):
        await wait_for(lambda: _published(service) >= 2, timeout=30)
        calm = await _llm_samples(nats_url)
        assert calm
        assert not any(s.signals and s.signals.contention_event for s in calm)
        more = VllmState(kv_cache_usage=0.95, num_preemptions=5)
        exporter.set_metrics(vllm_metrics_for_pod(replace(LLM, vllm=more)), "/llm-vllm")
        await wait_for_async(nats_url, lambda samples: any(_contended(s) for s in samples))
    samples = await _llm_samples(nats_url)
    contended = [s for s in samples if _contended(s)]
    assert len(contended) == 1  # one rise, one event
    event = contended[0]
    assert event.signals is not None
    assert event.signals.kv_cache_usage == pytest.approx(0.95)
    state = WorkloadState(current_fraction=0.5, samples=10, first_seen=0.0)
    _, decision = decide(state, event, Policy())
    assert decision is not None
    assert decision.reason is ReasonCode.CONTENTION_SIGNAL
    assert decision.new_fraction > 0.5


def _contended(sample: UsageSample) -> bool:
    return bool(sample.signals and sample.signals.contention_event)


async def _llm_samples(url: str) -> list[UsageSample]:
    samples = [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]
    return [s for s in samples if s.pod == LLM.pod]


async def wait_for_async(
    url: str, check: Callable[[list[UsageSample]], bool], timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while not check(await _llm_samples(url)):
        if time.monotonic() > deadline:
            raise TimeoutError("no such sample in time")
        await asyncio.sleep(0.2)
