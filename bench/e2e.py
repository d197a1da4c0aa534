"""End to end at 1,000, 10,000 and 100,000 workloads, next to raw nats-py on the same server;
with ``--cluster``, R3 on a three-node JetStream cluster next to R1 on one server.

Usage: python bench/e2e.py [--workloads 1000 10000 100000] [--rounds 8 | --duration S]
                           [--interval 15] [--hot 100] [--backlog 200000] [--partitions 16]
                           [--profile DIR] [--cluster [--pairs 1]] [--wire sample|batch|both]
                           [--only R1|R3] [--nats-stats] [--nats-profile DIR]

For each workload count, on a fresh embedded nats-server, with one decision replica and the
actuator on the simulated cluster (each a process, as deployed):

1. **paced**: every workload sends a sample every ``--interval`` s (15: ``workloads / 15``
   samples/s) for ``--rounds`` rounds (or ``--duration`` seconds). Reported: the samples/s
   decided; the time from a sample published to its decision (samples that caused one:
   ``--hot`` workloads growing) and to the decision's ``ActuationResult``, p50 and p99; the
   decision service's lag for every sample (stored in the stream to decided, its
   ``fracpilot_decision_sample_lag_seconds`` histogram), p50 and p99; the backlog (samples due
   by then at the paced rate, not yet decided) at quarters of the publishing window, so that a
   run that cannot keep up says so; and the CPU of the decision service and of nats-server.
2. **backlog**: ``--backlog`` samples published first, then the decision service started: the
   samples/s it decides them at (from ready to the last one decided).
3. **raw**: the same number of messages of the same size (the same sample JSON, the same
   ``Nats-Msg-Id`` header) published to a plain JetStream stream on the same server, then
   drained by a nats-py pull consumer (fetch in batches of ``--batch``, ack each message):
   the baseline, and the ratio of (2) to it.

``--wire batch`` publishes the paced samples as ingest does by default, in usage batches (one
message per partition and round, :mod:`fracpilot_libs.nats.usage_batch`); ``--wire both`` runs
each paced row once a sample a message (the old format) and once in batches, side by side. The
backlog then counts the samples due at the paced rate, not the messages stored.

``--cluster`` runs (1) and (2) twice for each workload count, in one run: on one nats-server
(streams and buckets R1, as the services choose on a single server) and on three nats-server
processes routed as one cluster on loopback (``tests/support/nats_cluster.py``; the services
see a cluster and make every stream and bucket R3; the bench reads the replicas back and
prints them). nats-server CPU is the sum over its processes (``/proc/<pid>/stat``), per
sample published. Printed side by side with the ratios R3 / R1. No raw baseline there.
``--only R3`` runs one side alone; ``--nats-stats`` prints what the servers carried meanwhile
(messages and bytes by client and over the routes, each stream's messages stored, each
consumer's deliveries, from each node's monitoring pages); ``--nats-profile DIR`` writes each
node's Go CPU profile (``go tool pprof -top DIR/nats-*``).

The publisher is a process of its own (asyncio, ``publish_async``), on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

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

from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.server_process import free_port
from support.nats_cluster import ClusterNode, NatsCluster, replicas_of

LAG = "fracpilot_decision_sample_lag_seconds"
SAMPLES = "fracpilot_decision_samples_total"
BACKLOG_EVERY_S = 2.0
WIRE_LABEL = {"sample": "one sample a message", "batch": "usage batches"}


@dataclass(frozen=True)
class NatsUnderTest:
    """The NATS the pipeline runs on: its client URLs and its server processes."""

    label: str
    url: str  # comma-separated for a cluster, as FRACPILOT_NATS_URL takes it
    pids: tuple[int, ...]
    monitors: tuple[str, ...] = ()  # each node's monitoring endpoint, http://host:port
    profilers: tuple[str, ...] = ()  # each node's Go pprof endpoint (--nats-profile)

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)


@contextlib.contextmanager
def one_server() -> Iterator[NatsUnderTest]:
    with EmbeddedNats() as server:
        assert server.proc is not None
        yield NatsUnderTest("one server", server.url, (server.proc.pid,))


class ProfiledNode(ClusterNode):
    """A cluster node that also serves Go's pprof (nats-server's ``--profile`` port)."""

    def __init__(self, name: str, store_dir: Path) -> None:
        super().__init__(name, store_dir)
        self.profile_port = free_port()

    def command(self, routes: list[str]) -> list[str]:
        return [*super().command(routes), "--profile", str(self.profile_port)]


PROFILE_NATS = False  # --nats-profile: the cluster's nodes serve pprof


@contextlib.contextmanager
def three_nodes() -> Iterator[NatsUnderTest]:
    cluster = NatsCluster(3)
    if PROFILE_NATS:
        cluster.nodes = [ProfiledNode(n.name, n.store_dir) for n in cluster.nodes]
    with cluster:
        pids = tuple(n.proc.pid for n in cluster.nodes if n.proc is not None)
        yield NatsUnderTest(
            "three nodes",
            cluster.url,
            pids,
            tuple(f"http://127.0.0.1:{n.monitor_port}" for n in cluster.nodes),
            tuple(
                f"http://127.0.0.1:{n.profile_port}"
                for n in cluster.nodes
                if isinstance(n, ProfiledNode)
            ),
        )


# --- what nats-server's traffic is made of (--nats-stats) ----------------------------------------


def monitor(base: str, page: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/{page}", timeout=5) as response:
        return dict(json.loads(response.read()))


def traffic(nut: NatsUnderTest) -> Counter[str]:
    """Messages and bytes by kind, summed over the nodes: each client connection by its name
    (in = to the server), the routes between the nodes, JetStream API requests."""
    out: Counter[str] = Counter()
    for base in nut.monitors:
        for c in monitor(base, "connz?limit=1024").get("connections") or []:
            who = str(c.get("name") or "unnamed")
            for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
                out[f"client {who} {k}"] += int(c.get(k) or 0)
        for r in monitor(base, "routez").get("routes") or []:
            for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
                out[f"routes {k}"] += int(r.get(k) or 0)
        jsz = monitor(base, "jsz")
        out["jetstream api requests"] += int((jsz.get("api") or {}).get("total") or 0)
        varz = monitor(base, "varz")
        for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
            out[f"server {k}"] += int(varz.get(k) or 0)
    out.update(stream_counts(nut))
    return out


def stream_counts(nut: NatsUnderTest) -> Counter[str]:
    """Each stream's messages and bytes stored, each consumer's deliveries and acknowledgement
    floor (the most any node has seen: every replica reports them)."""
    seen: dict[str, int] = {}
    page = "jsz?accounts=true&streams=true&consumers=true"
    for base in nut.monitors:
        for account in monitor(base, page).get("account_details") or []:
            for st in account.get("stream_detail") or []:
                state = st.get("state") or {}
                counts = {
                    f"stream {st['name']} stored msgs": int(state.get("last_seq") or 0),
                    f"stream {st['name']} stored bytes": int(state.get("bytes") or 0),
                }
                for c in st.get("consumer_detail") or []:
                    who = f"consumer {st['name']}/{c['name']}"
                    counts[f"{who} delivered"] = int(
                        (c.get("delivered") or {}).get("consumer_seq") or 0
                    )
                    counts[f"{who} ack floor"] = int(
                        (c.get("ack_floor") or {}).get("consumer_seq") or 0
                    )
                for key, value in counts.items():
                    seen[key] = max(seen.get(key, 0), value)
    return Counter(seen)


def print_traffic(before: Counter[str], after: Counter[str], samples: int, seconds: float) -> None:
    print(f"    nats traffic over {seconds:.0f} s, all nodes (per s; per 1,000 samples)")
    for key in sorted(after):
        delta = after[key] - before.get(key, 0)
        if delta > 0:
            print(f"      {key:<58}{delta / seconds:>14,.1f}{delta / samples * 1000:>14,.1f}")


async def profile_nodes(nut: NatsUnderTest, seconds: int, into: Path, tag: str) -> None:
    """Each node's CPU profile over ``seconds`` (Go pprof), written into ``into``."""

    def one(i: int, base: str) -> None:
        url = f"{base}/debug/pprof/profile?seconds={seconds}"
        with urllib.request.urlopen(url, timeout=seconds + 30) as response:
            (into / f"nats-{tag}-n{i}.pprof").write_bytes(response.read())

    await asyncio.gather(*(asyncio.to_thread(one, i, base) for i, base in enumerate(nut.profilers)))


