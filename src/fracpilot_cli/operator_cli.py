"""``fracpilot status``, ``explain`` and ``report``: what fracpilot believes and did, from NATS.

Glue only: options (the global ones: :mod:`fracpilot_cli.options`; the connection:
:mod:`fracpilot_cli.connection`), the NATS reads (:mod:`fracpilot_cli.operator_data`), the
pure cores (:mod:`~fracpilot_cli.status`, :mod:`~fracpilot_cli.explain`,
:mod:`~fracpilot_cli.report`), their data for the output layer (:mod:`~fracpilot_cli.render`,
:mod:`~fracpilot_cli.output`) and the HTML report (:mod:`~fracpilot_cli.report_html`).
Exit codes: 0 done, 1 NATS unreachable or nothing to show, 2 bad usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import re
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from fracpilot_cli import options, output, render
from fracpilot_cli.connection import EXIT_UNAVAILABLE, EXIT_USAGE, cli_settings
from fracpilot_cli.explain import DecisionTimeline, build_timeline
from fracpilot_cli.mig_view import with_report_section
from fracpilot_cli.operator_data import (
    NatsUnavailableError,
    Window,
    connect,
    read_fleet,
    read_one,
    read_window,
    read_workload,
)
from fracpilot_cli.report import build_report
from fracpilot_cli.settings import CliSettings
from fracpilot_cli.status import (
    RISK_HELP,
    ConsolidationStatus,
    StatusRow,
    build_status_rows,
    consolidation_status,
)
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.pricing import GpuPrices

__all__ = ["EXIT_UNAVAILABLE", "EXIT_USAGE"]


def _fail(command: str, message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    typer.echo(f"fracpilot {command}: error: {message}", err=True)
    raise typer.Exit(code=code)


def _warn_problems(command: str, problems: list[str]) -> None:
    if problems:
        n = len(problems)
        typer.echo(
            f"fracpilot {command}: warning: {n} {'entry' if n == 1 else 'entries'} did not "
            f"decode and {'is' if n == 1 else 'are'} left out; first: {problems[0]}",
            err=True,
        )


def _format(
    command: str, opts: options.GlobalOptions, default: str, allowed: tuple[str, ...]
) -> str:
    try:
        return output.choose(opts.format(), default, allowed)
    except output.FormatError as exc:
        _fail(command, str(exc), EXIT_USAGE)
    except options.OptionsError as exc:  # --json with another -o
        _fail(command, str(exc), EXIT_USAGE)


def _namespaces(command: str, opts: options.GlobalOptions) -> str | None:
    try:
        return opts.namespaces()
    except options.OptionsError as exc:
        _fail(command, str(exc), EXIT_USAGE)


def program() -> str:
    """How to call this ``fracpilot``: its path beside the interpreter, relative when under the
    working directory (``.venv/bin/fracpilot``), else the name on PATH."""
    beside = Path(sys.executable).parent / "fracpilot"
    if not beside.exists():
        return "fracpilot"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def operator_hint(nats_url: str, example: str, embedded: bool) -> str:
    """The three commands to try against a running pipeline (the demo prints them)."""
    run = f"FRACPILOT_NATS_URL={nats_url} {program()}"
    until = " (the embedded NATS stops with the demo)" if embedded else ""
    return "\n".join(
        [
            f"While it runs, in another terminal{until}:",
            f"  {run} status --watch",
            f"  {run} explain {example}",
            f"  {run} report --since 1h --out fracpilot-report",
        ]
    )


# --- status ----------------------------------------------------------------------------------


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """No cyclic garbage collection while tens of thousands of objects are built and kept:
    each collection would walk them all again (a fifth of the CPU time of a large status).
    Reference counting still frees what is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def interrupt_flag() -> Iterator[Callable[[], bool]]:
    """Ctrl-C (SIGINT) while watching: raised as KeyboardInterrupt as usual, and remembered,
    because one that lands inside a NATS connect can come out of the client as a connection
    error (and the watch would go on). Yields "was it pressed?"."""
    pressed = False

    def on_interrupt(signum: int, frame: object) -> None:
        nonlocal pressed
        pressed = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: pressed
    finally:
        signal.signal(signal.SIGINT, previous)


