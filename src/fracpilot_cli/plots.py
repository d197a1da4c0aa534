"""Pictures of a replay: usage against the allocation in force, one panel per workload.

Drawn with matplotlib's Agg canvas and no pyplot, so no display and no global figure state.
The report must come from ``replay(..., keep_timeline=True)``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from fracpilot_libs.analysis.accounting import WorkloadAccount
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.analysis.replay import ReplayReport

COMPUTE = "#4c72b0"
MEMORY = "#2ca02c"
ALLOCATION = "#d62728"
BASELINE = "#7f7f7f"
OVERRUN = "#000000"
CARD_COLOURS = (ALLOCATION, BASELINE, "#9467bd", "#8c564b")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _changes(timeline: list[tuple[float, float, float, float]]) -> list[tuple[float, float, bool]]:
    """(time, new fraction, upsize?) wherever the allocation in force changed."""
    out = []
    for prev, cur in pairwise(timeline):
        if not math.isclose(prev[3], cur[3]):
            out.append((cur[0], cur[3], cur[3] > prev[3]))
    return out


def _panel(
    ax: Axes,
    w: WorkloadAccount,
    start: float,
    baseline: WorkloadAccount | None,
    baseline_name: str,
) -> None:
    tl = w.timeline
    hours = [(t - start) / 3600 for t, *_ in tl]
    compute = [c for _, c, _, _ in tl]
    ax.fill_between(hours, compute, step="post", color=COMPUTE, alpha=0.35, lw=0)
    ax.step(hours, compute, where="post", color=COMPUTE, lw=0.4, alpha=0.7)
    ax.plot(hours, [m for _, _, m, _ in tl], color=MEMORY, lw=1.4)
    if baseline is not None and baseline.timeline:
        b_hours = [(t - start) / 3600 for t, *_ in baseline.timeline]
        ax.step(
            b_hours,
            [a for *_, a in baseline.timeline],
            where="post",
            color=BASELINE,
            lw=1.4,
            ls="--",
        )
    ax.step(hours, [a for *_, a in tl], where="post", color=ALLOCATION, lw=1.8)
    changes = _changes(tl)
    for marker, up in (("^", True), ("v", False)):
        pts = [(t, f) for t, f, is_up in changes if is_up is up]
        if pts:
            ax.plot(
                [(t - start) / 3600 for t, _ in pts],
                [f for _, f in pts],
                ls="none",
                marker=marker,
                ms=7,
                color=ALLOCATION,
                markeredgecolor="white",
                markeredgewidth=0.6,
            )
    over = [(h, max(c, m)) for h, (_, c, m, a) in zip(hours, tl, strict=True) if max(c, m) > a]
    if over:
        ax.plot(
            [h for h, _ in over], [v for _, v in over], ls="none", marker="x", ms=5, color=OVERRUN
        )

    m = w.metrics
    base = ""
    if baseline is not None:
        base = f"; {baseline_name} {baseline.metrics.fraction_hours:.1f} GPU-h"
    ax.set_title(
        f"{w.workload.display}\n{m.fraction_hours:.1f} of {m.whole_gpu_hours:.1f} GPU-h "
        f"(saves {m.savings_pct:.0f}%), {_count(m.resizes, 'resize')}, "
        f"{_count(m.memory_overrun_samples, 'memory overrun')}{base}",
        fontsize=9,
        loc="left",
    )
    ax.set_ylim(0, 1.05)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.grid(True, alpha=0.3, lw=0.5)
    ax.tick_params(labelsize=8)


def _cards_panel(ax: Axes, cards: list[tuple[str, PackedAccount]], start: float) -> None:
    """Cards in use over time, one step line per sizer, with the whole-GPU count's peak."""
    end = start
    for i, (name, account) in enumerate(cards):
        line = account.cards_in_use
        if not line:
            continue
        end = max(end, line[-1][0])
        ax.step(
            [(t - start) / 3600 for t, _ in line],
            [n for _, n in line],
            where="post",
            color=CARD_COLOURS[i % len(CARD_COLOURS)],
            lw=1.8 if i == 0 else 1.4,
            ls="-" if i == 0 else "--",
            label=f"{name}: {account.card_hours:,.0f} card-h, "
            f"saves {account.card_hours_saved_pct:.0f}%, "
            f"contention {account.contention_pct:.2f}%, "
            f"{account.memory_collision_samples} memory collisions",
        )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("GPUs in use", fontsize=9)
    ax.set_title("GPUs in use, packed with the actuator's planner", fontsize=9, loc="left")
    ax.grid(True, alpha=0.3, lw=0.5)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="lower left")


