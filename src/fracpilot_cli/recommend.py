"""``fracpilot recommend``: a first look from the Prometheus a cluster already has.

Nothing is installed: the history of dcgm-exporter's, HAMi's and vLLM's series is read from
Prometheus (:mod:`fracpilot_cli.prometheus_history`), made into usage samples by the code ingest
runs (:mod:`fracpilot_libs.usage.history`: the same mappings, attribution and checks), and each
workload is replayed through the engine as ``fracpilot replay`` replays a trace
(:mod:`fracpilot_libs.analysis.recommendations`). The table says per workload the fraction
recommended, its compute and memory peaks, whether its memory is enforced, what it would save,
and below it the cards and nodes packing would free. ``-o html``: a page
(:mod:`fracpilot_cli.recommend_html`).

Exit codes: 0 when Prometheus was read (also when it holds no GPU series, or none in the
namespace asked for: the message says so), 1 when it could not be read (address, TLS,
refusal), 2 for options that do not parse.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fracpilot_cli import options, output, render
from fracpilot_cli.kube_access import context_namespace
from fracpilot_cli.prometheus_history import PrometheusHistory, PrometheusReadError
from fracpilot_cli.replay import load_policy
from fracpilot_cli.settings import CliSettings
from fracpilot_libs.analysis.recommendations import Recommendation, Recommendations, recommend
from fracpilot_libs.contracts import Policy
from fracpilot_libs.owners import owner_from_pod_name
from fracpilot_libs.prometheus_access import PrometheusAccess
from fracpilot_libs.usage.history import History
from fracpilot_libs.usage.mappings import MappingTable

EXIT_UNREADABLE = 1
EXIT_USAGE = 2
FORMATS = ("table", "wide", "json", "yaml", "csv", "html")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
MIN_STEP_S = 60.0
AUTO_STEPS = 4032  # 14 days at 5 minutes: enough for the engine, light enough to read
# Which exporter each mapping family is, in words people search for.
EXPORTERS = {
    "dcgm": "dcgm-exporter",
    "dcgm-process": "dcgm-exporter's per-process series (--kubernetes-virtual-gpus)",
    "hami": "HAMi's vGPUmonitor (v2.9+ names)",
    "hami-legacy": "HAMi's vGPUmonitor (legacy names)",
    "vllm": "vLLM",
}
GPU_FAMILIES = ("dcgm", "dcgm-process", "hami", "hami-legacy")


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"fracpilot recommend: error: {message}", err=True)
    raise typer.Exit(code=code)


def _note(message: str) -> None:
    typer.echo(f"fracpilot recommend: {message}", err=True)


def parse_duration(text: str) -> float:
    """``14d``, ``36h``, ``90m``, ``2w``, ``600s``: seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 14d, 36h or 90m")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def auto_step(since_s: float) -> float:
    """A minute for up to 2.8 days, then whatever keeps a series at AUTO_STEPS instants
    (rounded up to a whole minute: 14 days read at 5 minutes)."""
    steps = max(MIN_STEP_S, since_s / AUTO_STEPS)
    return float(-(-steps // 60) * 60)


def _headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            _fail(f"--header {pair!r}: give NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


def _missing_series_message(url: str, since: str, table: MappingTable, present: set[str]) -> str:
    wanted = [f for f in GPU_FAMILIES if any(r.family == f for r in table.rows)]
    examples = {
        f: ", ".join(dict.fromkeys(r.metric for r in table.rows if r.family == f)) for f in wanted
    }
    lines = [
        f"no GPU usage series in Prometheus at {url} over the last {since}: none of "
        + "; ".join(f"{EXPORTERS[f]} ({examples[f]})" for f in wanted)
        + " is there."
    ]
    if present:
        lines.append(f"(found only {', '.join(sorted(present))})")
    lines.append(
        "Is dcgm-exporter (or HAMi) installed and scraped by this Prometheus? Its "
        "ServiceMonitor or scrape job must point at it; extra matchers narrow with --matchers."
    )
    return "\n".join(lines)


def read_history(
    source: PrometheusHistory,
    table: MappingTable,
    cluster: str,
    start: float,
    end: float,
    step_s: float,
    err: Console,
) -> History:
    """Every instant of [start, end] read in chunks and made into samples as they come."""
    history = History(table, lambda ns, pod: owner_from_pod_name(cluster, ns, pod))
    chunks = source.ranges(start, end, step_s)
    with Progress(
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("reading history", total=len(chunks))
        for chunk in chunks:
            history.add_all(source.read(table.metric_names, chunk, step_s))
            progress.advance(task)
    return history


def _row_style(r: Recommendation) -> str:
    return "green" if r.recommended_fraction < r.held_fraction else ""


def listing(result: Recommendations, since: str, url: str) -> output.Listing[Recommendation]:
    col = output.Column[Recommendation]
    columns = [
        col("NAMESPACE", lambda r: r.workload.namespace),
        col("WORKLOAD", lambda r: r.workload.owner_name),
        col("KIND", lambda r: r.workload.owner_kind, wide=True),
        col("HELD", lambda r: render.fraction(r.held_fraction)),
        col("RECOMMENDED", lambda r: render.fraction(r.recommended_fraction)),
        col("COMPUTE PEAK", lambda r: render.percent(r.compute_peak)),
        col(
            "MEMORY PEAK",
            lambda r: f"{render.gib(r.memory_peak_bytes)} ({render.percent(r.memory_peak_share)})",
        ),
        col("MODE", lambda r: r.mode),
        col("SAVED", lambda r: f"{r.saved_pct:.0f}%"),
        col("USD/MONTH", lambda r: f"{r.monthly_saving_usd:,.0f}"),
        col("GPU", lambda r: r.gpu_model or "-", wide=True),
        col("PODS", lambda r: str(r.pods), wide=True),
        col("SAMPLES", lambda r: str(r.samples), wide=True),
    ]
    doc = result.as_dict()
    totals = doc["totals"]
    footer = [
        f"{totals['workloads']} workloads, {totals['samples']:,} samples over the last {since} "
        f"from {url}",
        f"saved over that history: {totals['saved_pct']:.1f}% of GPU-hours "
        f"({totals['saved_gpu_hours']:,.1f} h); at the recommendations: "
        f"${totals['monthly_saving_usd']:,.0f} a month",
        f"cards: {result.cards_held} held now, {result.cards_packed} packed at the "
        f"recommendations: {result.cards_freed} freed",
        _nodes_line(result),
    ]
    return output.Listing(
        rows=result.workloads,
        columns=columns,
        document=lambda: doc,
        record=lambda r: r.as_dict(),
        footer=footer,
        style=_row_style,
    )


def _nodes_line(result: Recommendations) -> str:
    if result.nodes_freed is None:
        return "nodes: the series name no node (dcgm-exporter's Hostname label)"
    return (
        f"nodes: {result.nodes_held} hold the workloads now, {result.nodes_packed} at the "
        f"recommendations: {result.nodes_freed} freed"
    )


@options.takes((*options.OUTPUT, "namespace"))
def recommend_command(
    prometheus_url: Annotated[
        str,
        typer.Option(
            "--prometheus-url",
            envvar="FRACPILOT_PROMETHEUS_URL",
            metavar="URL",
            help="the Prometheus (or Thanos, Mimir) that scrapes dcgm-exporter or HAMi",
        ),
    ],
    since: Annotated[
        str, typer.Option(metavar="DURATION", help="how much history to read: 14d, 36h, 90m")
    ] = "14d",
    step: Annotated[
        str,
        typer.Option(
            metavar="DURATION|auto",
            help="time between the instants read (auto: a minute, coarser for long ranges so "
            "that a series holds about 4,000 instants: 5m for 14d)",
        ),
    ] = "auto",
    all_namespaces: Annotated[
        bool, typer.Option("-A", "--all-namespaces", help="every namespace's workloads")
    ] = False,
    cluster: Annotated[
        str, typer.Option(metavar="NAME", help="the cluster's name on the workloads")
    ] = "default",
    matchers: Annotated[
        str,
        typer.Option(
            metavar="MATCHERS",
            help='extra PromQL label matchers for every series, e.g. cluster="prod"',
        ),
    ] = "",
    ca_file: Annotated[
        Path | None, typer.Option(metavar="PEM", help="CA bundle to verify Prometheus with")
    ] = None,
    insecure_skip_verify: Annotated[
        bool, typer.Option(help="do not verify Prometheus' certificate")
    ] = False,
    bearer_token_file: Annotated[
        Path | None, typer.Option(metavar="PATH", help="file holding a bearer token")
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME=VALUE", help="an extra request header (repeatable)"),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option("--policy", help="a Policy as JSON; the default policy if omitted"),
    ] = None,
) -> None:
    """Recommend GPU fractions from the history in Prometheus; installs nothing.

    Without -n or -A: the kubeconfig context's namespace, else default (kubectl's rule).
    -o table (default), wide, json, yaml, csv (one row per workload), html (a page).
    """
    given = options.given()
    try:
        fmt = output.choose(given.format(), "table", FORMATS)
    except (output.FormatError, options.OptionsError) as exc:
        _fail(str(exc))
    all_namespaces = all_namespaces or given.all_namespaces  # also before the command
    if all_namespaces and given.namespace:
        _fail("-n and -A: give one or the other")
    try:
        since_s = parse_duration(since)
        step_s = auto_step(since_s) if step == "auto" else parse_duration(step)
    except ValueError as exc:
        _fail(str(exc))
    if step_s <= 0 or since_s <= 0:
        _fail("--since and --step must be positive")
    namespace = (
        None
        if all_namespaces
        else (given.namespace or context_namespace(given.kubeconfig, given.context))
    )
    policy = load_policy(policy_file) if policy_file is not None else Policy()
    try:
        prices = CliSettings().prices
        access = PrometheusAccess(
            url=prometheus_url,
            matchers=matchers,
            verify_tls=not insecure_skip_verify,
            ca_file=str(ca_file) if ca_file else None,
            bearer_token_file=str(bearer_token_file) if bearer_token_file else None,
            headers=_headers(header or []),
        )
    except ValidationError as exc:
        _fail(f"invalid settings: {exc.errors(include_url=False)[0]['msg']}")
    err = Console(stderr=True)
    table = MappingTable.of()
    end = time.time()
    start = end - since_s
    started = time.monotonic()
    try:
        source = PrometheusHistory(access)
        source.check()
        present = source.present(table.metric_names, start, end)
        families = {r.family for r in table.rows if r.metric in present}
        if not families & set(GPU_FAMILIES):
            _note(_missing_series_message(access.url, since, table, present))
            _print_empty(fmt, namespace)
            return
        if "vllm" not in families:
            _note("no vLLM series: sizing without the queue and KV-cache signals")
        history = read_history(source, table, cluster, start, end, step_s, err)
    except PrometheusReadError as exc:
        _fail(str(exc), EXIT_UNREADABLE)
    read_s = time.monotonic() - started
    samples = history.samples
    if namespace is not None:
        found = sorted({s[0].workload.namespace for s in samples.values() if s})
        samples = {k: s for k, s in samples.items() if s and s[0].workload.namespace == namespace}
        if not samples:
            elsewhere = f" (found in {', '.join(found)}; -A shows them all)" if found else ""
            _note(f"no GPU workloads in namespace {namespace} over the last {since}{elsewhere}")
            _print_empty(fmt, namespace)
            return
    if not samples:
        reasons = ", ".join(f"{n} {r}" for r, n in history.rejected.most_common())
        example = next(iter(history.first_rejection.values()), "")
        _note(
            f"GPU series are there but no sample could be made of them ({reasons or 'none'}); "
            f"for example: {example}"
        )
        _print_empty(fmt, namespace)
        return
    result = recommend(samples, policy, prices, history.enforced_pods)
    if history.rejected:
        _note(
            "points left out: " + ", ".join(f"{n:,} {r}" for r, n in history.rejected.most_common())
        )
    if err.is_terminal:
        err.print(
            f"read {history.sample_count:,} samples in {read_s:.1f} s, sized in "
            f"{time.monotonic() - started - read_s:.1f} s",
            highlight=False,
        )
    if fmt == "html":
        from fracpilot_cli.recommend_html import render as render_html

        typer.echo(render_html(result.as_dict(), since, access.url))
        return
    output.emit(listing(result, since, access.url), fmt)


def _print_empty(fmt: str, namespace: str | None) -> None:
    if fmt in ("json", "yaml"):
        doc: dict[str, Any] = {"workloads": [], "totals": {"workloads": 0}}
        if namespace is not None:
            doc["namespace"] = namespace
        typer.echo(output.to_json(doc) if fmt == "json" else output.render_text(_empty(doc), fmt))


def _empty(doc: dict[str, Any]) -> output.Listing[Recommendation]:
    return output.Listing(rows=[], columns=[], document=lambda: doc, record=lambda r: {})
