"""``fracpilot status``: one row per workload from NATS, once or ``--watch``.

Glue only: the NATS reads (:mod:`fracpilot_cli.operator_data`), the pure core
(:mod:`fracpilot_cli.status`), its data for the output layer (:mod:`fracpilot_cli.render`,
:mod:`fracpilot_cli.output`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from fracpilot_cli import options, output, render
from fracpilot_cli.bulk import bulk
from fracpilot_cli.command_failures import (
    chosen_format,
    chosen_namespaces,
    fail,
    warn_problems,
)
from fracpilot_cli.connection import cli_settings
from fracpilot_cli.operator_data import NatsUnavailableError, connect, read_fleet
from fracpilot_cli.settings import CliSettings
from fracpilot_cli.status import (
    RISK_HELP,
    ConsolidationStatus,
    StatusRow,
    build_status_rows,
    consolidation_status,
)
from fracpilot_libs.pricing import GpuPrices


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
    warn_problems("status", problems)
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
    fmt = chosen_format("status", opts, "table", output.FORMATS)
    namespace = chosen_namespaces("status", opts)
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
        fail("status", str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(code=0) from None
    warn_problems("status", problems)
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
