"""Ingest publishing usage batches on a real nats-server: one message per partition for an
instant, the same instant read again stored once (the same batch ids), every sample on the
per-workload view, and the one-sample format still there for an upgrade."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.usage.attribution import GpuInventory
from fracpilot_libs.usage.range_queries import points_by_instant
from fracpilot_libs.usage.samples import PublishedSeries
from helpers import counter, read_stream, read_usage, reset_nats, wait_for

pytestmark = pytest.mark.integration
GPUS = 300


def response(gpus: int, at: float) -> list[dict[str, Any]]:
    """A Prometheus range-query response: dcgm device series, one pod per GPU."""
    series = []
    for i in range(gpus):
        labels = {
            "UUID": f"GPU-{i:08d}",
            "gpu": "0",
            "Hostname": f"node-{i // 8}",
            "exported_namespace": f"team-{i % 7}",
            "exported_pod": f"svc{i}-5c8d9f7b6-q2w4x",
            "exported_container": "server",
        }
        for name, value in (
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", (i % 97) / 100),
            ("DCGM_FI_DEV_FB_USED", 20_000 + i),
            ("DCGM_FI_DEV_FB_FREE", 40_000 - i),
        ):
            series.append({"metric": {"__name__": name, **labels}, "values": [[at, str(value)]]})
    return series


async def stored_messages(url: str) -> list[str]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    count = await js.stream_info(subjects.usage_stream(0))
    partitions = int((count.config.metadata or {})[subjects.USAGE_PARTITIONS_METADATA])
    await nc.close()
    return [
        subject
        for p in range(partitions)
        for subject, _ in await read_stream(url, subjects.usage_stream(p))
    ]


@pytest.mark.parametrize("wire", ["batch", "sample"])
async def test_an_instant_is_published_once_in_batches_and_on_the_view(
    nats_url: str, wire: str
) -> None:
    await reset_nats(nats_url)
    settings = IngestSettings(
        nats={"url": nats_url},
        sources="prometheus",
        cluster="test",
        decision_partitions=4,
        usage_wire=wire,
        publish_window=2,  # smaller than the partitions: the window fills
    )
    service = IngestService(settings)
    bus = service.runtime.bus
    await bus.connect()
    await bus.ensure_streams()
    view: list[UsageSample] = []
    nc = await nats.connect(nats_url)

    async def on_view(msg: Any) -> None:
        view.append(UsageSample.model_validate_json(msg.data))

    await nc.subscribe(f"{subjects.USAGE_VIEW_PREFIX}.>", cb=on_view)
    await nc.flush()
    try:
        (points,) = points_by_instant(response(GPUS, float(int(time.time())))).values()
        sent = await service.publish_instant("prometheus", points, GpuInventory())
        assert sent == GPUS
        service.published_series = PublishedSeries()  # as after a restart: read again
        again = await service.publish_instant("prometheus", points, GpuInventory())
        assert again == GPUS  # read again: acknowledged as duplicates, stored once
    finally:
        await bus.close()
    samples = [UsageSample.model_validate_json(data) for _, data in await read_usage(nats_url)]
    assert sorted(s.sample_id for s in samples) == sorted({s.sample_id for s in samples})
    assert len(samples) == GPUS
    messages = await stored_messages(nats_url)
    if wire == "batch":
        assert all(subjects.is_usage_batch(s) for s in messages)
        assert len(messages) == 4  # 300 samples, one batch per partition
        await wait_for(lambda: len(view) >= GPUS)
        await asyncio.sleep(0.2)
        assert sorted(s.sample_id for s in view) == sorted(s.sample_id for s in samples)
    else:
        assert len(messages) == GPUS
        assert not view
    reg = service.runtime.registry
    published = counter(
        reg, "fracpilot_ingest_samples_published_total", source="prometheus", attribution="exact"
    ) + counter(
        reg,
        "fracpilot_ingest_samples_published_total",
        source="prometheus",
        attribution="estimated",
    )
    assert published == 2 * GPUS
    await nc.close()
