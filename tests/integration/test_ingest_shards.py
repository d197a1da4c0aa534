"""Two ingest replicas sharing one Prometheus source (``FRACPILOT_INGEST_SHARDS``), on a real
nats-server and a real Prometheus scraping the GPU test exporter: every GPU's sample of every
instant is stored exactly once, both replicas publish a share, and the union is what one
unsharded ingest stores for the same instants. And what a shard's query selects on a real
Prometheus (dcgm-exporter's ``UUID``, HAMi's ``device_uuid`` and ``deviceuuid``, vLLM's series
naming no GPU) is exactly its GPUs' series and every series naming none."""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import nats
import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.shard_plan import (
    CURSOR_PREFIX,
    cursor_key,
    gpu_label_groups,
    shard_of,
    shard_regex,
)
from fracpilot_ingest.sources.prometheus import PrometheusSource
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.range_queries import gpu_selector, selector
from helpers import read_usage, reset_nats, running, wait_for
from support.dcgm_prometheus import dcgm_prometheus
from support.gpu_exporter import (
    GpuState,
    GpuTestExporter,
    PodOnGpu,
    VllmState,
    dcgm_metrics,
    hami_metrics,
    vllm_metrics,
)
from support.prometheus_server import PrometheusServer, ScrapeTarget

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

STEP = 1.0
SHARDS = 8
GPUS = [
    GpuState(
        f"GPU-5a1e-{i:04x}",  # the last hex digit puts two GPUs in each of the 8 shards
        f"gpu-node-{i // 4}",
        "NVIDIA A100-SXM4-80GB",
        81_920,
        util_pct=10 + i,
        pods=[PodOnGpu(f"team-{i % 3}", f"svc{i}-0", "server", 10 + i, 1_000 * (i + 1))],
        index=i % 4,
    )
    for i in range(16)
]


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    # The back-fill reads a few seconds of history: let Prometheus gather them.
    with dcgm_prometheus(GPUS, STEP, history_s=8) as server:
        yield server


def ingest_settings(nats_url: str, prom_url: str, **overrides: object) -> IngestSettings:
    base: dict[str, object] = {
        "nats": {"url": nats_url},
        "sources": "prometheus",
        # Two scrapes behind now: an instant is complete when read, so every replica that
        # reads it reads the same samples (the same batch ids).
        "prometheus": {"url": prom_url, "matchers": 'job="dcgm"', "delay_s": 2 * STEP},
        "mapping_families": "dcgm,dcgm-process",
        "interval_s": STEP,
        "backfill_s": 4.0,
        "cluster": "test",
        "default_device_memory_gib": 80.0,
    }
    base.update(overrides)
    return IngestSettings(**base)  # type: ignore[arg-type]


def sharded(nats_url: str, prom_url: str, replica: str) -> IngestService:
    return IngestService(
        ingest_settings(
            nats_url,
            prom_url,
            ingest={"shards": SHARDS, "shard_lease_s": 3.0, "replica_id": replica},
        )
    )


def answers_of(
    source: PrometheusSource,
) -> list[tuple[str | None, frozenset[int], set[str]]]:
    """What the source asks Prometheus each cycle: the query (None: every mapped series), the
    shards its cycle holds, the GPUs the answer names (a recorder around its client's fetch,
    the real request to the real Prometheus)."""
    asked: list[tuple[str | None, frozenset[int], set[str]]] = []
    fetch = source.client.fetch

    def recorded(
        start: float, end: float, query: str | None = None
    ) -> dict[float, list[MetricPoint]]:
        instants = fetch(start, end, query)
        plan = source._plan
        held = frozenset(plan.cursors) if plan is not None else frozenset()
        gpus = {p.labels["UUID"] for points in instants.values() for p in points}
        asked.append((query, held, gpus))
        return instants

    source.client.fetch = recorded  # type: ignore[method-assign]
    return asked


async def stored(url: str) -> list[UsageSample]:
    return [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]