async def stream_replicas(url: str) -> str:
    """The replicas the services gave the streams and buckets, e.g. ``R3`` or ``R1-3``."""
    found = set((await replicas_of(url)).values())
    return f"R{min(found)}" if len(found) == 1 else f"R{min(found)}-{max(found)}"


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
    server_cores: float  # nats-server (all its processes), in cores, while paced
    server_cpu_us: float = math.nan  # nats-server CPU per sample published, microseconds
    server_idle_cores: float = math.nan  # nats-server before the first sample (services idle)
    server_marginal_us: float = math.nan  # server_cpu_us less the idle cores' share
    publishing_s: float = math.nan
    decided_while_publishing: float = math.nan  # samples/s decided within the publishing window
    backlog: list[float] = field(default_factory=list)  # at 1/4, 1/2, 3/4, end of publishing
    replicas: str = ""
    nats: str = ""
    wire: str = "sample"  # one sample a message, or usage batches


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
    replicas: str = ""
    nats: str = ""


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


async def watch_backlog(
    url: str, port: int, base: float, out: list[tuple[float, float]], due: Due | None = None
) -> None:
    """Every few seconds: (monotonic time, samples stored in the usage streams not yet decided).
    With usage batches a stored message holds many samples: the samples due by then at the
    paced rate (``due``) stand for those stored."""
    nc = await nats.connect(url.split(","))
    js = nc.jetstream()
    try:
        while True:
            with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
                # decided first, stored second: a sample is stored before it is decided
                snapshot = await asyncio.to_thread(scrape, port)  # off the loop: the observer
                infos = await js.streams_info()
                stored = (
                    due.at(time.monotonic())
                    if due is not None
                    else sum(
                        i.state.messages
                        for i in infos
                        if str(i.config.name).startswith(subjects.USAGE_STREAM_PREFIX)
                    )
                )
                out.append((time.monotonic(), stored - (metric(snapshot, SAMPLES) - base)))
            await asyncio.sleep(BACKLOG_EVERY_S)
    finally:
        await nc.close()


