"""Ingest against a real Prometheus (Debian's binary) scraping the GPU test exporter.

- dcgm-exporter per-process series (labels renamed to ``exported_*`` by Prometheus, as in a
  cluster) give each pod of a shared GPU its own exact numbers;
- dcgm device series only: the pods sharing the GPU get estimated samples split by their
  allocated fractions;
- HAMi in the v2.9+ names and in the legacy names give the same exact samples;
- the ``scrape`` source gives the same samples as the ``prometheus`` source;
- Prometheus stopped for a while and started again: catch-up publishes the missed interval
  once, with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import Allocation, Attribution, UsageSample, WorkloadRef
from helpers import put_allocations, read_usage, reset_nats, running, wait_for
from support.dcgm_prometheus import DCGM_POD
from support.gpu_exporter import (
    GpuState,
    GpuTestExporter,
    PodOnGpu,
    dcgm_device_metrics,
    dcgm_metrics,
    hami_metrics,
)
from support.prometheus_server import PrometheusServer, ScrapeTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1024 * 1024
GIB = 1024 * MIB
CHAT = PodOnGpu(
    "team-a",
    "chat-5c8d9f7b6-q2w4x",
    "server",
    util_pct=45,
    memory_used_mib=20_000,
    memory_limit_mib=40_960,
)
EMBED = PodOnGpu(
    "team-b", "embed-0", "worker", util_pct=25, memory_used_mib=8_000, memory_limit_mib=20_480
)
SHARED = GpuState(
    "GPU-0aaa",
    "gpu-node-1",
    "NVIDIA A100-SXM4-80GB",
    81_920,
    util_pct=70,
    pods=[CHAT, EMBED],
    index=0,
)
IDLE = GpuState("GPU-1bbb", "gpu-node-1", "NVIDIA A100-SXM4-80GB", 81_920, util_pct=0, index=1)
GPUS = [SHARED, IDLE]
STEP = 1.0


@pytest.fixture(scope="module")
def exporter() -> Iterator[GpuTestExporter]:
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_metrics(GPUS, per_process=True), "/dcgm")
        exporter.set_metrics(dcgm_device_metrics(GPUS, virtual_gpus=True), "/dcgm-device")
        exporter.set_metrics(hami_metrics(GPUS, names="current"), "/hami")
        exporter.set_metrics(hami_metrics(GPUS, names="legacy"), "/hami-legacy")
        yield exporter


@pytest.fixture(scope="module")
def prom(exporter: GpuTestExporter) -> Iterator[PrometheusServer]:
    addr = exporter.address
    targets = [
        ScrapeTarget("dcgm", addr, "/dcgm", labels=DCGM_POD),
        ScrapeTarget("dcgm-device", addr, "/dcgm-device"),
        ScrapeTarget("hami", addr, "/hami"),
        ScrapeTarget("hami-legacy", addr, "/hami-legacy"),
    ]
    with PrometheusServer(targets, scrape_interval=STEP) as server:
        server.wait_for_targets_up(timeout=30)
        server.wait_for_series('DCGM_FI_DEV_FB_USED{job="dcgm"}', timeout=30)
        server.wait_for_series('HostGPUMemoryUsage{job="hami-legacy"}', timeout=30)
        yield server


def settings(nats_url: str, **overrides: object) -> IngestSettings:
    base: dict[str, object] = {
        "nats": {"url": nats_url},
        "interval_s": STEP,
        "backfill_s": 5.0,
        "cluster": "test",
        "default_device_memory_gib": 80.0,
    }
    base.update(overrides)
    return IngestSettings(**base)  # type: ignore[arg-type]


async def samples_in_stream(url: str) -> list[UsageSample]:
    return [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]


def latest_by_pod(samples: list[UsageSample]) -> dict[str, UsageSample]:
    out: dict[str, UsageSample] = {}
    for s in sorted(samples, key=lambda s: s.timestamp):
        out[s.pod] = s
    return out


async def ingest_until(service: IngestService, url: str, pods: int) -> dict[str, UsageSample]:
    async with running(service):
        await wait_for(lambda: service.cycles >= 2, timeout=30)
        await wait_for(lambda: _published(service) >= pods, timeout=30)
    return latest_by_pod(await samples_in_stream(url))


def _published(service: IngestService) -> float:
    return sum(
        s.value
        for m in service.metrics.published.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


async def test_dcgm_per_process_samples_are_exact_with_renamed_labels(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        settings(
            nats_url,
            sources="prometheus",
            prometheus={"url": prom.url, "matchers": 'job="dcgm"'},
            mapping_families="dcgm,dcgm-process",
        )
    )
    latest = await ingest_until(service, nats_url, pods=2)
    assert set(latest) == {CHAT.pod, EMBED.pod}  # the idle GPU and the exporter's pod: none
    chat, embed = latest[CHAT.pod], latest[EMBED.pod]
    assert chat.workload == WorkloadRef(
        cluster="test", namespace="team-a", owner_kind="Deployment", owner_name="chat"
    )
    assert embed.workload.owner_kind == "StatefulSet"
    assert embed.workload.owner_name == "embed"
    assert (chat.compute, chat.memory_used_bytes) == (0.45, 20_000 * MIB)
    assert (embed.compute, embed.memory_used_bytes) == (0.25, 8_000 * MIB)
    assert chat.memory_total_bytes == 81_920 * MIB  # FB_USED + FB_FREE of the device
    assert chat.attribution is Attribution.EXACT
    assert embed.attribution is Attribution.EXACT
    assert chat.gpu_uuid == "GPU-0aaa"
    assert chat.node == "gpu-node-1"


async def test_device_only_metrics_are_split_by_allocated_fraction(
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
                node="gpu-node-1",
                gpu_uuid="GPU-0aaa",
                fraction=fraction,
                device_memory_bytes=80 * GIB,
                updated_at=datetime.now(UTC),
            )
            for pod, owner, kind, fraction in (
                (CHAT, "chat", "Deployment", 0.5),
                (EMBED, "embed", "StatefulSet", 0.25),
            )
        ),
    )
    service = IngestService(
        settings(
            nats_url,
            sources="prometheus",
            prometheus={"url": prom.url, "matchers": 'job="dcgm-device"'},
            mapping_families="dcgm",
        )
    )
    latest = await ingest_until(service, nats_url, pods=2)
    chat, embed = latest[CHAT.pod], latest[EMBED.pod]
    device_util = 0.70
    device_used = (CHAT.memory_used_mib + EMBED.memory_used_mib) * MIB
    assert chat.attribution is Attribution.ESTIMATED
    assert embed.attribution is Attribution.ESTIMATED
    assert chat.compute == pytest.approx(device_util * 2 / 3)
    assert embed.compute == pytest.approx(device_util * 1 / 3)
    assert chat.memory_used_bytes == pytest.approx(device_used * 2 / 3, abs=1)
    assert embed.memory_used_bytes == pytest.approx(device_used * 1 / 3, abs=1)
    assert chat.allocated_fraction == 0.5
    assert embed.allocated_fraction == 0.25


@pytest.mark.parametrize(("job", "family"), [("hami", "hami"), ("hami-legacy", "hami-legacy")])
async def test_hami_both_naming_generations_give_the_same_exact_samples(
    nats_url: str, prom: PrometheusServer, job: str, family: str
) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        settings(
            nats_url,
            sources="prometheus",
            prometheus={"url": prom.url, "matchers": f'job="{job}"'},
            mapping_families=family,
        )
    )
    latest = await ingest_until(service, nats_url, pods=2)
    chat, embed = latest[CHAT.pod], latest[EMBED.pod]
    assert (chat.compute, chat.memory_used_bytes) == (0.45, 20_000 * MIB)
    assert (embed.compute, embed.memory_used_bytes) == (0.25, 8_000 * MIB)
    assert chat.attribution is Attribution.EXACT
    assert chat.memory_total_bytes == 80 * GIB  # HAMi gives no device total: the default


async def test_scrape_source_matches_the_prometheus_source(
    nats_url: str, prom: PrometheusServer, exporter: GpuTestExporter
) -> None:
    def values(latest: dict[str, UsageSample]) -> dict[str, tuple[object, ...]]:
        return {
            pod: (
                s.workload,
                s.gpu_uuid,
                s.node,
                s.compute,
                s.memory_used_bytes,
                s.memory_total_bytes,
                s.attribution,
            )
            for pod, s in latest.items()
        }

    await reset_nats(nats_url)
    via_prometheus = await ingest_until(
        IngestService(
            settings(
                nats_url,
                sources="prometheus",
                prometheus={"url": prom.url, "matchers": 'job="dcgm-device"'},
                mapping_families="dcgm,dcgm-process",
            )
        ),
        nats_url,
        pods=2,
    )
    await reset_nats(nats_url)
    via_scrape = await ingest_until(
        IngestService(
            settings(
                nats_url,
                sources="scrape",
                scrape_targets=exporter.url("/dcgm-device"),
                mapping_families="dcgm,dcgm-process",
            )
        ),
        nats_url,
        pods=2,
    )
    assert values(via_scrape) == values(via_prometheus)
    assert {s.source for s in via_scrape.values()} == {"scrape"}


async def test_catch_up_after_prometheus_was_down_publishes_the_gap_once(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        settings(
            nats_url,
            sources="prometheus",
            prometheus={"url": prom.url, "matchers": 'job="hami"'},
            mapping_families="hami",
        )
    )
    async with running(service):
        await wait_for(lambda: _published(service) >= 4, timeout=30)
        prom.stop()
        down_at = time.time()
        await asyncio.sleep(6)
        errors_while_down = service.metrics.source_errors.labels("prometheus")._value.get()
        prom.start()
        prom.wait_for_series('hami_vgpu_memory_used_bytes{job="hami"}', timeout=30)
        up_at = time.time()
        await wait_for(lambda: _newest(service) > up_at + 2 * STEP, timeout=45)
    samples = await samples_in_stream(nats_url)
    per_pod: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        per_pod[s.pod].append(s.timestamp.timestamp())
    assert errors_while_down >= 1  # it noticed Prometheus was gone
    assert len({s.sample_id for s in samples}) == len(samples)  # no duplicate
    for pod, stamps in per_pod.items():
        stamps.sort()
        assert len(set(stamps)) == len(stamps), f"{pod}: an instant published twice"
        steps = {round(b - a, 3) for a, b in itertools.pairwise(stamps)}
        assert steps == {STEP}, f"{pod}: gap in {steps}"  # every instant, down time included
        assert stamps[0] < down_at < up_at < stamps[-1]


def _newest(service: IngestService) -> float:
    return max(service.published_series.newest.values(), default=0.0)