async def status_rows(
    settings: CliSettings, prices: GpuPrices, namespace: str | None
) -> tuple[list[StatusRow], list[str]]:
    rows, problems, _ = await status_view(settings, prices, namespace)
    return rows, problems


async def status_view(
    settings: CliSettings, prices: GpuPrices, namespace: str | None
) -> tuple[list[StatusRow], list[str], ConsolidationStatus | None]:
    """The rows, the entries that did not decode, and consolidation's line."""
    with bulk():
        now = datetime.now(UTC)
        nc = await connect(settings)
        try:
            snapshot, policies = await read_fleet(nc, namespace, now)
        finally:
            await nc.close()
        rows = build_status_rows(snapshot, policies.for_workload, prices, now, namespace)
        consolidation = consolidation_status(
            snapshot.consolidation_reports, snapshot.consolidation_moves, now
        )
    return rows, snapshot.problems, consolidation


DOCUMENTS = ("json", "yaml")  # formats of one document; --watch prints one per refresh


async def _watch(
    settings: CliSettings,
    prices: GpuPrices,
    namespace: str | None,
    fmt: str,
    interval_s: float,
    console: Console,
    interrupted: Callable[[], bool],
) -> None:
    wide = fmt == "wide"
    with Live(console=console, auto_refresh=False, vertical_overflow="crop") as live:
        while not interrupted():
            now = datetime.now(UTC)
            try:
                rows, problems, consolidation = await status_view(settings, prices, namespace)
            except NatsUnavailableError as exc:  # keep watching: it may come back
                if interrupted():
                    break
                live.update(Text(f"{now:%H:%M:%S} {exc}", style="red"), refresh=True)
            else:
                head = Text(
                    f"every {interval_s:g}s: fracpilot status - {now:%Y-%m-%d %H:%M:%S} UTC"
                    + (f" ({len(problems)} entries did not decode)" if problems else "")
                    + "\n\n",
                    style="dim",
                )
                listing = render.status_listing(rows, now, consolidation)
                live.update(Text.assemble(head, output.styled(listing, wide)), refresh=True)
            await asyncio.sleep(interval_s)


def _watch_documents(
    settings: CliSettings,
    prices: GpuPrices,
    namespace: str | None,
    fmt: str,
    interval_s: float,
) -> None:
    """-o json/yaml/csv --watch: one document per refresh (JSON lines; YAML separated by ---;
    CSV rows with a header each time)."""
    with interrupt_flag() as interrupted:
        while not interrupted():
            _refresh_document(settings, prices, namespace, fmt, interrupted)
            asyncio.run(asyncio.sleep(interval_s))
    raise KeyboardInterrupt


def _refresh_document(
    settings: CliSettings,
    prices: GpuPrices,
    namespace: str | None,
    fmt: str,
    interrupted: Callable[[], bool],
) -> None:
    try:
        rows, problems, consolidation = asyncio.run(status_view(settings, prices, namespace))
    except NatsUnavailableError as exc:  # keep watching: it may come back
        if not interrupted():
            typer.echo(f"fracpilot status: error: {exc}", err=True)
        return
    _warn_problems("status", problems)
    listing = render.status_listing(rows, datetime.now(UTC), consolidation)
    if fmt == "json":
        sys.stdout.write(json.dumps(listing.document()) + "\n")
    elif fmt == "yaml":
        sys.stdout.write("---\n" + output.to_yaml(listing.document()))
    else:
        sys.stdout.write(output.render_text(listing, fmt))
    sys.stdout.flush()