@dataclass(frozen=True)
class Due:
    """The samples due by a moment at the paced rate, from the publisher's start."""

    started: float
    rate: float
    total: int

    def at(self, now: float) -> float:
        return min(float(self.total), max(0.0, (now - self.started) * self.rate))


def backlog_at_quarters(
    points: list[tuple[float, float]], start: float, seconds: float
) -> list[float]:
    """The backlog nearest 1/4, 1/2, 3/4 and the end of the publishing window."""
    if not points:
        return []
    return [
        min(points, key=lambda p: abs(p[0] - start - q * seconds))[1]
        for q in (0.25, 0.5, 0.75, 1.0)
    ]


async def declare(url: str, partitions: int, attempts: int = 6) -> None:
    """The streams made before the services start: on a loaded machine making 16 R3 streams
    can outlast a JetStream API request's timeout, and a service then exits at its start."""
    for attempt in range(attempts):
        try:
            await declare_streams(url, partitions)
            return
        except (nats.errors.TimeoutError, TimeoutError):
            if attempt == attempts - 1:
                raise
            print(f"    making the streams timed out (attempt {attempt + 1}); again", flush=True)


async def paced(workloads: int, args: argparse.Namespace, wire: str = "sample") -> Paced:
    with one_server() as nut:
        return await paced_on(nut, workloads, args, wire)


