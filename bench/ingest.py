"""Ingest throughput: a Prometheus response of N GPUs to samples on NATS, against raw NATS.

Usage: python bench/ingest.py [--workloads 10000] [--interval 15]

Builds a range-query response as Prometheus returns it (dcgm-exporter device series, one pod
per GPU: GR_ENGINE_ACTIVE, FB_USED, FB_FREE, so 3 series per workload), then times the real
service path on an embedded nats-server: parse the response, attribute, validate, publish
each sample to JetStream with its acknowledgement. The baseline publishes the same number of
messages of the same size with plain nats-py JetStream publishes on the same server. The
verdict compares the path's samples/s with what N workloads at the interval need.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import nats

from fracpilot_ingest.attribution import GpuInventory
from fracpilot_ingest.service import IngestService, IngestSettings
from fracpilot_ingest.sources.prometheus import points_by_instant
from fracpilot_libs.embedded_nats import EmbeddedNats


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
    from fracpilot_ingest.attribution import observe_points
    from fracpilot_ingest.mappings import MappingTable
    from fracpilot_ingest.owners import owner_from_pod_name
    from fracpilot_ingest.samples import PublishedSeries, to_sample

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
            nats_url=server.url, sources="prometheus", cluster="bench", interval_s=interval
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=15.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(run(args.workloads, args.interval))


if __name__ == "__main__":
    main()