def plot_replay(
    report: ReplayReport,
    path: Path | BinaryIO,
    top: int = 6,
    baseline: ReplayReport | None = None,
    baseline_name: str = "baseline",
    title: str = "",
    heading: str = "",
    cards: list[tuple[str, PackedAccount]] | None = None,
) -> Path | BinaryIO:
    """Write a PNG of the top workloads by GPU-hours: compute and memory share of one GPU, the
    allocation in force as a step line with its changes marked, overruns as crosses, and the
    baseline's allocation dashed when a baseline report is given. ``heading`` replaces the
    figure's title (a replay's by default); ``path`` may be a binary file. With ``cards``
    (packed replays, by sizer name) a panel above shows the GPUs in use over time."""
    chosen = report.top(top)
    if not chosen or not any(w.timeline for w in chosen):
        raise ValueError("the report has no timeline: replay with keep_timeline=True")
    by_key = {b.workload.key: b for b in baseline.workloads} if baseline is not None else {}
    start = min(w.timeline[0][0] for w in chosen if w.timeline)

    ncols = 1 if len(chosen) <= 2 else 2
    nrows = math.ceil(len(chosen) / ncols)
    extra = 2.6 if cards else 0.0
    fig = Figure(figsize=(7.5 * ncols, 2.7 * nrows + 1.2 + extra), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    panels: Figure | SubFigure = fig
    if cards:
        subs = fig.subfigures(2, 1, squeeze=False, height_ratios=[extra, 2.7 * nrows + 1.2])
        top_fig, panels = subs[0][0], subs[1][0]
        _cards_panel(top_fig.subplots(), cards, start)
    axes = panels.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    for i, w in enumerate(chosen):
        ax = axes[i // ncols][i % ncols]
        _panel(ax, w, start, by_key.get(w.workload.key), baseline_name)
    since = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M UTC")
    for col in range(ncols):
        # The lowest panel in use of each column carries the time axis.
        last = max(i for i in range(len(chosen)) if i % ncols == col)
        for row in range(last // ncols + 1, nrows):
            axes[row][col].set_visible(False)
        bottom = axes[last // ncols][col]
        bottom.tick_params(labelbottom=True)
        bottom.set_xlabel(f"hours since {since}", fontsize=9)
    for row in axes:
        row[0].set_ylabel("share of one GPU", fontsize=9)

    handles: list[Artist] = [
        Patch(facecolor=COMPUTE, alpha=0.5, label="compute used"),
        Line2D([], [], color=MEMORY, lw=1.4, label="memory used"),
        Line2D([], [], color=ALLOCATION, lw=1.8, label="fraction allocated"),
        Line2D([], [], color=ALLOCATION, ls="none", marker="^", label="upsize"),
        Line2D([], [], color=ALLOCATION, ls="none", marker="v", label="downsize"),
        Line2D([], [], color=OVERRUN, ls="none", marker="x", label="usage above the fraction"),
    ]
    if baseline is not None:
        handles.append(
            Line2D([], [], color=BASELINE, lw=1.4, ls="--", label=f"{baseline_name} fraction")
        )
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 4 * ncols), fontsize=9
    )
    fig.suptitle(
        heading
        or f"fracpilot replay{f' of {title}' if title else ''}: usage against allocation, "
        f"top {len(chosen)} of {len(report.workloads)} workloads by GPU-hours",
        fontsize=11,
    )
    fig.savefig(path, format="png")
    return path