async def paced_on(
    nut: NatsUnderTest, workloads: int, args: argparse.Namespace, wire: str = "sample"
) -> Paced:
    hot = hot_set(workloads, args.hot)
    await declare(nut.url, args.partitions)
    tag = f"paced-{nut.label.replace(' ', '-')}-{wire}"
    actuator, decision, port = start_pipeline(nut.url, workloads, hot, args, tag)
    observer = Observer()
    points: list[tuple[float, float]] = []
    try:
        wait_ready(port)
        await observer.start(nut.url)
        idle0 = nut.cpu_seconds()  # nats-server with the services connected, no samples
        await asyncio.sleep(args.idle)
        idle_cores = (nut.cpu_seconds() - idle0) / args.idle if args.idle else math.nan
        before = scrape(port)
        base = metric(before, SAMPLES)
        cpu0, srv0 = cpu_seconds(decision.proc.pid), nut.cpu_seconds()
        traffic0 = traffic(nut) if args.nats_stats and nut.monitors else None
        target = workloads / args.interval
        total = workloads * args.rounds
        batches_of = args.partitions if wire == "batch" else 0
        plan = PublishPlan(
            nut.url, workloads, tuple(hot), args.rounds, rate=target, batches_of=batches_of
        )
        proc, pipe = start_publisher(plan)
        started = time.monotonic()
        due = Due(started, target, total) if batches_of else None
        watcher = asyncio.create_task(watch_backlog(nut.url, port, base, points, due))
        profiling = None
        if args.nats_profile and nut.profilers:
            profiling = asyncio.create_task(
                profile_nodes(nut, int(total / target / 2), args.nats_profile, tag)
            )
        published: dict[str, float] = await asyncio.to_thread(pipe.recv)
        proc.join()
        ended = time.monotonic()
        publishing_s = published["seconds"]  # from the first publish to the last one's ack
        at_publish_end = metric(await asyncio.to_thread(scrape, port), SAMPLES) - base
        points.append((ended, total - at_publish_end))
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        caught_up = await wait_decided(port, base + total, args.catch_up)
        elapsed = time.monotonic() - started
        used = cpu_seconds(decision.proc.pid) - cpu0
        server_used = nut.cpu_seconds() - srv0
        if traffic0 is not None:
            print_traffic(traffic0, traffic(nut), total, elapsed)
        if profiling is not None:
            await profiling
        await asyncio.sleep(1.0)  # the last results
        after = scrape(port)
        decided = metric(after, SAMPLES) - base
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
            decision_cores=used / elapsed,
            decision_cpu_us=used / max(decided, 1) * 1e6,
            server_cores=server_used / elapsed,
            server_cpu_us=server_used / total * 1e6,
            server_idle_cores=idle_cores,
            server_marginal_us=(server_used - idle_cores * elapsed) / total * 1e6,
            publishing_s=publishing_s,
            decided_while_publishing=at_publish_end / publishing_s,
            backlog=backlog_at_quarters(points, ended - publishing_s, publishing_s),
            replicas=await stream_replicas(nut.url),
            nats=nut.label,
            wire=wire,
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


