"""``fracpilot replay``: what a policy would have done on a recorded usage trace.

CLI glue only: the trace is read by :mod:`fracpilot_libs.analysis.trace`, replayed and measured
by :mod:`fracpilot_libs.analysis.replay` with the sizers of
:mod:`fracpilot_libs.analysis.baselines`; this module parses the options, shows
progress on stderr and prints the totals as a table or as one JSON object. With ``--pack``
(:mod:`fracpilot_cli.packed`) the same sizers are also replayed packed on GPUs.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from fracpilot_cli import options, output, render
from fracpilot_cli.mig_view import print_mig, trace_mig, with_mig
from fracpilot_cli.packed import pack_bound_table, print_packed, run_pack_bound, run_packed
from fracpilot_cli.settings import CliSettings
from fracpilot_libs.analysis.accounting import Metrics, WorkloadAccount
from fracpilot_libs.analysis.baselines import EngineSizer, Sizer, baseline_from_spec
from fracpilot_libs.analysis.packing_replay import PackedReport
from fracpilot_libs.analysis.replay import Progress as ReplayProgress
from fracpilot_libs.analysis.replay import ReplayReport, replay
from fracpilot_libs.analysis.trace import TraceError, TracePoint, group_by_workload, read_trace
from fracpilot_libs.contracts import Policy
from fracpilot_libs.placement.card_budget import Isolation
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.isolation_policies import sizing_policy

EXIT_USAGE = 2
LONG_TRACE = 20_000  # samples: from here on progress is shown even when stderr is no terminal
_READ_CHUNK = 2_000  # rows per progress update while reading


def _fail(message: str) -> NoReturn:
    typer.echo(f"fracpilot replay: error: {message}", err=True)
    raise typer.Exit(code=EXIT_USAGE)


def load_policy(path: Path) -> Policy:
    """A Policy from a JSON file; exits with a readable message when it is not one."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read policy {path}: {exc.strerror or exc}")
    try:
        return Policy.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'policy'}: {err['msg']}"
            for err in exc.errors()
        )
        _fail(f"invalid policy {path}: {problems}")


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )


def _counted(
    points: Iterable[TracePoint], progress: Progress, task: TaskID
) -> Iterator[TracePoint]:
    n = 0
    for n, point in enumerate(points, start=1):
        if n % _READ_CHUNK == 0:
            progress.update(task, completed=n)
        yield point
    progress.update(task, completed=n, total=n)


def read_groups(trace: Path, err: Console, gpu_model: str = "") -> dict[str, list[TracePoint]]:
    """The trace grouped by workload; exits with a readable message when it cannot be read."""
    if not trace.is_file():
        _fail(f"trace not found: {trace}")
    try:
        with _progress(err, err.is_terminal) as progress:
            task = progress.add_task("reading trace", total=None)
            points = read_trace(trace, gpu_model=gpu_model)
            groups = group_by_workload(_counted(points, progress, task))
    except TraceError as exc:
        _fail(str(exc))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        _fail(f"cannot read trace {trace}: {exc}")
    if not groups:
        _fail(f"trace {trace} holds no samples")
    return groups


def run_replays(
    groups: dict[str, list[TracePoint]],
    sizers: list[Sizer],
    err: Console,
    keep_timeline: bool,
    prices: GpuPrices | None = None,
) -> list[ReplayReport]:
    """Each sizer replayed on the same parsed trace, with one progress bar per sizer."""
    samples = sum(len(series) for series in groups.values())
    show = err.is_terminal or samples >= LONG_TRACE
    reports = []
    with _progress(err, show) as progress:
        for sizer in sizers:
            task = progress.add_task(f"replay {sizer.name}", total=samples)
            reports.append(
                replay(
                    groups,
                    _factory(sizer),
                    progress=_advancer(progress, task),
                    keep_timeline=keep_timeline,
                    prices=prices,
                )
            )
    return reports


def _factory(sizer: Sizer) -> Callable[[], Sizer]:
    # Sizers keep no per-workload state of their own (start() makes it): one serves all.
    return lambda: sizer


def _advancer(progress: Progress, task: TaskID) -> ReplayProgress:
    def advance(advance: int) -> None:
        progress.advance(task, advance)

    return advance


def report_json(
    report: ReplayReport,
    baseline: ReplayReport | None,
    packed: list[PackedReport] | None = None,
) -> dict[str, Any]:
    """Today's keys; with ``packed`` (fracpilot's, then the baseline's) a ``packed`` object in
    ``totals`` and in ``baseline``."""
    out = {**report.as_dict(), "baseline": baseline.totals.as_dict() if baseline else None}
    if packed:
        out["totals"]["packed"] = packed[0].packed.as_dict()
        if out["baseline"] is not None and len(packed) > 1:
            out["baseline"]["packed"] = packed[1].packed.as_dict()
    return out