@options.takes(options.READER)
def status_command(
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="refresh in place until interrupted")
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.2, help="seconds between refreshes with --watch")
    ] = 2.0,
) -> None:
    """One row per workload: the fraction and GPU memory it holds, its compute percentile (p95
    by default) and memory peak as shares of that fraction, the decision engine's target and
    state (stable, upsizing, downsizing, waiting to downsize with the time left in the engine's
    clock, that of the samples), the last action and its outcome, and the money saved per
    month against a whole GPU ((1 - fraction) x the GPU model's hourly price x 730; prices:
    FRACPILOT_GPU_PRICES / FRACPILOT_GPU_DEFAULT_PRICE).

    Under the table, consolidation's line from the actuator's latest plan (the cluster's,
    whatever -n says): "would free N GPUs / M nodes (K moves)" and the first moves; in auto
    mode what it freed today (UTC) first.

    -o table (default), wide (node, GPU, samples, policy too), json or yaml (a
    WorkloadStatusList document, consolidation under its `consolidation` key), csv (one row
    per item of that document); -n: one namespace's workloads.

    {risk}
    """
    opts = options.given()
    fmt = _format("status", opts, "table", output.FORMATS)
    namespace = _namespaces("status", opts)
    with cli_settings("status", opts) as settings:
        _status(settings, namespace, fmt, watch, interval)


