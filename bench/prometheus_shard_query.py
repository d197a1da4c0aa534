"""What sharded ingest replicas cost Prometheus: their range queries against one unsharded query.

Usage: python bench/prometheus_shard_query.py [--gpus 10000] [--shards 32] [--owned 16 8 2]
                                              [--contiguous]
                                              [--repeat 7] [--batch 3] [--steps 1]
                                              [--scrape-interval 5] [--scrapes 4]

The real Prometheus (Debian's binary, tests/support/prometheus_server.py) scrapes an exporter
serving N GPUs as dcgm-exporter does (the test exporter of tests/support/gpu_exporter.py,
serving bench/ingest.py's series: 3 a GPU, GR_ENGINE_ACTIVE, FB_USED, FB_FREE, its labels and
UUIDs, job ``dcgm`` with the exporter pod's labels, so the pod labels are ``exported_*`` as in
a cluster). Once ``--scrapes`` scrapes are stored the target is taken out of the config, so
that Prometheus' own CPU is the queries' alone (a scrape of 150,000 series is not).

The queries are the ingest's own, made by the real code: an ingest service is built (not run)
with ``--shards`` shards and its prometheus source's client makes them: unsharded, every
mapped metric's selector (``RangeQueryClient.query``: one ingest, or a replica holding every
shard); sharded, ``RangeQueryClient.shard_query`` of the service's GPU label groups and
``CyclePlan.uuid_regex`` of the shards a replica holds (``range_queries.gpu_selector``: one
part per GPU label with a regex on the UUID, and one for the series naming no GPU, ``or``ed).
Each is sent as ``RangeQueryClient.query_range`` sends it (GET ``/api/v1/query_range``,
``start`` and ``end`` whole seconds, ``step`` the ingest interval) for one cycle's window
(``--steps`` instants, 1: a cycle in the steady state).

Layouts, the shards split among the replicas as bench/ingest_replicas.py splits them (replica
r holds r, r + R, ..., as leases hand them to replicas that start together; ``--contiguous``:
r·k to r·k + k - 1, as a replica that joins a running one is handed its half): one ingest,
unsharded (the baseline); for each ``--owned k``, ``shards / k`` replicas holding k shards
each; and, not a query the ingest sends, the first ``--owned``'s replicas asking by the UUID
regex alone (``selector`` with the matcher of
gpu_selector's first part, no ``or``, no part for the series naming no GPU): what the regex
costs against the rest of the query. Each round sends every replica's query of a
layout ``--batch`` times, then once more with ``stats=all``; rounds interleave the layouts
(the box is shared), ``--repeat`` rounds, medians printed. Per layout, summed over its
replicas (one query each, what one ingest cycle of the layout asks):

- Prometheus' CPU: its process's utime + stime (``/proc/<pid>/stat``) over the batch, per
  pass over the layout's queries; an idle stretch as long, measured the same way after each
  batch, is printed beside;
- server time: Prometheus' own ``execTotalTime`` (and ``queryPreparationTime``, the series'
  selection, where the matchers are applied) from ``stats=all``; and the HTTP request's wall
  time as the client sees it (the JSON encoding and transfer included);
- response bytes and series returned (a layout whose series do not add up to the unsharded
  query's is flagged).

The machine's load average is printed with them (/proc/loadavg).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

BENCH = Path(__file__).resolve().parent
TESTS = str(BENCH.parent / "tests")
METRICS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
# Labels of bench/ingest.py's series that Prometheus adds to a scraped one, or renames (the
# exporter's pod labels, as the target carries the exporter pod's: DCGM_POD).
ADDED_BY_PROMETHEUS = {"job", "instance"}
RENAMED = {
    "exported_namespace": "namespace",
    "exported_pod": "pod",
    "exported_container": "container",
}


def exposition_text(gpus: int) -> str:
    """bench/ingest.py's response as the exporter's text: its series and labels, but those
    Prometheus adds (``job``, ``instance``) and with the pod labels the exporter emits (the
    scrape target's pod labels make them ``exported_*`` again)."""
    sys.path.insert(0, TESTS)
    from ingest import prometheus_response

    from support.gpu_exporter import Exposition

    exposition = Exposition()
    for series in prometheus_response(gpus, 0.0):
        metric: dict[str, str] = dict(series["metric"])
        name = metric.pop("__name__")
        labels = [(RENAMED.get(k, k), v) for k, v in metric.items() if k not in ADDED_BY_PROMETHEUS]
        exposition.add(name, labels, float(series["values"][0][1]))
    text: str = exposition.text()
    return text


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (``/proc/<pid>/stat``, fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Layout:
    """The replicas of one layout, one query each, and the figures of each round."""

    name: str
    queries: list[str]
    cpu_s: list[float] = field(default_factory=list)  # per round: all replicas' queries
    exec_s: list[float] = field(default_factory=list)
    prep_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)  # no query, as long as the timed batch
    body_bytes: int = 0
    series: int = 0


def ingest_queries(
    url: str, step: float, shards: int, owned: Sequence[int], contiguous: bool = False
) -> list[Layout]:
    """The layouts' queries, made by the ingest's own code (a service built, not run).
    ``contiguous``: replica r holds shards r·k to r·k + k - 1 (what a replica joining a running
    one is handed: ``balance.rebalance`` keeps each member's lowest-numbered), else r, r + R, …."""
    from fracpilot_ingest.service import IngestService
    from fracpilot_ingest.settings import IngestSettings
    from fracpilot_ingest.shard_plan import plan_cycle
    from fracpilot_ingest.sources.prometheus import PrometheusSource
    from fracpilot_libs.usage.range_queries import selector

    settings = IngestSettings(
        nats={"url": "nats://127.0.0.1:1"}, sources="prometheus", cluster="bench",
        interval_s=step, prometheus={"url": url}, ingest={"shards": shards},
    )  # fmt: skip
    service = IngestService(settings)
    source, plan_shards = service.sources[0], service.shards
    assert isinstance(source, PrometheusSource)
    assert plan_shards is not None
    client = source.client
    layouts = [Layout("one ingest, unsharded", [client.query])]
    every = list(range(shards))
    regexes = {
        k: [
            plan_cycle(shards, held, {}, fallback=0.0).uuid_regex()
            for held in (
                [every[r * k : r * k + k] for r in range(shards // k)]
                if contiguous
                else [every[r :: shards // k] for r in range(shards // k)]
            )
        ]
        for k in owned
    }
    for k in owned:
        queries = [client.shard_query(plan_shards.label_groups, regex) for regex in regexes[k]]
        layouts.append(Layout(f"{shards // k} replicas x {k}/{shards} shards", queries))
    # Not the ingest's query: the first layout's replicas asking by their UUID regex alone (the
    # first of gpu_selector's parts, no ``or``), to tell the regex's cost from the other parts'.
    alone = [selector(client.metric_names, f'UUID=~"{regex}"') for regex in regexes[owned[0]]]
    layouts.append(Layout(f"{len(alone)} x {owned[0]}/{shards}, UUID regex alone*", alone))
    return layouts


def range_query(
    session: requests.Session, url: str, query: str, window: tuple[int, int], step: float,
    stats: bool = False,
) -> tuple[float, bytes]:  # fmt: skip
    """The request ``RangeQueryClient.query_range`` sends (``stats=all`` added when asked):
    its wall time and body."""
    params: dict[str, str | int] = {
        "query": query, "start": window[0], "end": window[1], "step": f"{step:g}s",
    }  # fmt: skip
    if stats:
        params["stats"] = "all"
    start = time.perf_counter()
    response = session.get(f"{url}/api/v1/query_range", params=params, timeout=120)
    seconds = time.perf_counter() - start
    response.raise_for_status()
    return seconds, response.content


def one_round(
    layout: Layout, session: requests.Session, url: str, pid: int, window: tuple[int, int],
    step: float, batch: int,
) -> float:  # fmt: skip
    """Every replica's query ``batch`` times, timed by Prometheus' CPU and the wall clock; then
    each once with ``stats=all``, for Prometheus' own times and the answers' size. Returns
    the seconds the timed batch took."""
    start = time.perf_counter()
    cpu, wall = cpu_seconds(pid), 0.0
    for _ in range(batch):
        for query in layout.queries:
            wall += range_query(session, url, query, window, step)[0]
    time.sleep(0.2)  # the Go collector's tail of the last answers' garbage
    layout.cpu_s.append((cpu_seconds(pid) - cpu) / batch)
    layout.wall_s.append(wall / batch)
    elapsed = time.perf_counter() - start
    exec_s = prep_s = 0.0
    body_bytes = series = 0
    for query in layout.queries:
        body = range_query(session, url, query, window, step, stats=True)[1]
        data: dict[str, Any] = json.loads(body)["data"]
        exec_s += data["stats"]["timings"]["execTotalTime"]
        prep_s += data["stats"]["timings"]["queryPreparationTime"]
        series += len(data["result"])
        body_bytes += len(body)  # with the stats, a few hundred bytes more than without
    layout.exec_s.append(exec_s)
    layout.prep_s.append(prep_s)
    layout.body_bytes, layout.series = body_bytes, series
    return elapsed


def idle_cpu(pid: int, seconds: float) -> float:
    """Prometheus' CPU over ``seconds`` of no queries (its own housekeeping)."""
    cpu = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - cpu


def run(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(BENCH), TESTS]
    from support.dcgm_prometheus import DCGM_POD
    from support.gpu_exporter import GpuTestExporter
    from support.prometheus_server import PrometheusServer, ScrapeTarget

    text = exposition_text(args.gpus)
    with GpuTestExporter() as exporter:
        exporter.set_metrics(text)
        target = ScrapeTarget("dcgm", exporter.address, labels=DCGM_POD)
        timeout = max(60.0, args.gpus / 1000)
        prom = PrometheusServer([target], scrape_interval=args.scrape_interval)
        with prom:
            prom.wait_for_targets_up(timeout=timeout)
            first = time.time()
            exporter.wait_for_scrapes(args.scrapes, timeout=args.scrapes * args.scrape_interval * 4)
            prom.wait_for_series(
                f"count({METRICS[0]})", timeout=timeout,
                predicate=lambda r: int(float(r[0]["value"][1])) == args.gpus,
            )  # fmt: skip
            # The window inside what is stored: the last instant scraped, ``--steps`` back.
            end = int(time.time()) - 1
            window = (max(int(first) + 1, end - round((args.steps - 1) * args.interval)), end)
            prom.set_targets([])  # no scrapes while the queries are timed
            time.sleep(2 * args.scrape_interval)
            pid = prom.pid
            assert pid is not None
            layouts = ingest_queries(
                prom.url, args.interval, args.shards, args.owned, args.contiguous
            )
            session = requests.Session()
            load_before = Path("/proc/loadavg").read_text().strip()
            for _ in range(args.repeat):
                for layout in layouts:
                    took = one_round(
                        layout, session, prom.url, pid, window, args.interval, args.batch
                    )
                    # As long as the timed batch (its sleep too), per pass as the batch's.
                    layout.idle_s.append(idle_cpu(pid, took) / args.batch)
            load_after = Path("/proc/loadavg").read_text().strip()
    report(args, layouts, window, load_before, load_after)


def report(
    args: argparse.Namespace, layouts: list[Layout], window: tuple[int, int],
    load_before: str, load_after: str,
) -> None:  # fmt: skip
    base = layouts[0]
    med = statistics.median
    instants = (window[1] - window[0]) // round(args.interval) + 1
    print(
        f"{args.gpus} GPUs, {3 * args.gpus} series; {args.shards} shards; a window of "
        f"{instants} instant(s), step {args.interval:g} s; medians of {args.repeat} rounds "
        f"(each {args.batch} x every replica's query, interleaved); {os.cpu_count()} cores; "
        f"/proc/loadavg {load_before} before, {load_after} after"
    )
    print(
        f"query length: unsharded {len(base.queries[0]):,} characters, a replica's "
        + ", ".join(f"{len(layout.queries[0]):,}" for layout in layouts[1:])
    )
    print(
        f"{'layout (sum over its replicas)':<34}{'series':>8}{'MB':>7}{'CPU ms':>8}{'x one':>7}"
        f"{'exec ms':>9}{'x one':>7}{'prep ms':>9}{'wall ms':>9}{'x one':>7}"
        f"{'replica CPU':>12}{'idle ms':>8}"
    )
    for layout in layouts:
        cpu, exec_s, wall = med(layout.cpu_s), med(layout.exec_s), med(layout.wall_s)
        print(
            f"{layout.name:<34}{layout.series:>8}{layout.body_bytes / 1e6:>7.2f}"
            f"{cpu * 1e3:>8.0f}{cpu / med(base.cpu_s):>7.2f}"
            f"{exec_s * 1e3:>9.1f}{exec_s / med(base.exec_s):>7.2f}{med(layout.prep_s) * 1e3:>9.1f}"
            f"{wall * 1e3:>9.0f}{wall / med(base.wall_s):>7.2f}"
            f"{cpu / len(layout.queries) / med(base.cpu_s):>12.2f}{med(layout.idle_s) * 1e3:>8.0f}"
        )
        if layout.series != base.series:
            print(f"  !! {layout.series} series, not the unsharded query's {base.series}")
    print(
        f"CPU ms: Prometheus' utime + stime (1/{os.sysconf('SC_CLK_TCK')} s ticks) per pass "
        "over the layout's queries; 'idle ms': the same over as long with no query; "
        "'replica CPU': one replica's share of the layout's CPU against the unsharded query's; "
        "*: not a query the ingest sends (its first part alone)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument(
        "--owned", type=int, nargs="+", default=[16, 8, 2], help="shards a replica holds"
    )
    parser.add_argument("--repeat", type=int, default=7, help="rounds, interleaved")
    parser.add_argument("--batch", type=int, default=3, help="each query's times a round")
    parser.add_argument("--steps", type=int, default=1, help="instants in the window")
    parser.add_argument("--interval", type=float, default=15.0, help="the ingest interval")
    parser.add_argument("--scrape-interval", type=float, default=5.0)
    parser.add_argument("--scrapes", type=int, default=4, help="stored before the queries")
    parser.add_argument(
        "--contiguous", action="store_true", help="replica r holds shards r*k..r*k+k-1"
    )
    args = parser.parse_args()
    if any(args.shards % k or k >= args.shards for k in args.owned):
        parser.error("--owned: each a divisor of --shards, below it")
    logging.basicConfig(level=logging.ERROR)
    run(args)


if __name__ == "__main__":
    main()
