"""The sources as the service runs them: built from the settings, read, published, paced."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_ingest.settings import IngestSettings, SimulatorSettings
from fracpilot_ingest.sources import make_sources
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_ingest.sources.prometheus import CURSOR_KEY, PrometheusSource
from fracpilot_ingest.sources.scrape import ScrapeSource, scrape_targets
from fracpilot_ingest.sources.simulator import SimulatorSource, simulated_sample
from fracpilot_libs.contracts import Allocation, Attribution
from fracpilot_libs.nats.kv import KvEntry
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.simulation.workloads import demo_workloads
from fracpilot_libs.usage.samples import PublishedSeries

START = datetime(2026, 3, 2, tzinfo=UTC)


class FakeKv:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def get(self, key: str) -> KvEntry | None:
        if key not in self.values:
            return None
        return KvEntry(key, self.values[key], 1)

    async def put(self, key: str, value: bytes) -> int:
        self.values[key] = value
        return 1


def context(
    allocations: dict[str, Allocation] | None = None, kv: FakeKv | None = None
) -> SourceContext:
    store = kv or FakeKv()

    async def state() -> Any:
        return store

    return SourceContext(
        metrics=IngestMetrics(CollectorRegistry(), GpuPrices.with_overrides({}, None), 10),
        metric_names=("DCGM_FI_DEV_GPU_UTIL",),
        published_series=PublishedSeries(),
        allocations=allocations if allocations is not None else {},
        state=state,
    )


def test_sources_are_built_from_the_settings_in_their_order() -> None:
    settings = IngestSettings(sources="scrape, prometheus,simulator", scrape_targets="a:1,b:2")
    sources = make_sources(settings, context())
    assert [s.name for s in sources] == ["scrape", "prometheus", "simulator"]
    scrape = sources[0]
    assert isinstance(scrape, ScrapeSource)
    assert scrape.targets == ["a:1", "b:2"]


@pytest.mark.parametrize("names", ["", "simulator,carrier-pigeon"])
def test_an_unknown_or_no_source_is_refused(names: str) -> None:
    with pytest.raises(ValueError, match="unknown source"):
        make_sources(IngestSettings(sources=names), context())


def test_scrape_targets_parse() -> None:
    assert scrape_targets(" a:1, ,http://b/metrics ") == ["a:1", "http://b/metrics"]


def test_settings_groups_keep_the_flat_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "FRACPILOT_SIM_SPEED": "60",
        "FRACPILOT_SIM_STEP_S": "30",
        "FRACPILOT_SIM_DURATION_S": "0",
        "FRACPILOT_PROMETHEUS_URL": "http://prom:9090",
        "FRACPILOT_PROMETHEUS_MATCHERS": 'job="dcgm"',
        "FRACPILOT_PROMETHEUS_DELAY_S": "30",
        "FRACPILOT_INTERVAL_S": "5",
        "FRACPILOT_SCRAPE_TARGETS": "a:1",
    }.items():
        monkeypatch.setenv(name, value)
    s = IngestSettings()
    assert (s.sim.speed, s.sim.step_s, s.sim.duration_s) == (60, 30, 0)
    assert s.sim.namespace == "inference"  # the rest of the group keeps its defaults
    assert (s.prometheus.url, s.prometheus.matchers, s.prometheus.delay_s) == (
        "http://prom:9090",
        'job="dcgm"',
        30,
    )
    assert (s.interval_s, s.scrape_targets) == (5, "a:1")


def test_a_simulated_sample_is_where_the_allocation_puts_it() -> None:
    w = next(w for w in demo_workloads() if w.preallocates is None)  # usage not by fraction
    unplaced = simulated_sample(w, START, None)
    assert (unplaced.pod, unplaced.node, unplaced.allocated_fraction) == (w.pod, "", None)
    assert unplaced.attribution is Attribution.EXACT
    assert unplaced.sample_id == f"sim|{w.workload.key}|{int(START.timestamp())}"
    placed = Allocation(
        workload=w.workload,
        pod="chat-x",
        node="node-a",
        gpu_uuid="GPU-1",
        fraction=0.25,
        device_memory_bytes=80 * 1024**3,
        updated_at=START,
    )
    sample = simulated_sample(w, START, placed)
    assert (sample.pod, sample.node, sample.gpu_uuid, sample.allocated_fraction) == (
        "chat-x",
        "node-a",
        "GPU-1",
        0.25,
    )
    assert (sample.compute, sample.memory_used_bytes) == (
        unplaced.compute,
        unplaced.memory_used_bytes,
    )


async def test_the_simulator_produces_its_span_step_by_step_then_ends() -> None:
    ctx = context()
    settings = SimulatorSettings(start=START, step_s=60, speed=6000, duration_s=180, workloads=2)
    source = SimulatorSource(settings, ctx)
    await source.open()
    readings = []
    while (reading := await source.read()) is not None:
        readings.append(reading)
        await source.published(reading)
        assert source.next_read_in() <= 0.01 * len(readings) + 0.01  # 60 s at 6000x: 10 ms
    assert len(readings) == 3
    assert all(len(r.samples) == 2 and r.step_s == 60 for r in readings)
    assert [r.samples[0].timestamp.minute for r in readings] == [0, 1, 2]
    assert ctx.metrics.sim_time._value.get() == START.timestamp() + 120


async def test_a_failed_scrape_is_counted_and_reads_nothing() -> None:
    ctx = context()
    source = ScrapeSource(["127.0.0.1:1"], interval_s=15, context=ctx, timeout_s=1)
    reading = await source.read()
    assert reading == Reading(15)
    assert ctx.metrics.source_errors.labels("scrape")._value.get() == 1
    assert 0.05 <= source.next_read_in() <= 15


async def test_prometheus_moves_its_cursor_only_once_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kv = FakeKv()
    kv.values[CURSOR_KEY] = b"1000.000"
    ctx = context(kv=kv)
    source = PrometheusSource(
        IngestSettings().prometheus, interval_s=15, backfill_s=60, context=ctx
    )
    asked: list[tuple[float, float]] = []

    def fetch(start: float, end: float, query: str | None = None) -> dict[float, list[Any]]:
        assert query is None  # unsharded: every mapped metric's selector
        asked.append((start, end))
        return {start: [], end: []}

    monkeypatch.setattr(source.client, "fetch", fetch)
    monkeypatch.setattr("time.time", lambda: 1062.0)
    await source.open()
    assert source.cursor == 1000.0
    reading = await source.read()
    assert asked == [(1015.0, 1050.0)]
    assert reading.until == 1050.0
    assert len(reading.instants) == 2
    assert kv.values[CURSOR_KEY] == b"1000.000"  # not before it is published
    await source.published(reading)
    assert source.cursor == 1050.0
    assert kv.values[CURSOR_KEY] == b"1050.000"
    assert (await source.read()).until is None  # nothing new until the next step
    assert asked == [(1015.0, 1050.0)]


async def test_a_failed_prometheus_query_keeps_the_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context()
    source = PrometheusSource(
        IngestSettings().prometheus, interval_s=15, backfill_s=60, context=ctx
    )

    def down(start: float, end: float) -> dict[float, list[Any]]:
        raise ConnectionError("refused")

    monkeypatch.setattr(source.client, "fetch", down)
    await source.open()  # first start: from backfill_s ago
    cursor = source.cursor
    reading = await source.read()
    await source.published(reading)
    assert reading.until is None
    assert source.cursor == cursor
    assert ctx.metrics.source_errors.labels("prometheus")._value.get() == 1


def test_a_preallocating_servers_sample_holds_its_allocations_flag_and_says_its_kv_pool() -> None:
    [w] = [w for w in demo_workloads() if w.preallocates is not None]
    placed = Allocation(
        workload=w.workload,
        pod="chat-x",
        node="node-a",
        gpu_uuid="GPU-1",
        fraction=0.25,
        device_memory_bytes=80 * 1024**3,
        updated_at=START,
    )
    sample = simulated_sample(w, START, placed)
    assert sample.memory_used_bytes == int(0.237 * 80 * 1024**3)  # the flag for 0.25
    assert sample.signals is not None
    assert sample.signals.llm_server == "vllm"
    assert sample.signals.kv_pool_bytes == int((0.237 - w.weights_share) * 80 * 1024**3)
    unplaced = simulated_sample(w, START, None)
    assert unplaced.memory_used_bytes == int(0.92 * 80 * 1024**3)  # vLLM's default, alone
