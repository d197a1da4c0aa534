"""End to end at 1,000, 10,000 and 100,000 workloads, next to raw nats-py on the same server.

Usage: python bench/e2e.py [--workloads 1000 10000 100000] [--rounds 8] [--hot 100]
                           [--backlog 200000] [--partitions 16] [--profile DIR]

For each workload count, on a fresh embedded nats-server, with one decision replica and the
actuator on the simulated cluster (each a process, as deployed):

1. **paced**: every workload sends a sample every 15 s (``workloads / 15`` samples/s) for
   ``--rounds`` rounds. Reported: the samples/s decided; the time from a sample published to
   its decision (samples that caused one: ``--hot`` workloads growing) and to the
   decision's ``ActuationResult``, p50 and p99; and the decision service's lag for every
   sample (stored in the stream to decided, its ``fracpilot_decision_sample_lag_seconds``
   histogram), p50 and p99.
2. **backlog**: ``--backlog`` samples published first, then the decision service started: the
   samples/s it decides them at (from ready to the last one decided).
3. **raw**: the same number of messages of the same size (the same sample JSON, the same
   ``Nats-Msg-Id`` header) published to a plain JetStream stream on the same server, then
   drained by a nats-py pull consumer (fetch in batches of ``--batch``, ack each message):
   the baseline, and the ratio of (2) to it.

The publisher is a process of its own (asyncio, ``publish_async``), on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_harness import (
    INTERVAL_S,
    Observer,
    PublishPlan,
    Service,
    actuator_env,
    check_payload,
    cpu_seconds,
    decision_env,
    declare_streams,
    histogram_quantile,
    hot_set,
    log_dir,
    machine_note,
    metric,
    percentile,
    scrape,
    start_publisher,
    wait_decided,
    wait_ready,
)

from fracpilot_libs.embedded_nats import EmbeddedNats, free_port

LAG = "fracpilot_decision_sample_lag_seconds"
SAMPLES = "fracpilot_decision_samples_total"


@dataclass
class Paced:
    workloads: int
    target: float
    decided_rate: float
    caught_up_s: float | None
    decisions: int
    to_decision: tuple[float, float]
    to_result: tuple[float, float]
    results: int
    lag: tuple[float, float]
    publish_rate: float
    decision_cores: float  # CPU the decision service used, in cores, while paced
    decision_cpu_us: float  # its CPU per sample decided, microseconds
    server_cores: float


@dataclass
class Drain:
    workloads: int
    samples: int
    fracpilot_rate: float
    raw_rate: float
    publish_rate: float
    message_bytes: int
    decision_cpu_us: float  # decision service CPU per sample, microseconds
    server_cpu_us: float  # nats-server CPU per sample while the decision service drained
    raw_server_cpu_us: float  # nats-server CPU per message while the raw consumer drained


def start_pipeline(
    url: str, workloads: int, hot: list[int], args: argparse.Namespace, tag: str
) -> tuple[Service, Service, int]:
    logs = log_dir(f"e2e-{workloads}")
    port = free_port()
    extra = {
        "FRACPILOT_DECISION_PARTITIONS": str(args.partitions),
        "FRACPILOT_FETCH_BATCH": str(args.batch),
    }
    setting = dict(kv.split("=", 1) for kv in args.set)
    actuator = Service(
        "fracpilot_actuator", {**actuator_env(url, hot), **extra}, logs / f"actuator-{tag}.log"
    ).start()
    profile = args.profile / f"decision-{workloads}-{tag}.prof" if args.profile else None
    decision = Service(
        "fracpilot_decision", decision_env(url, port, **extra, **setting),
        logs / f"decision-{tag}.log", profile,
    ).start()  # fmt: skip
    wait_ready(int(actuator.env["FRACPILOT_METRICS_PORT"]))
    return actuator, decision, port


async def paced(workloads: int, args: argparse.Namespace) -> Paced:
    hot = hot_set(workloads, args.hot)
    with EmbeddedNats() as server:
        actuator, decision, port = start_pipeline(server.url, workloads, hot, args, "paced")
        observer = Observer()
        try:
            wait_ready(port)
            await observer.start(server.url)
            before = scrape(port)
            assert server.proc is not None
            cpu0, srv0 = cpu_seconds(decision.proc.pid), cpu_seconds(server.proc.pid)
            target = workloads / INTERVAL_S
            total = workloads * args.rounds
            plan = PublishPlan(server.url, workloads, tuple(hot), args.rounds, rate=target)
            proc, pipe = start_publisher(plan)
            started = time.monotonic()
            published: dict[str, float] = await asyncio.to_thread(pipe.recv)
            proc.join()
            publishing_s = time.monotonic() - started
            caught_up = await wait_decided(port, metric(before, SAMPLES) + total, 120)
            await asyncio.sleep(1.0)  # the last results
            after = scrape(port)
            decided = metric(after, SAMPLES) - metric(before, SAMPLES)
            elapsed = publishing_s + (caught_up or 0.0)
            used = cpu_seconds(decision.proc.pid) - cpu0
            server_used = cpu_seconds(server.proc.pid) - srv0
            wall = time.monotonic() - started
            d, r = observer.to_decision_ms, observer.to_result_ms
            return Paced(
                workloads=workloads,
                target=target,
                decided_rate=decided / elapsed,
                caught_up_s=caught_up,
                decisions=len(d),
                to_decision=(percentile(d, 50), percentile(d, 99)),
                to_result=(percentile(r, 50), percentile(r, 99)),
                results=len(r),
                lag=(
                    1000 * histogram_quantile(before, after, LAG, 0.5),
                    1000 * histogram_quantile(before, after, LAG, 0.99),
                ),
                publish_rate=published["rate"],
                decision_cores=used / wall,
                decision_cpu_us=used / max(decided, 1) * 1e6,
                server_cores=server_used / wall,
            )
        finally:
            await observer.close()
            decision.stop()
            actuator.stop()


def _raw_consumer(url: str, total: int, batch: int, out: Any) -> None:
    out.send(asyncio.run(_drain_raw(url, total, batch)))


async def _drain_raw(url: str, total: int, batch: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        "bench.raw.>",
        durable="raw",
        stream="BENCH_RAW",
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=100_000),
    )
    got = 0
    started = time.monotonic()
    while got < total:
        try:
            msgs = await sub.fetch(batch, timeout=1.0)
        except (nats.errors.TimeoutError, TimeoutError):
            continue
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await nc.flush()
    elapsed = time.monotonic() - started
    await nc.close()
    return total / elapsed


async def drain(workloads: int, args: argparse.Namespace) -> Drain:
    hot = hot_set(workloads, args.hot)
    rounds = max(1, math.ceil(args.backlog / workloads))
    total = rounds * workloads
    with EmbeddedNats() as server:
        await declare_streams(server.url, args.partitions)
        plan = PublishPlan(server.url, workloads, tuple(hot), rounds)
        proc, pipe = start_publisher(plan)
        proc.join()
        published: dict[str, float] = pipe.recv()

        actuator, decision, port = start_pipeline(server.url, workloads, hot, args, "backlog")
        assert server.proc is not None
        try:
            wait_ready(port)
            started = time.monotonic()
            cpu0, srv0 = cpu_seconds(decision.proc.pid), cpu_seconds(server.proc.pid)
            done = await wait_decided(port, total, 600)
            fracpilot_rate = total / (done if done else time.monotonic() - started)
            decision_cpu = (cpu_seconds(decision.proc.pid) - cpu0) / total * 1e6
            server_cpu = (cpu_seconds(server.proc.pid) - srv0) / total * 1e6
        finally:
            decision.stop()
            actuator.stop()

        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(
            StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"], duplicate_window=120.0)
        )
        await nc.close()
        plan = PublishPlan(server.url, workloads, tuple(hot), rounds, subject_prefix="bench.raw")
        proc, pipe = start_publisher(plan)
        proc.join()
        pipe.recv()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        consumer = ctx.Process(target=_raw_consumer, args=(server.url, total, args.batch, child))
        srv0 = cpu_seconds(server.proc.pid)
        consumer.start()
        raw_rate: float = parent.recv()
        consumer.join()
        raw_server_cpu = (cpu_seconds(server.proc.pid) - srv0) / total * 1e6
    return Drain(
        workloads,
        total,
        fracpilot_rate,
        raw_rate,
        published["rate"],
        int(published["bytes"]),
        decision_cpu,
        server_cpu,
        raw_server_cpu,
    )


def ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.0f}"


def report(paced_rows: list[Paced], drains: list[Drain]) -> None:
    print("\npaced: a sample every 15 s per workload, one decision replica, simulated cluster")
    print(
        f"{'workloads':>10}{'target/s':>10}{'decided/s':>11}{'vs target':>10}"
        f"{'decisions':>10}{'->decision p50/p99 ms':>23}{'->result p50/p99 ms':>21}"
        f"{'lag p50/p99 ms':>16}"
    )
    for p in paced_rows:
        print(
            f"{p.workloads:>10,}{p.target:>10,.0f}{p.decided_rate:>11,.0f}"
            f"{p.decided_rate / p.target:>10.2f}{p.decisions:>10,}"
            f"{ms(p.to_decision[0]) + ' / ' + ms(p.to_decision[1]):>23}"
            f"{ms(p.to_result[0]) + ' / ' + ms(p.to_result[1]):>21}"
            f"{ms(p.lag[0]) + ' / ' + ms(p.lag[1]):>16}"
        )
        behind = "caught up" if p.caught_up_s is not None else "NOT caught up in 120 s"
        print(
            f"{'':>10}  publisher {p.publish_rate:,.0f}/s; after the last publish: {behind}"
            f"{f' in {p.caught_up_s:.1f} s' if p.caught_up_s is not None else ''}; "
            f"{p.results:,} results timed; CPU: decision service {p.decision_cores:.2f} "
            f"cores ({p.decision_cpu_us:.0f} us/sample), nats-server {p.server_cores:.2f} cores"
        )
    print("\nbacklog drained: fracpilot (decision service, actuator running) vs raw nats-py")
    print(
        f"{'workloads':>10}{'samples':>10}{'bytes':>7}{'fracpilot/s':>13}{'raw JS/s':>11}"
        f"{'vs raw':>8}{'publish/s':>11}{'CPU us/sample: decision':>25}{'server':>8}"
        f"{'raw server':>12}"
    )
    for d in drains:
        print(
            f"{d.workloads:>10,}{d.samples:>10,}{d.message_bytes:>7}{d.fracpilot_rate:>13,.0f}"
            f"{d.raw_rate:>11,.0f}{d.fracpilot_rate / d.raw_rate:>8.2f}{d.publish_rate:>11,.0f}"
            f"{d.decision_cpu_us:>25,.0f}{d.server_cpu_us:>8,.0f}{d.raw_server_cpu_us:>12,.0f}"
        )
    for p in paced_rows:
        if p.workloads >= 100_000:
            ok = p.to_decision[1] < 250 and p.decided_rate >= 0.97 * p.target
            print(
                f"\n100,000 workloads: p99 sample->decision {ms(p.to_decision[1])} ms, "
                f"lag p99 {ms(p.lag[1])} ms (target 250 ms): {'met' if ok else 'NOT met'}"
            )
    for d in drains:
        if d.workloads >= 100_000:
            ratio = d.fracpilot_rate / d.raw_rate
            print(f"throughput vs raw at 100,000: {ratio:.2f} (target 0.30): "
                  f"{'met' if ratio >= 0.3 else 'NOT met'}")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--rounds", type=int, default=8, help="paced: samples per workload")
    parser.add_argument("--hot", type=int, default=100, help="workloads that upsize each sample")
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64, help="fetch batch, both consumers")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FRACPILOT_X=VALUE",
        help="a setting of the decision service (repeat)",
    )
    parser.add_argument("--profile", type=Path, help="write the decision service's cProfile")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    size = check_payload()
    print(f"{machine_note()}; sample {size} bytes; {args.partitions} partitions"
          f"{'; ' + ' '.join(args.set) if args.set else ''}")  # fmt: skip
    paced_rows, drains = [], []
    for w in args.workloads:
        print(f"... paced, {w:,} workloads", flush=True)
        paced_rows.append(await paced(w, args))
        if not args.skip_drain:
            print(f"... backlog, {w:,} workloads", flush=True)
            drains.append(await drain(w, args))
    report(paced_rows, drains)


if __name__ == "__main__":
    asyncio.run(main())