def _total_rows(m: Metrics) -> list[tuple[str, str]]:
    return [
        ("samples", f"{m.samples:,}"),
        ("workloads", f"{m.workloads:,}"),
        ("GPU-hours allocated", f"{m.fraction_hours:,.1f}"),
        ("GPU-hours as whole GPUs", f"{m.whole_gpu_hours:,.1f}"),
        ("savings", f"{m.savings_pct:.1f}%"),
        ("money saved", f"${m.cost_saved_usd:,.0f} of ${m.whole_cost_usd:,.0f}"),
        ("compute overruns", f"{m.compute_overrun_pct:.3f}% of samples"),
        ("memory overruns", f"{m.memory_overrun_samples:,} ({m.memory_overrun_pct:.3f}%)"),
        ("resizes", f"{m.resizes:,}"),
        ("resizes per workload-day", f"{m.resizes_per_workload_day:.2f}"),
        ("longest overrun", f"{m.longest_overrun_s:,.0f} s"),
    ]


def totals_table(
    trace: Path, report: ReplayReport, name: str, baseline: ReplayReport | None, base_name: str
) -> Table:
    table = Table(title=f"replay of {trace.name}")
    table.add_column("")
    table.add_column(name, justify="right")
    if baseline is not None:
        table.add_column(f"baseline {base_name}", justify="right")
    rows = _total_rows(report.totals)
    base_rows = _total_rows(baseline.totals) if baseline is not None else None
    for i, (label, value) in enumerate(rows):
        table.add_row(label, value, *([base_rows[i][1]] if base_rows else []))
    return table


