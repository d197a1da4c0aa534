"""Decision replicas: one against two, and a killed replica, at 100,000 workloads.

Usage: python bench/scaling.py [--workloads 100000] [--backlog 300000] [--partitions 16]
                               [--repeat 3] [--rounds 6] [--kill-after 2] [--skip-kill]
       python bench/scaling.py --wires [--compare REV] [--profile DIR] [--repeat 3]

Each replica is a process (``python -m fracpilot_decision``) on a fresh embedded nats-server.

1. **throughput**: a backlog of ``--backlog`` samples is published, then ``1`` (the baseline)
   or ``2`` replicas are started, announced in the partition bucket beforehand so that each
   claims its share at once; from the moment every replica owns its share, the samples/s
   decided until the backlog is gone, summed over the replicas, with the CPU the replicas and
   nats-server used per sample. The ratio of two to one is the scale-out; ``--repeat`` pairs
   of runs alternate one and two replicas and the median ratio is reported (on a shared
   2-core machine single runs vary by a third).
2. **kill**: two replicas, samples paced at one per workload every 15 s for ``--rounds``
   rounds; after ``--kill-after`` rounds one replica is SIGKILLed. Reported: how long until
   the survivor owns every partition and has caught up; then, with the survivor stopped
   (checkpoints written), every workload's checkpoint is read back: each must hold every
   sample published for it (none lost, none counted twice) and start at the first round
   (no history reset).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nats
from nats.js.api import KeyValueConfig
from pipeline_harness import (
    INTERVAL_S,
    PublishPlan,
    Service,
    cpu_seconds,
    decision_env,
    declare_streams,
    log_dir,
    machine_note,
    metric,
    poll_until,
    scrape,
    start_publisher,
    wait_ready,
)
from prometheus_client import CollectorRegistry

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.decision_backlog import decision_backlog
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.server_process import free_port

OWNED = "fracpilot_decision_partitions_owned"
SAMPLES = "fracpilot_decision_samples_total"


def start_replicas(
    url: str,
    count: int,
    partitions: int,
    tag: str,
    *,
    code: str | None = None,
    profile: Path | None = None,
) -> list[tuple[Service, int]]:
    """``code``: a PYTHONPATH to run the replicas from (another commit's, ``--compare``);
    ``profile``: the first replica's cProfile written there."""
    logs = log_dir("scaling")
    out = []
    for i in range(count):
        port = free_port()
        env = decision_env(
            url,
            port,
            FRACPILOT_DECISION_PARTITIONS=str(partitions),
            FRACPILOT_REPLICA_ID=f"{tag}-{i}",
        )
        if code is not None:
            env["PYTHONPATH"] = code
        log, prof = logs / f"{tag}-{i}.log", profile if i == 0 else None
        out.append((Service("fracpilot_decision", env, log, prof).start(), port))
    for _, port in out:
        wait_ready(port, timeout_s=300)
    return out


def total(replicas: list[tuple[Service, int]], name: str) -> float:
    value = 0.0
    for service, port in replicas:
        if service.proc is not None and service.proc.poll() is None:
            value += metric(scrape(port), name)
    return value


async def announce(url: str, names: list[str]) -> None:
    """Write the replicas' member keys before they start, as if they had been running: each
    claims its share at once, instead of one claiming all and handing half over."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    kv = await js.create_key_value(
        KeyValueConfig(bucket=subjects.DECISION_PARTITION_BUCKET, history=1, ttl=10.0)
    )
    for name in names:
        await kv.put(f"member.{name}", b"{}")
    await nc.close()


@dataclass(frozen=True)
class Throughput:
    rate: float  # samples decided per second, summed over the replicas
    replica_cpu_us: float  # CPU of all replicas per sample decided
    server_cpu_us: float  # nats-server CPU per sample decided
    cores: float  # replicas + nats-server, cores used on average in the window


async def throughput(replicas_n: int, args: argparse.Namespace) -> Throughput:
    """One run; again (up to three times) when the partitions were not shared out before a
    quarter of the backlog was decided: such a run measures a tail, not the replicas."""
    for _ in range(3):
        result = await _throughput(replicas_n, args)
        if result is not None:
            return result
    raise RuntimeError("the replicas never shared the partitions out in time")


async def _throughput(replicas_n: int, args: argparse.Namespace) -> Throughput | None:
    with EmbeddedNats() as server:
        await declare_streams(server.url, args.partitions)
        rounds = max(1, args.backlog // args.workloads)
        backlog = rounds * args.workloads
        proc, pipe = start_publisher(PublishPlan(server.url, args.workloads, (), rounds))
        proc.join()
        pipe.recv()
        tag = f"x{replicas_n}"
        await announce(server.url, [f"{tag}-{i}" for i in range(replicas_n)])
        replicas = start_replicas(server.url, replicas_n, args.partitions, tag)
        share = args.partitions // replicas_n
        try:
            await poll_until(
                lambda: all(metric(scrape(p), OWNED) == share for _, p in replicas), 0.05
            )
            pids = [s.proc.pid for s, _ in replicas if s.proc is not None]
            t0, done0 = time.monotonic(), total(replicas, SAMPLES)
            if done0 > backlog / 4:
                print(f"    {replicas_n} replica(s): {done0:,.0f} decided before the "
                      "partitions were shared out; run again", flush=True)  # fmt: skip
                return None
            cpu0, srv0 = sum(map(cpu_seconds, pids)), cpu_seconds(server.proc.pid)
            await poll_until(lambda: total(replicas, SAMPLES) >= backlog)
            t1, done = time.monotonic(), total(replicas, SAMPLES)
            cpu, srv = sum(map(cpu_seconds, pids)) - cpu0, cpu_seconds(server.proc.pid) - srv0
            print(f"    {replicas_n} replica(s): {done - done0:,.0f} samples measured "
                  f"(of {backlog:,}) in {t1 - t0:.1f} s", flush=True)  # fmt: skip
            n = done - done0
            return Throughput(n / (t1 - t0), cpu / n * 1e6, srv / n * 1e6, (cpu + srv) / (t1 - t0))
        finally:
            for service, _ in replicas:
                service.stop()


async def kill(args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    with EmbeddedNats() as server:
        await declare_streams(server.url, args.partitions)
        replicas = start_replicas(server.url, 2, args.partitions, "kill")
        (victim, victim_port), (survivor, port) = replicas
        await poll_until(lambda: metric(scrape(port), OWNED) == args.partitions // 2)
        rate = args.workloads / INTERVAL_S
        plan = PublishPlan(server.url, args.workloads, (), args.rounds, rate=rate)
        proc, pipe = start_publisher(plan)
        await asyncio.sleep(args.kill_after * INTERVAL_S)
        out["victim_decided"] = metric(scrape(victim_port), SAMPLES)
        victim.kill()  # SIGKILL: no checkpoint, no acknowledgement, leases left to run out
        killed = time.monotonic()
        await poll_until(lambda: metric(scrape(port), OWNED) == args.partitions)
        out["takeover_s"] = time.monotonic() - killed
        await asyncio.to_thread(proc.join)
        published = pipe.recv()
        out["publish_rate"] = published["rate"]
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        while True:  # caught up: every sample acknowledged, so checkpointed
            backlog = await decision_backlog(js)
            if backlog is not None and backlog.caught_up:
                break
            await asyncio.sleep(0.2)
        out["caught_up_s"] = time.monotonic() - killed
        reg = scrape(port)
        out["duplicates"] = metric(reg, "fracpilot_decision_duplicate_samples_total")
        out["restored"] = metric(reg, "fracpilot_decision_checkpoints_restored_total")
        out["lag_p99_after"] = 0.0
        survivor.stop()  # hands over: every state written
        states = await Checkpointer(nc, CollectorRegistry()).restore(
            frozenset(range(args.partitions)), args.partitions
        )
        await nc.close()
    found = [s for part in states.values() for s in part.values()]
    out["checkpoints"] = len(found)
    out["complete"] = sum(1 for s in found if s.samples == args.rounds)
    out["short"] = sum(1 for s in found if s.samples < args.rounds)
    out["over"] = sum(1 for s in found if s.samples > args.rounds)
    first = min((s.first_seen for s in found if s.first_seen is not None), default=0.0)
    out["reset"] = sum(1 for s in found if s.first_seen is not None and s.first_seen > first + 60)
    return out


async def _drain(
    args: argparse.Namespace,
    batched: bool,
    code: str | None = None,
    profile: Path | None = None,
) -> Throughput:
    """One replica, owning every partition, deciding a backlog published meanwhile as fast as
    the publisher (a process of its own) goes: one sample a message, or usage batches.
    ``code``: the replica run from there (PYTHONPATH); ``profile``: its cProfile."""
    with EmbeddedNats() as server:
        await declare_streams(server.url, args.partitions)
        rounds = max(1, args.backlog // args.workloads)
        backlog = rounds * args.workloads
        await announce(server.url, ["w-0"])
        replicas = start_replicas(server.url, 1, args.partitions, "w", code=code, profile=profile)
        try:
            await poll_until(lambda: metric(scrape(replicas[0][1]), OWNED) == args.partitions)
            pid = replicas[0][0].proc.pid  # type: ignore[union-attr]
            t0, cpu0, srv0 = time.monotonic(), cpu_seconds(pid), cpu_seconds(server.proc.pid)
            plan = PublishPlan(
                server.url, args.workloads, (), rounds, batches_of=args.partitions if batched else 0
            )
            proc, pipe = start_publisher(plan)
            await poll_until(lambda: total(replicas, SAMPLES) >= backlog)
            t1 = time.monotonic()
            cpu, srv = cpu_seconds(pid) - cpu0, cpu_seconds(server.proc.pid) - srv0
            proc.join()
            pipe.recv()
            return Throughput(
                backlog / (t1 - t0),
                cpu / backlog * 1e6,
                srv / backlog * 1e6,
                (cpu + srv) / (t1 - t0),
            )
        finally:
            for service, _ in replicas:
                service.stop()


def code_of(rev: str, into: str) -> str:
    """Commit ``rev``'s libs and decision service unpacked into ``into``; their PYTHONPATH."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "libs/src", "services/decision/src"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return f"{into}/libs/src:{into}/services/decision/src"


async def wires(args: argparse.Namespace) -> None:
    """The same samples published one a message (today's format) and in usage batches,
    decided by one replica, alternated ``--repeat`` times, side by side; with ``--compare``,
    batches decided by that commit's replica too. ``--profile``: the batch runs' cProfile."""
    runs: list[list[tuple[str, Throughput]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        old = code_of(args.compare, tmp) if args.compare else None
        for i in range(args.repeat):
            prof = args.profile / f"decision-batch-{i + 1}.prof" if args.profile else None
            run = [("sample", await _drain(args, False)), ("batch", await _drain(args, True))]
            if old is not None:  # never profiled: its CPU figure stays comparable
                run.append((f"batch@{args.compare}", await _drain(args, True, old)))
            if prof is not None:  # profiled last: cProfile slows the replica (its own run)
                run.append(("batch, profiled", await _drain(args, True, profile=prof)))
            runs.append(run)
    print(f"\none replica deciding {args.backlog:,} samples as they are published (the "
          "publisher shares the 2 cores): one sample a message (today) vs batches")  # fmt: skip
    print(f"{'run':>4}{'wire':>22}{'samples/s':>12}{'vs today':>9}"
          f"{'replica CPU/sample':>20}{'nats CPU/sample':>17}")  # fmt: skip
    for i, run in enumerate(runs, 1):
        single = run[0][1]
        for wire, t in run:
            print(f"{i:>4}{wire:>22}{t.rate:>12,.0f}{t.rate / single.rate:>9.2f}"
                  f"{t.replica_cpu_us:>18.0f}us{t.server_cpu_us:>15.0f}us")  # fmt: skip
    for wire in dict.fromkeys(w for run in runs for w, _ in run):
        cpu = [t.replica_cpu_us for run in runs for w, t in run if w == wire]
        print(f"median replica CPU per sample, {wire}: {statistics.median(cpu):.0f}us "
              f"(of {len(cpu)})")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--kill-after", type=float, default=2.0, help="rounds before the kill")
    parser.add_argument("--repeat", type=int, default=3, help="1-vs-2 pairs, alternated")
    parser.add_argument("--skip-kill", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--wires", action="store_true",
                        help="only: one sample a message against usage batches")  # fmt: skip
    parser.add_argument("--compare", metavar="REV",
                        help="--wires: batches decided by this commit's replica too")  # fmt: skip
    parser.add_argument("--profile", type=Path,
                        help="--wires: the batch replica's cProfile, here")  # fmt: skip
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"{machine_note()}; {args.workloads:,} workloads, {args.partitions} partitions")
    if args.wires:
        await wires(args)
        return
    if not args.skip_throughput:
        print("... throughput", flush=True)
        pairs: list[tuple[Throughput, Throughput]] = []
        for _ in range(args.repeat):  # alternated: a slow spell of the machine hits both
            one = await throughput(1, args)
            two = await throughput(2, args)
            pairs.append((one, two))
        print("\nthroughput, backlog drained by decision replicas (processes)")
        print(f"{'run':>4}{'replicas':>9}{'samples/s':>12}{'vs one':>8}"
              f"{'replica CPU/sample':>20}{'nats CPU/sample':>17}{'cores used':>12}")  # fmt: skip
        for i, (one, two) in enumerate(pairs, 1):
            for n, t in ((1, one), (2, two)):
                print(f"{i:>4}{n:>9}{t.rate:>12,.0f}{t.rate / one.rate:>8.2f}"
                      f"{t.replica_cpu_us:>18.0f}us{t.server_cpu_us:>15.0f}us"
                      f"{t.cores:>12.2f}")  # fmt: skip
        ratios = sorted(two.rate / one.rate for one, two in pairs)
        ratio = statistics.median(ratios)
        print(f"two replicas vs one, median of {len(pairs)} alternated runs: {ratio:.2f} "
              f"(each: {', '.join(f'{r:.2f}' for r in ratios)}; target 1.6): "
              f"{'met' if ratio >= 1.6 else 'NOT met'}")  # fmt: skip
    if not args.skip_kill:
        print("... kill", flush=True)
        k = await kill(args)
        n = args.workloads
        print(
            f"\nkill: 2 replicas, {n:,} workloads paced at {n / INTERVAL_S:,.0f} samples/s "
            f"(publisher {k['publish_rate']:,.0f}/s), one SIGKILLed after "
            f"{args.kill_after:g} rounds (it had decided {k['victim_decided']:,.0f})"
        )
        print(f"{'what':<58}{'value':>12}")
        for what, value in (
            ("survivor owns every partition, s after the kill", f"{k['takeover_s']:.1f}"),
            ("survivor caught up (all acknowledged), s after the kill", f"{k['caught_up_s']:.1f}"),
            ("workloads restored from checkpoints by the survivor", f"{k['restored']:,.0f}"),
            ("samples delivered again and recognised (not recounted)", f"{k['duplicates']:,.0f}"),
            ("checkpoints read back", f"{k['checkpoints']:,.0f}"),
            (f"  holding all {args.rounds} samples", f"{k['complete']:,.0f}"),
            ("  missing a sample (lost)", f"{k['short']:,.0f}"),
            ("  counting a sample twice", f"{k['over']:,.0f}"),
            ("  history reset (starting after the first round)", f"{k['reset']:,.0f}"),
        ):
            print(f"{what:<58}{value:>12}")
        ok = k["complete"] == k["checkpoints"] == n and k["reset"] == 0
        print(f"no sample lost, no history reset: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    asyncio.run(main())
