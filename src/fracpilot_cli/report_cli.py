"""``fracpilot report``: a self-contained HTML report and its numbers as JSON, from NATS.

Glue only: the NATS reads (:mod:`fracpilot_cli.operator_data`), the pure core
(:mod:`fracpilot_cli.report`), the HTML report (:mod:`fracpilot_cli.report_html`) and the MIG
section (:mod:`fracpilot_cli.mig_view`), a summary for the output layer
(:mod:`fracpilot_cli.render`, :mod:`fracpilot_cli.output`).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fracpilot_cli import options, output, render
from fracpilot_cli.bulk import bulk
from fracpilot_cli.command_failures import (
    chosen_format,
    chosen_namespaces,
    fail,
    warn_problems,
)
from fracpilot_cli.connection import EXIT_USAGE, cli_settings
from fracpilot_cli.mig_view import with_report_section
from fracpilot_cli.operator_data import NatsUnavailableError, Window, connect, read_window
from fracpilot_cli.report import build_report
from fracpilot_cli.settings import CliSettings

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
    fmt = chosen_format("report", opts, "", ("", *output.FORMATS))
    namespace = chosen_namespaces("report", opts)
    try:
        window = parse_duration(since)
    except ValueError as exc:
        fail("report", f"--since: {exc}", EXIT_USAGE)
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
        fail("report", str(exc))
    from fracpilot_cli.report_html import render_report  # matplotlib only here

    warn_problems("report", data.problems)
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
        fail("report", f"cannot write to {out}: {exc.strerror or exc}")
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