def owned(service: IngestService) -> float:
    return service.runtime.registry.get_sample_value("fracpilot_ingest_shards_owned") or 0.0


def published(service: IngestService) -> float:
    return sum(
        s.value
        for m in service.metrics.published.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


async def state_cursors(url: str) -> dict[str, float]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.INGEST_STATE_BUCKET)
        keys = [k for k in await kv.keys() if k.startswith(CURSOR_PREFIX)]
        return {k: float((await kv.get(k)).value or b"nan") for k in keys}
    finally:
        await nc.close()


def every_instant_once(samples: list[UsageSample]) -> tuple[float, float]:
    """Every GPU has exactly one sample at every instant from the first to the last stored;
    that span."""
    ids = Counter(s.sample_id for s in samples)
    assert [i for i, n in ids.items() if n > 1] == []  # none counted twice
    instants = sorted({s.timestamp.timestamp() for s in samples})
    lo, hi = instants[0], instants[-1]
    per_instant = Counter(s.timestamp.timestamp() for s in samples)
    expected = [lo + k * STEP for k in range(int((hi - lo) / STEP) + 1)]
    missing = {t: len(GPUS) - per_instant.get(t, 0) for t in expected}
    assert {t: n for t, n in missing.items() if n} == {}  # none skipped
    return lo, hi


async def test_two_replicas_store_every_sample_once_and_the_union_is_one_ingests(
    nats_url: str, prom: PrometheusServer
) -> None:
    await reset_nats(nats_url)
    a = sharded(nats_url, prom.url, "ingest-a")
    b = sharded(nats_url, prom.url, "ingest-b")
    asked = answers_of(a.sources[0])  # type: ignore[arg-type]
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(a))
        await wait_for(lambda: a.cycles >= 2, timeout=30)  # alone: every shard
        await stack.enter_async_context(running(b))
        await wait_for(lambda: owned(a) == owned(b) == SHARDS / 2, timeout=30)
        since = b.sources[0].cursor  # type: ignore[attr-defined]
        await wait_for(lambda: b.sources[0].cursor >= since + 6 * STEP, 30)  # type: ignore[attr-defined]
    assert published(a) > 0
    assert published(b) > 0
    # Alone, a asked for every series; beside b, only for its shards' GPUs.
    assert asked[0] == (None, frozenset(range(SHARDS)), {g.uuid for g in GPUS})
    shared_cycles = [(q, held, gpus) for q, held, gpus in asked if len(held) < SHARDS]
    assert shared_cycles
    for query, held, gpus in shared_cycles:
        assert query is not None
        assert gpus == {g.uuid for g in GPUS if shard_of(g.uuid, SHARDS) in held}
    # Every shard has its cursor; the unsharded one is their floor (where another layout, or
    # one ingest, goes on from).
    cursors = await state_cursors(nats_url)
    shard_cursors = [cursors[cursor_key(k, SHARDS)] for k in range(SHARDS)]
    assert cursors[CURSOR_PREFIX] == min(shard_cursors)
    shared = await stored(nats_url)
    lo, hi = every_instant_once(shared)
    assert hi - lo >= 6 * STEP
    gpus_by_replica = {s.gpu_uuid for s in shared}
    assert gpus_by_replica == {g.uuid for g in GPUS}

    # One unsharded ingest on an empty bus, back-filling the same instants.
    await reset_nats(nats_url)
    alone = IngestService(ingest_settings(nats_url, prom.url, backfill_s=time.time() - lo + 1))
    async with running(alone):
        await wait_for(lambda: alone.sources[0].cursor >= hi, timeout=60)  # type: ignore[attr-defined]
    one = [s for s in await stored(nats_url) if lo <= s.timestamp.timestamp() <= hi]

    def rows(samples: list[UsageSample]) -> set[tuple[str, float, int]]:
        return {(s.sample_id, s.compute, s.memory_used_bytes) for s in samples}

    assert rows(shared) == rows(one)