def _status(
    settings: CliSettings, namespace: str | None, fmt: str, watch: bool, interval: float
) -> None:
    prices = settings.prices
    console = Console(highlight=False)
    try:
        if watch:  # until interrupted
            if fmt in (*DOCUMENTS, "csv"):
                _watch_documents(settings, prices, namespace, fmt, interval)
            else:
                with interrupt_flag() as interrupted:
                    asyncio.run(
                        _watch(settings, prices, namespace, fmt, interval, console, interrupted)
                    )
                raise KeyboardInterrupt  # the watch ends only when interrupted
        rows, problems, consolidation = asyncio.run(status_view(settings, prices, namespace))
    except NatsUnavailableError as exc:
        _fail("status", str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(code=0) from None
    _warn_problems("status", problems)
    if not rows and fmt not in (*DOCUMENTS, "csv"):
        where = f" in namespace {namespace}" if namespace else ""
        typer.echo(
            f"No workloads{where}: NATS at {settings.nats.url} holds no allocations, engine "
            "state, samples or actions.",
            err=True,
        )
        return
    output.emit(render.status_listing(rows, datetime.now(UTC), consolidation), fmt)


if status_command.__doc__:
    status_command.__doc__ = status_command.__doc__.replace("{risk}", RISK_HELP)


# --- explain ---------------------------------------------------------------------------------


async def timeline_of(settings: CliSettings, namespace: str, name: str) -> DecisionTimeline:
    nc = await connect(settings)
    try:
        decisions, results = await read_workload(nc, namespace, name)
        timeline = build_timeline(namespace, name, decisions, results)
        known = timeline.workload if timeline.entries else None
        snapshot, policies = await read_one(nc, namespace, name, known)
    finally:
        await nc.close()
    rows = build_status_rows(snapshot, policies.for_workload, settings.prices, datetime.now(UTC))
    status = next((r for r in rows if r.namespace == namespace and r.workload == name), None)
    workload = timeline.workload
    if status is not None and not timeline.entries:
        workload = WorkloadRef(
            cluster=status.cluster,
            namespace=namespace,
            owner_kind=status.kind,
            owner_name=name,
        )
    return DecisionTimeline(workload, timeline.entries, status)


EXPLAIN_FORMATS = ("text", *output.FORMATS)


@options.takes(options.READER)
def explain_command(
    workload: Annotated[str, typer.Argument(metavar="[NAMESPACE/]WORKLOAD")],
) -> None:
    """The workload's decision timeline, newest first: each decision's explanation (the rule,
    the numbers, the policy revision) and what the actuator did with it (plan, outcome, where
    the pod went, the detail or error it reported), from the decisions and actuations streams.

    -o text (default: the timeline as prose), table or wide (a row per decision and its last
    action), json or yaml (the whole timeline), csv (a row per decision). The workload is
    NAMESPACE/WORKLOAD, or WORKLOAD with -n NAMESPACE.
    """
    opts = options.given()
    fmt = _format("explain", opts, "text", EXPLAIN_FORMATS)
    if opts.all_namespaces:
        _fail("explain", "-A: explain names one workload (NAMESPACE/WORKLOAD)", EXIT_USAGE)
    namespace, _, name = workload.rpartition("/")
    namespace = namespace or opts.namespace or ""
    if not namespace or not name or "/" in namespace:
        _fail("explain", f"{workload!r}: expected NAMESPACE/WORKLOAD (or -n NAMESPACE)", EXIT_USAGE)
    with cli_settings("explain", opts) as settings:
        try:
            timeline = asyncio.run(timeline_of(settings, namespace, name))
        except NatsUnavailableError as exc:
            _fail("explain", str(exc))
        url = settings.nats.url
    if not timeline.entries and timeline.status is None:
        _fail("explain", f"nothing recorded about {namespace}/{name} at {url}")
    if fmt != "text":
        output.emit(render.timeline_listing(timeline), fmt)
        return
    lines = render.timeline_lines(timeline)
    if not timeline.entries:
        lines.append("No decisions recorded (the engine has not asked for a change).")
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")


# --- report ----------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``45m``, ``24h``, ``7d``, ``1w`` or combinations such as ``1h30m``."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"{text!r} is not a duration such as 90s, 45m, 24h, 7d or 1h30m")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return timedelta(seconds=seconds)


@options.takes(options.READER)
def report_command(
    since: Annotated[
        str, typer.Option(help="the window: messages stored this long ago or later (24h, 90m)")
    ] = "24h",
    out: Annotated[
        Path, typer.Option("--out", help="directory for report.html and report.json")
    ] = Path("fracpilot-report"),
    charts: Annotated[
        int, typer.Option(min=0, help="workloads charted (overruns first, then GPU-hours)")
    ] = 24,
    mig: Annotated[
        bool,
        typer.Option(
            "--mig",
            help="add MIG profile recommendations even when the GPUs are not MIG cards "
            "modelled here (A100, A30, H100, H200, B200; added for those without it; "
            "docs/mig.md)",
        ),
    ] = False,
) -> None:
    """Write a self-contained HTML report (one file, charts embedded) and its numbers as JSON:
    per workload, usage against the fraction held over time with the changes marked; for the
    fleet, GPU-hours and money saved against whole GPUs, overruns, decisions and actions by
    plan.

    Without -o the two files' paths are printed; with -o table, wide, csv (a row per workload),
    json or yaml (the report.json document) the numbers are printed too, and the paths go to
    stderr. -n: one namespace's workloads.
    """
    opts = options.given()
    fmt = _format("report", opts, "", ("", *output.FORMATS))
    namespace = _namespaces("report", opts)
    try:
        window = parse_duration(since)
    except ValueError as exc:
        _fail("report", f"--since: {exc}", EXIT_USAGE)
    with cli_settings("report", opts) as settings:
        _report(settings, window, out, namespace, charts, since, fmt, mig)


def _report(
    settings: CliSettings,
    window: timedelta,
    out: Path,
    namespace: str | None,
    charts: int,
    since: str,
    fmt: str,
    mig: bool = False,
) -> None:
    until = datetime.now(UTC)
    start = until - window

    async def read() -> Window:
        nc = await connect(settings)
        try:
            return await read_window(nc, start, namespace)
        finally:
            await nc.close()

    try:
        with bulk():
            data = asyncio.run(read())
    except NatsUnavailableError as exc:
        _fail("report", str(exc))
    from fracpilot_cli.report_html import render_report  # matplotlib only here

    _warn_problems("report", data.problems)
    report = build_report(
        data.samples,
        data.decisions,
        data.results,
        settings.prices,
        since=start,
        until=until,
        generated_at=datetime.now(UTC),
        consolidation_reports=data.consolidation_reports,
        consolidation_moves=data.consolidation_moves,
    )
    document, page = render_report(report, charts)
    document, page = with_report_section(document, page, data.samples, settings.policy_json, mig)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(output.to_json(document) + "\n")
        (out / "report.html").write_text(page)
    except OSError as exc:
        _fail("report", f"cannot write to {out}: {exc.strerror or exc}")
    err = Console(stderr=True, highlight=False)
    if not report.workloads:
        err.print(f"nothing stored in the last {since} at {settings.nats.url}: an empty report")
    err.print(render.report_summary(report, document), markup=False)
    if (line := render.report_consolidation(document)) is not None:
        err.print(line, markup=False)
    if fmt:
        output.emit(render.report_listing(report, document), fmt)
        err.print(f"{out / 'report.html'}\n{out / 'report.json'}", markup=False)
        return
    typer.echo(str(out / "report.html"))
    typer.echo(str(out / "report.json"))
