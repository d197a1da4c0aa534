"""Where one ingest cycle's CPU goes: µs per GPU in each phase, without NATS.

Usage: python bench/ingest_phases.py [--workloads 20000] [--repeat 3]

The response of bench/ingest.py (3 dcgm series per GPU) through the ingest's own functions,
each phase timed in process CPU time with the collector off (as the ingest pauses it):
parse (the JSON body as the prometheus source decodes it, ``range_result``, and
``points_by_instant``), observe (``observe_points``), to_sample (the
service's ``samples_of``: owner, checks, the validated ``UsageSample``), encode (usage
batches, the service's own encoding) and acked (what the service does once a batch is
acknowledged, a batch at a time: metrics, signals). Publishing is not in it (bench/ingest.py
times the whole path on a server). Each repetition is a new service: its first cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import prometheus_response

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.sources.prometheus import range_result
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.usage.attribution import GpuInventory, Observation, Rejection, observe_points
from fracpilot_libs.usage.range_queries import points_by_instant

PHASES = ("parse", "observe", "to_sample", "encode", "acked")


async def cycle(body: bytes, workloads: int) -> list[float]:
    settings = IngestSettings(
        nats={"url": "nats://127.0.0.1:4222"}, sources="prometheus", cluster="bench",
        interval_s=15, usage_view=False,
    )  # fmt: skip
    service = IngestService(settings)
    inventory = GpuInventory()
    gc.disable()
    try:
        marks = [time.process_time()]
        # As the prometheus source parses it (RangeQueryClient.query_range, then fetch).
        instants = points_by_instant(range_result(body), owned=True)
        marks.append(time.process_time())
        points = next(iter(instants.values()))
        observations, _ = observe_points(points, service.table, inventory)
        marks.append(time.process_time())
        now = time.time()
        rejected: list[Rejection] = []
        ready = await service.samples_of("prometheus", observations, inventory, now, rejected)
        assert not rejected
        assert len(ready) == workloads
        marks.append(time.process_time())
        batches = service._encode([s for s, _ in ready])
        marks.append(time.process_time())
        # As the service's publish window does: each batch's acknowledgement accounted once.
        by_id = {sample.sample_id: (sample, obs) for sample, obs in ready}
        for batch in batches:
            rows: list[tuple[UsageSample, Observation | None]] = [
                by_id[sample_id] for sample_id in batch.sample_ids
            ]
            await service._on_batch_acked("prometheus", rows, [], 15, now)(True)
        marks.append(time.process_time())
    finally:
        gc.enable()
    return [(b - a) / workloads * 1e6 for a, b in pairwise(marks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = prometheus_response(args.workloads, float(int(time.time())))
    envelope = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    body = json.dumps(envelope).encode()  # the bytes of the HTTP answer
    runs = [asyncio.run(cycle(body, args.workloads)) for _ in range(args.repeat)]
    print(f"{args.workloads} GPUs, CPU µs per GPU (process time, collector off), each run:")
    print("".join(f"{p:>11}" for p in (*PHASES, "total")))
    for run in runs:
        print("".join(f"{x:>11.1f}" for x in (*run, sum(run))))


if __name__ == "__main__":
    main()
