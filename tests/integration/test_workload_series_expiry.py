"""A workload that goes away leaves no series in ingest's /metrics.

Ingest runs against a real nats-server with the simulator as its source (its workloads keep
publishing) and a TTL of one second. A workload published once, then never again, is in
/metrics, and after the TTL its per-workload series are gone, read over HTTP; the simulator's
workloads, seen all the time, keep theirs.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from factories import sample
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from helpers import reset_nats, running

pytestmark = pytest.mark.integration


Series = dict[tuple[str, str], set[str]]


def scrape_workloads(port: int) -> Series:
    """(namespace, workload) -> the metric names with a series of it, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[tuple[str, str], set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "workload" in s.labels and "namespace" in s.labels:
                key = (s.labels["namespace"], s.labels["workload"])
                found.setdefault(key, set()).add(s.name)
    return found


async def workloads_in_metrics(port: int) -> Series:
    # In a thread: the endpoint is served by this test's event loop.
    return await asyncio.to_thread(scrape_workloads, port)


async def scrape_until(port: int, done: Callable[[Series], bool], timeout: float = 30) -> Series:
    deadline = time.monotonic() + timeout
    while not done(series := await workloads_in_metrics(port)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"/metrics did not change as expected: {sorted(series)}")
        await asyncio.sleep(0.1)
    return series


async def test_a_gone_workloads_series_disappear_from_metrics(nats_url: str) -> None:
    await reset_nats(nats_url)
    ingest = IngestService(
        IngestSettings(
            nats={"url": nats_url},
            sim={"workloads": 1, "speed": 3600, "duration_s": 0},  # runs until stopped
            workload_metrics_ttl_s=1.0,
        )
    )
    gone = sample(name="gone-workload", allocated=0.25)
    key = (gone.workload.namespace, gone.workload.owner_name)
    async with running(ingest):
        port = ingest.runtime.http.port
        await scrape_until(port, lambda series: len(series) >= 1)
        await ingest.publish_sample("test", gone, 60.0)
        series = (await workloads_in_metrics(port))[key]
        assert {
            "fracpilot_workload_allocated_ratio",
            "fracpilot_workload_compute_ratio",
            "fracpilot_gpu_saved_seconds_total",
            "fracpilot_cost_saved_usd_total",
        } <= series
        still = await scrape_until(port, lambda series: key not in series)
        assert still, "the simulator's workloads, seen all along, lost their series"
        assert all(k[1] != "_other" for k in still)
        expired = ingest.runtime.registry.get_sample_value(
            "fracpilot_workload_metrics_expired_total"
        )
        assert expired is not None
        assert expired >= 1
