"""Ingest throughput: a Prometheus response of N GPUs to samples on NATS, against raw NATS.

Usage: python bench/ingest.py [--workloads 10000] [--interval 15]
       python bench/ingest.py --latency [--source prometheus|scrape] [--interval 1]
                              [--scrape-interval 1] [--trials 10]

Builds a range-query response as Prometheus returns it (dcgm-exporter device series, one pod
per GPU: GR_ENGINE_ACTIVE, FB_USED, FB_FREE, so 3 series per workload), then times the real
service path on an embedded nats-server: parse the response, attribute, validate, publish
each sample to JetStream with its acknowledgement. The baseline publishes the same number of
messages of the same size with plain nats-py JetStream publishes on the same server. The
verdict compares the path's samples/s with what N workloads at the interval need.

``--latency``: how long a change in an exporter's value takes to reach NATS. The GPU test
exporter (tests/support) serves one GPU; the real Prometheus (Debian's binary) scrapes it every
``--scrape-interval`` s, or the ``scrape`` source reads it directly; the value changes at a
random moment and the time until a sample with the new value is on NATS is measured, against
the bound of one ingest interval plus Prometheus' scrape interval.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import nats

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.usage.attribution import GpuInventory
from fracpilot_libs.usage.range_queries import points_by_instant


def prometheus_response(workloads: int, at: float) -> list[dict[str, Any]]:
    series = []
    for i in range(workloads):
        gpu = {
            "UUID": f"GPU-{i:08d}",
            "gpu": "0",
            "Hostname": f"node-{i // 8}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "job": "dcgm",
            "instance": f"n{i // 8}:9400",
            "exported_namespace": f"team-{i % 50}",
            "exported_pod": f"svc{i}-5c8d9f7b6-q2w4x",
            "exported_container": "server",
        }
        for name, value in (
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", (i % 97) / 100),
            ("DCGM_FI_DEV_FB_USED", 20_000 + i % 40_000),
            ("DCGM_FI_DEV_FB_FREE", 81_920 - 20_000 - i % 40_000),
        ):
            series.append({"metric": {"__name__": name, **gpu}, "values": [[at, str(value)]]})
    return series


def sample_size(response: list[dict[str, Any]]) -> int:
    """The JSON size of one published sample, for a like-for-like baseline."""
    from fracpilot_libs.owners import owner_from_pod_name
    from fracpilot_libs.usage.attribution import observe_points
    from fracpilot_libs.usage.mappings import MappingTable
    from fracpilot_libs.usage.samples import PublishedSeries, to_sample

    points = next(iter(points_by_instant(response[:3]).values()))
    obs = observe_points(points, MappingTable.of(), GpuInventory())[0][0]
    sample = to_sample(
        obs,
        owner_from_pod_name("bench", obs.pod.namespace, obs.pod.pod),
        "prometheus",
        obs.timestamp,
        3600,
        PublishedSeries(),
    )
    assert not hasattr(sample, "reason")
    return len(sample.model_dump_json())  # type: ignore[union-attr]


async def run(workloads: int, interval: float) -> None:
    with EmbeddedNats() as server:
        settings = IngestSettings(
            nats={"url": server.url}, sources="prometheus", cluster="bench", interval_s=interval
        )
        service = IngestService(settings)
        await service.runtime.bus.connect()
        await service.runtime.bus.ensure_streams()
        at = float(int(time.time()))
        response = prometheus_response(workloads, at)

        start = time.perf_counter()
        instants = points_by_instant(response)
        sent = 0
        for points in instants.values():
            sent += await service.publish_instant("prometheus", points, GpuInventory())
        path_s = time.perf_counter() - start
        await service.runtime.bus.close()

        # Baseline: the same number of JetStream publishes of the same size, nothing else.
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        payload = b"x" * sample_size(response)
        start = time.perf_counter()
        for i in range(sent):
            await js.publish(
                f"fracpilot.usage.v1.{i % 1024}.raw.w{i}",  # into the usage streams, as samples
                payload,
                headers={"Nats-Msg-Id": f"raw-{i}"},
            )
        raw_s = time.perf_counter() - start
        await nc.close()

    need = workloads / interval
    print(f"{workloads} workloads, {len(response)} series, one instant; {sent} samples published")
    print(f"{'path':<34}{'seconds':>9}{'msgs/s':>11}{'vs raw':>8}")
    print(f"{'raw nats-py JetStream publish':<34}{raw_s:>9.2f}{sent / raw_s:>11,.0f}{1.0:>8.2f}")
    print(
        f"{'prometheus response -> NATS':<34}{path_s:>9.2f}{sent / path_s:>11,.0f}"
        f"{raw_s / path_s:>8.2f}"
    )
    print(
        f"needed for {workloads} workloads every {interval:g} s: {need:,.0f} samples/s; "
        f"headroom {sent / path_s / need:.1f}x; one cycle takes {path_s:.1f} s of {interval:g} s"
    )


TESTS = str(Path(__file__).resolve().parents[1] / "tests")  # the test exporter, Prometheus


async def latency(source: str, interval: float, scrape_interval: float, trials: int) -> None:
    sys.path.insert(0, TESTS)
    from fracpilot_libs.contracts import UsageSample
    from support.gpu_exporter import GpuState, GpuTestExporter, PodOnGpu, dcgm_device_metrics
    from support.prometheus_server import PrometheusServer, ScrapeTarget

    def gpu(util: int) -> GpuState:
        pod = PodOnGpu("bench", "lat-0", "main", util_pct=util, memory_used_mib=1_000)
        return GpuState("GPU-1a7e0000", "n1", "NVIDIA L4", 23_034, util, [pod])

    with EmbeddedNats() as server, GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_device_metrics([gpu(10)]))
        prom = PrometheusServer(
            [ScrapeTarget("dcgm", exporter.address)], scrape_interval=scrape_interval
        )
        if source == "prometheus":
            prom.start()
            prom.wait_for_series("DCGM_FI_DEV_GPU_UTIL", timeout=60)
        settings = IngestSettings(
            nats={"url": server.url},
            sources=source,
            cluster="bench",
            interval_s=interval,
            backfill_s=2 * interval,
            prometheus={"url": prom.url},  # type: ignore[arg-type]
            scrape_targets=exporter.address,
        )
        service = IngestService(settings)
        nc = await nats.connect(server.url)
        arrivals: list[tuple[float, float]] = []  # (arrival, compute)
        arrived = asyncio.Event()

        async def on_sample(msg: Any) -> None:
            arrivals.append((time.time(), UsageSample.model_validate_json(msg.data).compute))
            arrived.set()

        await nc.subscribe("fracpilot.usage.>", cb=on_sample)
        task = asyncio.create_task(service.run())
        figures = []
        try:
            await asyncio.sleep(3 * max(interval, scrape_interval))
            for trial in range(trials):
                util = 20 + 10 * (trial % 6)
                await asyncio.sleep(random.uniform(0, max(interval, scrape_interval)))
                changed = time.time()
                exporter.set_metrics(dcgm_device_metrics([gpu(util)]))
                while not any(at > changed and c == util / 100 for at, c in arrivals):
                    arrived.clear()
                    await arrived.wait()
                seen = min(at for at, c in arrivals if at > changed and c == util / 100)
                figures.append(seen - changed)
        finally:
            task.cancel()
            await nc.close()
            prom.cleanup()
    bound = interval + (scrape_interval if source == "prometheus" else 0.0)
    print(
        f"{source} interval {interval:g} s"
        + (f", Prometheus scrape {scrape_interval:g} s" if source == "prometheus" else "")
        + f": {trials} changes, latency median {statistics.median(figures):.2f} s, "
        f"max {max(figures):.2f} s (bound {bound:g} s); all: "
        + " ".join(f"{f:.2f}" for f in figures)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--latency", action="store_true", help="measure change-to-NATS latency")
    parser.add_argument("--source", choices=("prometheus", "scrape"), default="prometheus")
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.latency:
        asyncio.run(latency(args.source, args.interval, args.scrape_interval, args.trials))
    else:
        asyncio.run(run(args.workloads, args.interval))


if __name__ == "__main__":
    main()