async def drain_on(nut: NatsUnderTest, workloads: int, args: argparse.Namespace) -> Drain:
    """The backlog drained by the decision service (no raw baseline)."""
    hot = hot_set(workloads, args.hot)
    rounds = max(1, math.ceil(args.backlog / workloads))
    total = rounds * workloads
    await declare(nut.url, args.partitions)
    plan = PublishPlan(nut.url, workloads, tuple(hot), rounds)
    proc, pipe = start_publisher(plan)
    proc.join()
    published: dict[str, float] = pipe.recv()

    tag = f"backlog-{nut.label.replace(' ', '-')}"
    actuator, decision, port = start_pipeline(nut.url, workloads, hot, args, tag)
    try:
        wait_ready(port)
        started = time.monotonic()
        cpu0, srv0 = cpu_seconds(decision.proc.pid), nut.cpu_seconds()
        done = await wait_decided(port, total, 600)
        fracpilot_rate = total / (done if done else time.monotonic() - started)
        decision_cpu = (cpu_seconds(decision.proc.pid) - cpu0) / total * 1e6
        server_cpu = (nut.cpu_seconds() - srv0) / total * 1e6
    finally:
        decision.stop()
        actuator.stop()
    return Drain(
        workloads, total, fracpilot_rate, math.nan, published["rate"], int(published["bytes"]),
        decision_cpu, server_cpu, math.nan, await stream_replicas(nut.url), nut.label,
    )  # fmt: skip


async def drain(workloads: int, args: argparse.Namespace) -> Drain:
    with one_server() as nut:
        row = await drain_on(nut, workloads, args)
        total = row.samples
        rounds = total // workloads
        hot = hot_set(workloads, args.hot)
        nc = await nats.connect(nut.url)
        await nc.jetstream().add_stream(
            StreamConfig(name="BENCH_RAW", subjects=["bench.raw.>"], duplicate_window=120.0)
        )
        await nc.close()
        plan = PublishPlan(nut.url, workloads, tuple(hot), rounds, subject_prefix="bench.raw")
        proc, pipe = start_publisher(plan)
        proc.join()
        pipe.recv()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        consumer = ctx.Process(target=_raw_consumer, args=(nut.url, total, args.batch, child))
        srv0 = nut.cpu_seconds()
        consumer.start()
        row.raw_rate = parent.recv()
        consumer.join()
        row.raw_server_cpu_us = (nut.cpu_seconds() - srv0) / total * 1e6
    return row


def ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.0f}"


def report(paced_rows: list[Paced], drains: list[Drain]) -> None:
    if paced_rows:
        print(f"\npaced: a sample every {interval_of(paced_rows[0]):g} s per workload, one "
              "decision replica, simulated cluster")  # fmt: skip
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
        behind = "caught up" if p.caught_up_s is not None else "NOT caught up"
        print(
            f"{'':>10}  {WIRE_LABEL[p.wire]}; publisher {p.publish_rate:,.0f}/s; "
            f"after the last publish: {behind}"
            f"{f' in {p.caught_up_s:.1f} s' if p.caught_up_s is not None else ''}; "
            f"{p.results:,} results timed; CPU: decision service {p.decision_cores:.2f} "
            f"cores ({p.decision_cpu_us:.0f} us/sample), nats-server {p.server_cores:.2f} cores "
            f"({p.server_cpu_us:.0f} us/sample); backlog at 1/4..end of publishing: "
            f"{', '.join(f'{b:,.0f}' for b in p.backlog)}"
        )
    if drains:
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


# --- R3 on three nodes next to R1 on one server ------------------------------------------------


@dataclass
class Pair:
    workloads: int
    r1: Paced
    r3: Paced
    r1_drain: Drain | None = None
    r3_drain: Drain | None = None


def interval_of(p: Paced) -> float:
    return p.workloads / p.target


def keeps_up(p: Paced) -> str:
    """A verdict from the figures: caught up, and no more than 2 s of samples left undecided at
    the last publish (a run that keeps up has only what is in flight)."""
    if p.caught_up_s is None:
        return "NO: not caught up"
    end = p.backlog[-1] if p.backlog else math.nan
    if end > 2 * p.target:
        return f"NO: {end / p.target:.0f} s behind at the last publish"
    return "yes"


