"""Ingest throughput: a Prometheus response of N GPUs to samples on NATS, against raw NATS.

Usage: python bench/ingest.py [--workloads 10000] [--interval 15] [--cluster]
                              [--sample-workloads 10000] [--compare REV] [--repeat 1]
                              [--baseline-rev REV]
       python bench/ingest.py --latency [--source prometheus|scrape] [--interval 1]
                              [--scrape-interval 1] [--trials 10]

Builds a range-query response as Prometheus returns it (dcgm-exporter device series, one pod
per GPU: GR_ENGINE_ACTIVE, FB_USED, FB_FREE, so 3 series per workload), then times the real
service path on an embedded nats-server (``--cluster``: three routed on loopback, R3 streams):
parse the response (its JSON body's bytes, as the API returns it, decoded as the prometheus
source decodes them), attribute, validate, publish.
Each path on a fresh server: today's path before usage batches (``FRACPILOT_USAGE_WIRE=sample``:
one message each, each acknowledgement awaited before the next: the same code as before
batches), and usage batches through the publish window. A raw baseline publishes the same
number of messages of the same size with plain nats-py JetStream publishes. The verdict
compares samples/s with what N workloads at the interval need. The machine's load average is
printed with them. The one-message path and the raw baseline publish the first
``--sample-workloads`` GPUs of the response (a rate: at ~700 samples/s all of 100,000 would
take minutes). ``--compare REV``: the batch path of that commit's code too (its ``libs`` and
ingest, from ``git archive``, in a child process of this script), in the same run on a fresh
server: the figure before a change beside the one after. ``--repeat k``: the batch paths k
times, alternating, the median printed (a shared machine is noisy).

``--baseline-rev REV``: also the one-message path of that commit's code (each acknowledgement
awaited: the path of a commit before usage batches, whatever ``FRACPILOT_USAGE_WIRE`` it has),
on a fresh server, the same GPUs as today's one-message path; the batch path's ratio to it is
printed beside its ratio to today's one-message path. For issue 31 that commit is a190c4a: the
parent of 8a05f66 (the usage batch codec, the first commit of issue 31; the ingest's publish
window, 34e994a, came after it on the same branch), so the code as it was when the issue was
filed (its 692 samples/s was measured at 759aa22; the ingest changed between the two only by
moves of code to libs). Today's one-message path (``FRACPILOT_USAGE_WIRE=sample``) is faster
than that, as it shares the cheaper cycle of issue 31's own ingest work.

Another commit's code runs in a child process of this script (its ``libs`` and services from
``git archive``, first on ``PYTHONPATH``) against a server this process starts, so the child
needs nothing from the tests of that commit.

``--latency``: how long a change in an exporter's value takes to reach NATS. The GPU test
exporter (tests/support) serves one GPU; the real Prometheus (Debian's binary) scrapes it every
``--scrape-interval`` s, or the ``scrape`` source reads it directly; the value changes at a
random moment and the time until a sample with the new value is on NATS is measured, against
the bound of one ingest interval plus Prometheus' scrape interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.usage.attribution import GpuInventory
from fracpilot_libs.usage.range_queries import points_by_instant

OWNED = {"owned": True} if "owned" in inspect.signature(points_by_instant).parameters else {}

try:
    from fracpilot_libs.gc_pause import gc_paused
except ImportError:  # --compare with a commit before it: the collector was never paused
    gc_paused = contextlib.nullcontext

try:  # the prometheus source's own decoding of an answer's bytes
    from fracpilot_ingest.sources.prometheus import range_result
except ImportError:  # a commit before it: requests' .json() in prometheus-api-client

    def range_result(body: bytes) -> Any:
        return json.loads(body)["data"]["result"]


def _gpu_uuid(i: int) -> str:
    """GPU ``i``'s UUID, as NVIDIA's look (128 bits in hex): distinct, their last hex digits
    (an ingest shard, fracpilot_ingest.shard_plan) spread evenly."""
    return f"GPU-{uuid.UUID(int=(i * 0x9E3779B97F4A7C15F39CC0605CEDC835 + 1) % 2**128)}"


def prometheus_response(workloads: int, at: float) -> list[dict[str, Any]]:
    series = []
    for i in range(workloads):
        gpu = {
            "UUID": _gpu_uuid(i),
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


@contextlib.contextmanager
def nats_under_test(cluster: bool) -> Iterator[str]:
    """One embedded nats-server (streams R1), or three routed on loopback (R3)."""
    if not cluster:
        with EmbeddedNats() as server:
            yield server.url
        return
    sys.path.insert(0, TESTS)
    from support.nats_cluster import NatsCluster

    with NatsCluster(3) as nodes:
        yield nodes.url


async def service_path(
    url: str, wire: str, responses: list[list[dict[str, Any]]], interval: float
) -> list[tuple[int, float]]:
    """The real service path, one cycle per response (the first: a new ingest; the next: the
    same GPUs an interval later, as every cycle after the first), each timed: the response
    parsed, attributed, validated, published with ``wire`` (``sample``: one message each,
    each acknowledged before the next, as the code before usage batches did; ``batch``: usage
    batches through the publish window)."""
    settings = IngestSettings(
        nats={"url": url}, sources="prometheus", cluster="bench", interval_s=interval,
        usage_wire=wire, usage_view=False,
    )  # fmt: skip
    service = IngestService(settings)
    await service.runtime.bus.connect()
    await service.runtime.bus.ensure_streams()
    # A commit before usage batches (--baseline-rev): no window, each sample awaited.
    takes_wait = "wait" in inspect.signature(service.publish_instant).parameters
    left = {"wait": False} if takes_wait else {}
    cycles = []
    for response in responses:
        envelope = {"status": "success", "data": {"resultType": "matrix", "result": response}}
        body = json.dumps(envelope).encode()  # the bytes of the HTTP answer
        start = time.perf_counter()
        sent = await service_cycle(service, body, left)
        cycles.append((sent, time.perf_counter() - start))
    await service.runtime.bus.close()
    return cycles


async def service_cycle(service: IngestService, body: bytes, left: dict[str, bool]) -> int:
    """One reading of ``body`` as the service's reading loop runs it; samples sent.

    Since 2026-12-05 (evening) the service keeps the collector paused over a reading's whole
    life and frees it inside; before, the parse and the publishing were paused apart, and the
    collections after each walked the reading still held (the one after the publishing falls
    between cycles: bench/ingest_cycles.py counts it, a cycle's clock here does not)."""
    if hasattr(service, "_publish_reading"):  # one pause, the reading freed inside
        with gc_paused():
            return await _publish_response(service, body, left)
    return await _publish_response(service, body, left, paused=gc_paused)


async def _publish_response(
    service: IngestService,
    body: bytes,
    left: dict[str, bool],
    paused: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
) -> int:
    """The body parsed (as the prometheus source does, ``RangeQueryClient.fetch``), every
    instant into the window, then one drain (as the service's reading loop); samples sent.
    ``paused``: the pauses of a commit before one pause over the reading."""
    with gc_paused():
        result = range_result(body)
        # The decoded response handed over, as the prometheus source does (a commit before
        # ``owned``, under --compare: copied, as it did then).
        instants = points_by_instant(result, **OWNED)
    del result
    sent = 0
    with paused():
        for points in instants.values():
            inventory = GpuInventory()
            sent += await service.publish_instant("prometheus", points, inventory, **left)
        windows = getattr(service, "windows", {})
        if (window := windows.get("prometheus")) is not None:  # none: one at a time
            await window.drain()
    return sent


async def raw_path(url: str, sent: int, size: int) -> float:
    """Baseline: the same number of JetStream publishes of the same size, nothing else."""
    nc = await nats.connect(url.split(",")[0])
    js = nc.jetstream()
    payload = b"x" * size
    start = time.perf_counter()
    for i in range(sent):
        await js.publish(
            f"fracpilot.usage.v1.{i % 1024}.raw.w{i}",  # into the usage streams, as samples
            payload,
            headers={"Nats-Msg-Id": f"raw-{i}"},
        )
    raw_s = time.perf_counter() - start
    await nc.close()
    return raw_s


def two_cycles(workloads: int, interval: float) -> list[list[dict[str, Any]]]:
    """The responses of two cycles: the same GPUs, an interval apart."""
    at = float(int(time.time()))
    return [prometheus_response(workloads, at - interval), prometheus_response(workloads, at)]


async def child_path(url: str, wire: str, workloads: int, interval: float) -> None:
    """One path on a server the parent started, its figures on one line (what
    :func:`path_at` reads): run with another commit's code first on the path."""
    responses = two_cycles(workloads, interval)
    cycles = await service_path(url, wire, responses, interval)
    print("CYCLES " + " ".join(f"{sent} {seconds:.6f}" for sent, seconds in cycles))


SERVICES = ("ingest", "decision", "actuator")


def path_at(
    rev: str, wire: str, workloads: int, interval: float, cluster: bool
) -> list[tuple[int, float]]:
    """The ``wire`` path of commit ``rev``'s code (its libs and services unpacked from git, run
    by this script in a child process) on a fresh server this process starts."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", rev, "libs/src", "services"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        code = [f"{tmp}/libs/src"] + [f"{tmp}/services/{s}/src" for s in SERVICES]
        env = dict(os.environ, PYTHONPATH=":".join(code))
        with nats_under_test(cluster) as url:
            args = [sys.executable, __file__, "--child-path", wire, "--url", url]
            args += ["--workloads", str(workloads), "--interval", str(interval)]
            child = subprocess.run(args, env=env, capture_output=True, text=True)
        if child.returncode != 0:
            raise RuntimeError(f"the {wire} path at {rev} failed:\n{child.stderr[-3000:]}")
    lines = child.stdout.splitlines()
    figures = next(line for line in lines if line.startswith("CYCLES ")).split()[1:]
    return [(int(n), float(t)) for n, t in zip(figures[::2], figures[1::2], strict=True)]


async def run(
    workloads: int,
    interval: float,
    cluster: bool,
    sample_workloads: int,
    compare: str | None,
    repeat: int,
    baseline: str | None,
) -> None:
    responses = two_cycles(workloads, interval)
    one_each_gpus = min(sample_workloads, workloads)
    one_each = [r[: 3 * one_each_gpus] for r in responses]  # 3 series a GPU
    with nats_under_test(cluster) as url:  # each path on a fresh server (or cluster)
        sample_cycles = await service_path(url, "sample", one_each, interval)
        raw_s = await raw_path(url, sample_cycles[1][0], sample_size(responses[1]))
    # The same GPUs (the first of the response), their values alike: two_cycles is
    # deterministic but for the time, and a child's instants are as recent as ours.
    baseline_cycles = (
        path_at(baseline, "sample", one_each_gpus, interval, cluster) if baseline else None
    )
    # Per cycle (0: the first, 1: the next), one (samples, seconds) per run.
    batch_runs: list[list[tuple[int, float]]] = [[], []]
    before_runs: list[list[tuple[int, float]]] = [[], []]
    for _ in range(repeat):
        with nats_under_test(cluster) as url:
            for cycle, figures in enumerate(await service_path(url, "batch", responses, interval)):
                batch_runs[cycle].append(figures)
        if compare:
            compared = path_at(compare, "batch", workloads, interval, cluster)
            for cycle, figures in enumerate(compared):
                before_runs[cycle].append(figures)
    timings = {"sample": sample_cycles[1]}
    response = responses[1]
    sent = timings["sample"][0]
    need = workloads / interval
    where = "three-node cluster, R3" if cluster else "one server, R1"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{workloads} workloads, {len(response)} series, one instant a cycle; {where}; "
        f"load {load}; rows without 'first cycle': the next cycle (every one after the first)"
    )
    today = sent / timings["sample"][1]
    # The one-message path of --baseline-rev (the next cycle, as today's): a column of its own.
    filed = baseline_cycles[1][0] / baseline_cycles[1][1] if baseline_cycles else None
    vs_filed = f"vs {baseline}"[:11] if baseline else ""
    print(
        f"{'path':<64}{'samples':>8}{'seconds':>9}{'samples/s':>11}{'vs today':>9}"
        + (f"{vs_filed:>12}" if filed else "")
    )

    def row(what: str, n: int, seconds: float) -> float:
        rate = n / seconds
        print(
            f"{what:<64}{n:>8}{seconds:>9.2f}{rate:>11,.0f}{rate / today:>9.2f}"
            + (f"{rate / filed:>12.2f}" if filed else "")
        )
        return rate

    def median_row(what: str, runs: list[tuple[int, float]]) -> float:
        """The median run's row (of an even count, the slower of the middle two)."""
        rates = sorted(n / s for n, s in runs)
        label = f"{what} (median of {len(runs)}: " + ", ".join(f"{r:,.0f}" for r in rates) + ")"
        n, seconds = sorted(runs, key=lambda r: r[0] / r[1])[(len(runs) - 1) // 2]
        return row(label if len(runs) > 1 else what, n, seconds)

    row("raw nats-py JetStream publish, one each", sent, raw_s)
    row("today: one message each, awaited", *timings["sample"])
    if baseline_cycles:
        row(f"at {baseline}: one message each, awaited", *baseline_cycles[1])
    if compare:
        median_row(f"usage batches at {compare}, first cycle", before_runs[0])
        median_row(f"usage batches at {compare}", before_runs[1])
    median_row("usage batches, publish window, first cycle", batch_runs[0])
    batch_rate = median_row("usage batches, publish window", batch_runs[1])
    print(
        f"needed for {workloads} workloads every {interval:g} s: {need:,.0f} samples/s; "
        f"headroom today {today / need:.1f}x, with batches {batch_rate / need:.1f}x"
    )
    print(
        f"usage batches (next cycle, median) against one message each: {batch_rate / today:.1f}x "
        "today's"
        + (f", {batch_rate / filed:.1f}x {baseline}'s (filed: {filed:,.0f}/s)" if filed else "")
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

        await nc.subscribe(f"{subjects.USAGE_VIEW_PREFIX}.>", cb=on_sample)
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
    parser.add_argument("--cluster", action="store_true", help="a three-node cluster (R3)")
    parser.add_argument("--source", choices=("prometheus", "scrape"), default="prometheus")
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--sample-workloads",
        type=int,
        default=10_000,
        help="GPUs the one-message path and the raw baseline publish (their rate is compared)",
    )
    parser.add_argument("--compare", metavar="REV", help="also the batch path of this commit")
    parser.add_argument("--repeat", type=int, default=1, help="batch paths run this many times")
    parser.add_argument(
        "--baseline-rev",
        metavar="REV",
        help="also the one-message path of this commit (issue 31: a190c4a, the code it was "
        "filed against); the batch path's ratio to it beside the ratio to today's",
    )
    parser.add_argument("--child-path", choices=("sample", "batch"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.latency:
        asyncio.run(latency(args.source, args.interval, args.scrape_interval, args.trials))
    elif args.child_path:
        asyncio.run(child_path(args.url, args.child_path, args.workloads, args.interval))
    else:
        asyncio.run(
            run(
                args.workloads,
                args.interval,
                args.cluster,
                args.sample_workloads,
                args.compare,
                args.repeat,
                args.baseline_rev,
            )
        )


if __name__ == "__main__":
    main()