def workloads_table(top: list[WorkloadAccount], of: int) -> Table:
    table = Table(
        title=f"top {len(top)} of {of} workloads by GPU-hours allocated",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    longest = max((len(w.workload.display) for w in top), default=8)
    table.add_column("workload", no_wrap=True, min_width=min(longest, 40))
    for col in (
        "GPU-h",
        "whole\nGPU-h",
        "saved",
        "saved\nUSD",
        "compute\nover",
        "memory\nover",
        "resizes",
        "final",
    ):
        width = max(len(line) for line in col.splitlines())
        table.add_column(col, justify="right", no_wrap=True, min_width=width)
    for w in top:
        m = w.metrics
        table.add_row(
            w.workload.display,
            f"{m.fraction_hours:.1f}",
            f"{m.whole_gpu_hours:.1f}",
            f"{m.savings_pct:.1f}%",
            f"{m.cost_saved_usd:,.0f}",
            f"{m.compute_overrun_pct:.2f}%",
            str(m.memory_overrun_samples),
            str(m.resizes),
            f"{w.final_fraction:g}",
        )
    return table


@options.takes(options.OUTPUT)
def replay_command(
    trace: Annotated[
        Path, typer.Argument(help="usage trace, CSV or CSV.gz (see the README for columns)")
    ],
    policy_file: Annotated[
        Path | None,
        typer.Option("--policy", help="a Policy as JSON; the default policy if omitted"),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            metavar="whole|vpa|static:F",
            help="also replay a baseline on the same trace: whole GPUs, a VPA-style "
            "recommender on the policy's grid, or a static fraction F (0 < F <= 1)",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(metavar="PNG", help="draw usage against allocation for the top workloads"),
    ] = None,
    top: Annotated[
        int, typer.Option(min=1, help="how many workloads to list and plot, by GPU-hours")
    ] = 6,
    gpu_model: Annotated[
        str,
        typer.Option(
            help="GPU model that prices rows without a gpu_model column "
            "(prices: FRACPILOT_GPU_PRICES / FRACPILOT_GPU_DEFAULT_PRICE)"
        ),
    ] = "",
    pack: Annotated[
        bool,
        typer.Option(
            "--pack",
            help="also pack the workloads on GPUs with the actuator's planner and report "
            "card-hours, compute contention, memory collisions and moves",
        ),
    ] = False,
    gpus: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="with --pack (implied): pin the number of GPUs and report what does not fit",
        ),
    ] = None,
    gpus_per_node: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="N",
            help="with --pack: cards come in nodes of N (the trace has no nodes); reports "
            "node-hours and how many of the card-hours freed were whole nodes",
        ),
    ] = 1,
    consolidate: Annotated[
        bool,
        typer.Option(
            help="with --pack: move a workload left alone on its GPU (by its resize, or by a "
            "neighbour that moved or left) onto a GPU in use that holds it",
        ),
    ] = True,
    pack_bound: Annotated[
        bool,
        typer.Option(
            "--pack-bound",
            help="also repack from scratch at every instant (free moves) with hard per-pod "
            "memory: the memory in use (also in hindsight, changed <= 4 times a day), peaks "
            "plus headroom, and the policy's fractions (table and JSON; docs/sizing.md)",
        ),
    ] = False,
    isolation: Annotated[
        Isolation | None,
        typer.Option(
            help="with --pack: how the GPUs hold a pod to its memory. shared (KAI without a "
            "memory cap): a card's tenants sized together with one pooled headroom; enforced "
            "(HAMi, HAMi-core): per-pod headroom. Unset: as detected, today's per-pod sizing "
            "(docs/sizing.md)",
        ),
    ] = None,
    mig: Annotated[
        bool,
        typer.Option(
            "--mig",
            help="also recommend a MIG profile per workload and the GPUs that hold them "
            "(docs/mig.md)",
        ),
    ] = False,
    mig_gpu: Annotated[
        str,
        typer.Option(
            metavar="CARD",
            help="with --mig: the MIG card, a key as docs/mig.md lists them (h200-141gb, "
            "b200-180gb, ...; default: the trace's GPU model, else A100 80GB)",
        ),
    ] = "",
    mig_config: Annotated[
        Path | None,
        typer.Option(metavar="YAML", help="with --mig (implied): write the mig-parted config"),
    ] = None,
) -> None:
    """Replay a usage trace through the decision engine and measure savings and overruns.

    -o table (default: the totals, against the baseline if any, and the top workloads), wide
    (every workload, more columns), json (one object; --json is the same), yaml, csv (a row
    per workload of that object).
    """
    try:
        fmt = output.choose(options.given().format(), "table")
    except (output.FormatError, options.OptionsError) as exc:
        _fail(str(exc))
    err = Console(stderr=True)
    policy = load_policy(policy_file) if policy_file is not None else Policy()
    try:
        base_sizer = baseline_from_spec(baseline, policy) if baseline is not None else None
    except ValueError as exc:
        _fail(f"--baseline: {exc}")
    if plot is not None and not plot.parent.is_dir():
        _fail(f"--plot: no such directory: {plot.parent}")

    try:
        prices = CliSettings().prices
    except ValidationError as exc:
        _fail(f"invalid price settings: {exc.errors(include_url=False)[0]['msg']}")
    groups = read_groups(trace, err, gpu_model)
    sizers: list[Sizer] = [EngineSizer(sizing_policy(policy))]  # as the decision service does
    if base_sizer is not None:
        sizers.append(base_sizer)
    packed = None
    if gpus is not None and gpus % gpus_per_node:
        _fail(f"--gpus {gpus} is not a whole number of nodes of --gpus-per-node {gpus_per_node}")
    if pack or gpus is not None:
        samples = sum(len(series) for series in groups.values())
        with _progress(err, err.is_terminal or samples >= LONG_TRACE) as progress:
            packed = run_packed(
                groups,
                sizers,
                progress,
                gpus,
                consolidate,
                prices,
                isolation=isolation,
                gpus_per_node=gpus_per_node,
            )
    if packed is not None and gpus is None and plot is None:
        # Unpinned, packing changes no fraction: its per-workload accounts are the unpacked
        # replay's (tested), and replaying the sizers twice would double the time.
        reports = [p.replay for p in packed]
    else:
        reports = run_replays(groups, sizers, err, keep_timeline=plot is not None, prices=prices)
    report = reports[0]
    base_report = reports[1] if len(reports) > 1 else None
    mig_plan = None
    if mig or mig_gpu or mig_config is not None:
        mig_plan = trace_mig(groups, policy, mig_gpu, gpu_model, mig_config, err)

    if plot is not None:
        from fracpilot_cli.plots import plot_replay  # matplotlib only when asked for

        try:
            plot_replay(
                report,
                plot,
                top=top,
                baseline=base_report,
                baseline_name=base_sizer.name if base_sizer is not None else "baseline",
                title=trace.name,
                cards=[(s.name, p.packed) for s, p in zip(sizers, packed, strict=True)]
                if packed
                else None,
            )
        except OSError as exc:
            _fail(f"--plot: cannot write {plot}: {exc.strerror or exc}")
        err.print(f"plot written to {plot}", markup=False, highlight=False)

    bound = run_pack_bound(groups, sizers[0]) if pack_bound and fmt in ("json", "table") else None
    if fmt == "json":  # one line, as --json always printed
        doc = report_json(report, base_report, packed)
        if bound is not None:
            doc["totals"]["pack_bound"] = bound.as_dict()
        typer.echo(json.dumps(with_mig(doc, mig_plan)))
        return
    if fmt != "table":
        output.emit(render.replay_listing(report_json(report, base_report, packed)), fmt)
        return
    out = Console()
    base_name = base_sizer.name if base_sizer is not None else ""
    out.print(totals_table(trace, report, sizers[0].name, base_report, base_name))
    if packed:
        print_packed(out, [s.name for s in sizers], packed, top)
    if bound is not None:
        out.print(pack_bound_table(sizers[0].name, bound))
    out.print(workloads_table(report.top(top), len(report.workloads)))
    if mig_plan is not None:
        print_mig(out, mig_plan, str(mig_config) if mig_config is not None else None)