def report_pair(pair: Pair) -> None:
    a, b = pair.r1, pair.r3

    def row(name: str, x: float, y: float, fmt: str = ",.0f") -> None:
        ratio = y / x if x and not (math.isnan(x) or math.isnan(y)) else math.nan
        print(f"{name:<46}{format(x, fmt):>16}{format(y, fmt):>16}{ratio:>9.2f}")

    print(
        f"\npaced, {pair.workloads:,} workloads, a sample each every {interval_of(a):g} s "
        f"(target {a.target:,.0f}/s), {a.publishing_s:.0f} s of publishing, one decision replica, "
        f"{WIRE_LABEL[a.wire]}"
    )
    print(f"{'':<46}{a.replicas + ' ' + a.nats:>16}{b.replicas + ' ' + b.nats:>16}{'R3/R1':>9}")
    row("sample -> decision p50 ms", a.to_decision[0], b.to_decision[0])
    row("sample -> decision p99 ms", a.to_decision[1], b.to_decision[1])
    row("sample -> ActuationResult p99 ms", a.to_result[1], b.to_result[1])
    row("lag, every sample, p50 ms", a.lag[0], b.lag[0])
    row("lag, every sample, p99 ms", a.lag[1], b.lag[1])
    row("decided/s while publishing", a.decided_while_publishing, b.decided_while_publishing)
    row("decided/s, start to caught up (or timeout)", a.decided_rate, b.decided_rate)
    row("publisher samples/s", a.publish_rate, b.publish_rate)
    for i, q in enumerate(("1/4", "1/2", "3/4", "end")):
        if i < min(len(a.backlog), len(b.backlog)):
            row(f"backlog (due, not decided) at {q} of publishing", a.backlog[i], b.backlog[i])
    row("nats-server CPU us per sample (all processes)", a.server_cpu_us, b.server_cpu_us)
    row("nats-server cores (all processes)", a.server_cores, b.server_cores, ".2f")
    row("nats-server cores idle (services, no samples)", a.server_idle_cores,
        b.server_idle_cores, ".2f")  # fmt: skip
    row("nats-server CPU us per sample less idle", a.server_marginal_us, b.server_marginal_us)
    row("decision service CPU us per sample", a.decision_cpu_us, b.decision_cpu_us)
    row("decision service cores", a.decision_cores, b.decision_cores, ".2f")
    row("decisions timed", a.decisions, b.decisions)
    print(f"{'keeps up':<46}{keeps_up(a):>16}  {keeps_up(b)}")
    d, e = pair.r1_drain, pair.r3_drain
    if d is not None and e is not None:
        print(f"backlog of {d.samples:,} samples drained by the one decision replica")
        row("decided/s", d.fracpilot_rate, e.fracpilot_rate)
        row("publisher samples/s (as fast as acked)", d.publish_rate, e.publish_rate)
        row("decision service CPU us per sample", d.decision_cpu_us, e.decision_cpu_us)
        row("nats-server CPU us per sample (all processes)", d.server_cpu_us, e.server_cpu_us)


async def cluster_main(args: argparse.Namespace) -> None:
    pairs: list[Pair] = []
    for w, wire in ((w, wire) for w in args.workloads for wire in wires_of(args)):
        for n in range(args.pairs):
            runs: dict[str, tuple[Paced, Drain | None]] = {}
            for name, nats_under_test in (("R1", one_server), ("R3", three_nodes)):
                if args.only and name != args.only:
                    continue
                label = f"{w:,} workloads, {WIRE_LABEL[wire]}, {name} (pair {n + 1})"
                print(f"... paced, {label}", flush=True)
                with nats_under_test() as nut:
                    p = await paced_on(nut, w, args, wire)
                print(f"    p99 -> decision {ms(p.to_decision[1])} ms, decided "
                      f"{p.decided_while_publishing:,.0f}/s while publishing, backlog "
                      f"{', '.join(f'{b:,.0f}' for b in p.backlog)}", flush=True)  # fmt: skip
                d = None
                if not args.skip_drain and wire == "sample":
                    print(f"... backlog, {w:,} workloads, {name}", flush=True)
                    with nats_under_test() as nut:
                        d = await drain_on(nut, w, args)
                runs[name] = (p, d)
            if args.only:  # one side only: its row beside itself
                runs = {"R1": runs[args.only], "R3": runs[args.only]}
            pairs.append(Pair(w, runs["R1"][0], runs["R3"][0], runs["R1"][1], runs["R3"][1]))
            report_pair(pairs[-1])
    if len(pairs) > 1:
        print("\nall pairs")
        for pair in pairs:
            report_pair(pair)