def _random_gpus(n: int) -> list[GpuState]:
    rng = random.Random(31)  # NVIDIA UUIDs: 128 bits in hex, so every last two digits occur
    return [
        GpuState(
            f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
            f"gpu-node-{i // 4}",
            "NVIDIA A100-SXM4-80GB",
            81_920,
            util_pct=10,
            pods=[
                PodOnGpu(
                    "team",
                    f"chat{i}-0",
                    "server",
                    10,
                    1_000,
                    40_000,
                    vllm=VllmState(kv_cache_usage=0.5, num_requests_running=2),
                )
            ],
            index=i % 4,
        )
        for i in range(n)
    ]


def test_a_shards_query_selects_its_gpus_series_and_every_series_naming_none() -> None:
    gpus = _random_gpus(24)
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_metrics(gpus, per_process=True), "/dcgm")
        exporter.set_metrics(hami_metrics(gpus), "/hami")  # device_uuid
        exporter.set_metrics(hami_metrics(gpus, names="legacy"), "/hami-legacy")  # deviceuuid
        exporter.set_metrics(vllm_metrics(gpus), "/vllm")  # no GPU label
        # A series naming two GPUs: it is the first label's (the table's order), in that
        # GPU's shard alone.
        first, second = gpus[0].uuid, next(g.uuid for g in gpus if g.uuid[-2:] != gpus[0].uuid[-2:])
        exporter.set_metrics(
            f'DCGM_FI_DEV_FB_USED{{UUID="{first}",deviceuuid="{second}"}} 1\n', "/two"
        )
        jobs = ("dcgm", "hami", "hami-legacy", "vllm", "two")
        targets = [ScrapeTarget(job, exporter.address, f"/{job}") for job in jobs]
        with PrometheusServer(targets, scrape_interval=1.0) as prom:
            prom.wait_for_targets_up(timeout=30)
            for job in jobs:
                prom.wait_for_series(f'{{job="{job}"}}', timeout=30)
            at = time.time()
            names = sorted({s["metric"]["__name__"] for s in prom.query('{job=~".+"}', at)})
            ((labels, _),) = gpu_label_groups(MappingTable.of())  # one order for all rows
            assert labels == ("UUID", "device_uuid", "deviceuuid")

            def answer(query: str) -> dict[frozenset[tuple[str, str]], str | None]:
                """Each series of a range query of one instant (as the source asks), by its
                labels: the GPU it names (its first GPU label set), or None."""
                out = {}
                for one in prom.query_range(query, at, at, step=1.0):
                    metric = one["metric"]
                    gpu = next((metric[n] for n in labels if metric.get(n)), None)
                    out[frozenset(metric.items())] = gpu
                return out

            whole = answer(selector(names, 'job=~".+"'))
            by_label = {n: sum(1 for k in whole if any(a == n for a, _ in k)) for n in labels}
            assert all(by_label.values()), by_label  # every kind of GPU label is there
            naming_none = {k for k, gpu in whole.items() if gpu is None}
            assert naming_none  # vLLM's
            two = next(k for k in whole if ("job", "two") in k)
            assert whole[two] == first
            for shards, held_sets in (
                (8, [{k} for k in range(8)] + [{0, 5, 6}]),
                (
                    32,
                    [{k} for k in range(32)]
                    + [{1, 17, 30}, {0, 16}, set(range(16)), set(range(0, 32, 3))],
                ),
            ):
                read = set()
                for held in held_sets:
                    got = answer(
                        gpu_selector(names, 'job=~".+"', labels, shard_regex(held, shards))
                    )
                    assert {k for k, gpu in got.items() if gpu is None} == naming_none
                    assert {k: g for k, g in got.items() if g is not None} == {
                        k: g
                        for k, g in whole.items()
                        if g is not None and shard_of(g, shards) in held
                    }
                    if len(held) == 1:
                        read |= set(got)
                assert read == set(whole)  # the shards together: every series