def wires_of(args: argparse.Namespace) -> tuple[str, ...]:
    return ("sample", "batch") if args.wire == "both" else (args.wire,)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, nargs="+", default=None,
                        help="default 1000 10000 100000; with --cluster 100000")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8, help="paced: samples per workload")
    parser.add_argument("--duration", type=float, help="paced: seconds of publishing (sets rounds)")
    parser.add_argument("--interval", type=float, default=INTERVAL_S,
                        help="paced: seconds between a workload's samples")  # fmt: skip
    parser.add_argument("--catch-up", type=float, default=120.0,
                        help="paced: seconds to wait after the last publish")  # fmt: skip
    parser.add_argument("--idle", type=float, default=10.0,
                        help="paced: seconds nats-server's idle CPU is measured first")  # fmt: skip
    parser.add_argument("--hot", type=int, default=100, help="workloads that upsize each sample")
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64, help="fetch batch, both consumers")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--cluster", action="store_true",
                        help="R3 on a three-node cluster next to R1 on one server")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=1, help="--cluster: R1/R3 pairs per count")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FRACPILOT_X=VALUE",
        help="a setting of the decision service (repeat)",
    )
    parser.add_argument("--profile", type=Path, help="write the decision service's cProfile")
    parser.add_argument("--only", choices=("R1", "R3"), help="--cluster: that side alone")
    parser.add_argument("--nats-stats", action="store_true",
                        help="--cluster: nats traffic by client, routes, API")  # fmt: skip
    parser.add_argument("--nats-profile", type=Path, metavar="DIR",
                        help="--cluster: each node's Go CPU profile over the first half "
                        "of the publishing, into DIR (go tool pprof -top DIR/nats-*)")  # fmt: skip
    parser.add_argument(
        "--wire",
        choices=("sample", "batch", "both"),
        default="sample",
        help="paced samples one a message (the old format), in usage batches (what ingest "
        "publishes by default), or both side by side; the backlog drain stays one a message",
    )
    args = parser.parse_args()
    logging.getLogger("fracpilot_libs").setLevel(logging.ERROR)  # the bench's own bus clients
    if args.workloads is None:
        args.workloads = [100_000] if args.cluster else [1000, 10000, 100000]
    if args.duration is not None:
        args.rounds = max(1, round(args.duration / args.interval))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.nats_profile:
        args.nats_profile.mkdir(parents=True, exist_ok=True)
        global PROFILE_NATS
        PROFILE_NATS = True
    size = check_payload()
    print(f"{machine_note()}; sample {size} bytes; {args.partitions} partitions; "
          f"{args.rounds} rounds every {args.interval:g} s"
          f"{'; ' + ' '.join(args.set) if args.set else ''}")  # fmt: skip
    if args.cluster:
        await cluster_main(args)
        return
    paced_rows, drains = [], []
    for w in args.workloads:
        for wire in wires_of(args):
            print(f"... paced, {w:,} workloads, {WIRE_LABEL[wire]}", flush=True)
            paced_rows.append(await paced(w, args, wire))
        if not args.skip_drain:
            print(f"... backlog, {w:,} workloads", flush=True)
            drains.append(await drain(w, args))
    report(paced_rows, drains)


if __name__ == "__main__":
    asyncio.run(main())
