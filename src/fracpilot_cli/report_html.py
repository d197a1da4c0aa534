"""``fracpilot report``'s HTML: one self-contained file, charts embedded as PNG data URIs.

Every number in the page is taken from the report's JSON document (``report.json``, written
beside it) and printed as it is there; the charts are drawn from the same report: the fleet's
GPUs held over time against whole GPUs and its actions by plan (here), and per workload usage
against the fraction in force with its changes marked (:func:`fracpilot_cli.plots.plot_replay`,
as ``fracpilot replay --plot`` draws it). Matplotlib's Agg canvas, no pyplot, no display.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fracpilot_cli.plots import ALLOCATION, BASELINE, COMPUTE, plot_replay
from fracpilot_cli.report import Report, WorkloadReport
from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.replay import ReplayReport

FLEET_BINS = 96


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def workload_chart(w: WorkloadReport) -> bytes:
    """Usage against the fraction in force, fraction changes marked (a PNG)."""
    buf = io.BytesIO()
    plot_replay(
        ReplayReport(w.metrics, [w.replay]),
        buf,
        top=1,
        heading=f"{w.workload.display}: usage against the fraction held",
    )
    return buf.getvalue()


def fleet_series(
    report: Report, bins: int = FLEET_BINS
) -> tuple[list[float], list[float], list[float]]:
    """(hours since the first sample, GPUs held, GPUs as whole) at ``bins + 1`` instants: each
    workload counts with the fraction in force then, while a sample stands for that instant
    (until the next sample, gaps capped as in the GPU-hours)."""
    timelines = [w.replay.timeline for w in report.workloads if w.replay.timeline]
    if not timelines:
        return [], [], []
    start = min(t[0][0] for t in timelines)
    end = max(t[-1][0] for t in timelines)
    width = max((end - start) / bins, 1.0)
    instants = [start + i * width for i in range(bins + 1)]
    held = [0.0] * len(instants)
    whole = [0.0] * len(instants)
    for timeline in timelines:
        intervals = sample_intervals([p[0] for p in timeline])
        j = 0
        for i, at in enumerate(instants):
            while j + 1 < len(timeline) and timeline[j + 1][0] <= at:
                j += 1
            begins = timeline[j][0]
            if begins <= at < begins + intervals[j] or (at == end and begins == end):
                held[i] += timeline[j][3]
                whole[i] += 1.0
    return [(at - start) / 3600 for at in instants], held, whole


def fleet_chart(report: Report) -> bytes:
    """GPUs held over time against whole GPUs, and the actions by plan and outcome (a PNG)."""
    fig = Figure(figsize=(11, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=(2.2, 1))
    hours, held, whole = fleet_series(report)
    if hours:
        left.step(hours, whole, where="post", color=BASELINE, lw=1.4, ls="--", label="whole GPUs")
        left.fill_between(hours, held, step="post", color=ALLOCATION, alpha=0.25, lw=0)
        left.step(hours, held, where="post", color=ALLOCATION, lw=1.8, label="GPUs held")
        since = datetime.fromtimestamp(
            min(w.replay.timeline[0][0] for w in report.workloads if w.replay.timeline), UTC
        ).strftime("%Y-%m-%d %H:%M UTC")
        left.set_xlabel(f"hours since {since} (samples' clock)", fontsize=9)
        left.legend(fontsize=8, loc="upper right")
    else:
        left.text(0.5, 0.5, "no usage samples in the window", ha="center", va="center")
    left.set_ylim(bottom=0)
    left.set_ylabel("GPUs", fontsize=9)
    left.set_title("fleet: GPUs held against whole GPUs", fontsize=10, loc="left")
    left.grid(True, alpha=0.3, lw=0.5)
    left.tick_params(labelsize=8)

    counts = report.actions_by_plan_outcome
    if counts:
        labels = list(counts)
        right.barh(labels, [counts[k] for k in labels], color=COMPUTE)
        right.invert_yaxis()
        right.tick_params(labelsize=8)
    else:
        right.text(0.5, 0.5, "no actions in the window", ha="center", va="center")
        right.set_yticks([])
    right.set_title("actions by plan / outcome", fontsize=10, loc="left")
    right.grid(True, axis="x", alpha=0.3, lw=0.5)
    return png_bytes(fig)


# --- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1d1d1f; background: #fff; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; }
h3 { font-size: 15px; margin: 24px 0 6px; }
.muted { color: #666; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e3e3e3; text-align: right; }
th { background: #f5f5f7; font-weight: 600; }
td.l, th.l { text-align: left; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.card { border: 1px solid #e3e3e3; border-radius: 6px; padding: 8px 14px; min-width: 150px; }
.card b { display: block; font-size: 20px; }
tr.over td { background: #fff0f0; }
"""


def num(value: Any) -> str:
    """A number as the JSON holds it, with thousands separators; text escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text or "inf" in text or "nan" in text:
            return text
        whole, _, decimals = text.partition(".")
        return f"{int(whole):,}.{decimals}" if decimals else f"{int(whole):,}"
    return html.escape(str(value))


def usd(value: Any) -> str:
    return "-" if value is None else f"${num(value)}"


def html_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, text_last: bool = False
) -> str:
    """Numbers right-aligned; the first ``left`` columns (and the last with ``text_last``) are
    text, left-aligned."""
    last = len(header) - 1

    def cell(tag: str, i: int, text: str) -> str:
        cls = ' class="l"' if i < left or (text_last and i == last) else ""
        return f"<{tag}{cls}>{text}</{tag}>"

    head = "".join(cell("th", i, html.escape(h)) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def img_tag(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _fleet(f: Mapping[str, Any]) -> str:
    c = f["cards"]
    cards = [
        ("GPUs in use", f"{num(c['gpus_in_use'])} of {num(c['gpus_whole'])}"),
        ("cards freed", num(c["cards_freed"])),
        ("card-hours saved", f"{num(c['card_hours_saved'])} ({num(c['card_hours_saved_pct'])}%)"),
        ("GPU-hours held", num(f["fraction_hours"])),
        ("GPU-hours as whole GPUs", num(f["whole_gpu_hours"])),
        ("GPU-hours saved", num(f["saved_gpu_hours"])),
        ("savings", f"{num(f['savings_pct'])}%"),
        ("money saved", usd(f["cost_saved_usd"])),
        ("cost as whole GPUs", usd(f["whole_cost_usd"])),
    ]
    out = ['<div class="cards">']
    out += [f'<div class="card"><b>{v}</b>{html.escape(k)}</div>' for k, v in cards]
    out.append("</div>")
    rows = [
        ["workloads", num(f["workloads"])],
        ["samples", num(f["samples"])],
        ["compute overruns (samples)", num(f["compute_overrun_samples"])],
        ["compute overruns (% of samples)", f"{num(f['compute_overrun_pct'])}%"],
        ["memory overruns (samples)", num(f["memory_overrun_samples"])],
        ["memory overruns (% of samples)", f"{num(f['memory_overrun_pct'])}%"],
        ["longest overrun (s)", num(f["longest_overrun_s"])],
        ["fraction changes", num(f["resizes"])],
        ["decisions", num(f["decisions"])],
        *([f"decisions {k}", num(v)] for k, v in f["decisions_by_direction"].items()),
        ["actions", num(f["actions"])],
        ["card-hours (a pod on the card)", num(c["card_hours"])],
        ["card-hours as whole GPUs (one per pod)", num(c["whole_card_hours"])],
        ["cards in use at the peak", num(c["peak_cards"])],
    ]
    out.append(html_table(["fleet", ""], rows))
    plan_rows = [[html.escape(k), num(v)] for k, v in f["actions_by_plan_outcome"].items()]
    out.append(html_table(["actions by plan / outcome", "count"], plan_rows))
    return "".join(out)


def _consolidation(c: Mapping[str, Any] | None) -> list[str]:
    """The section, when the window holds consolidation's reports or moves."""
    if not c:
        return []
    rows = [
        ["GPUs freed (on the nodes freed)", num(c["freed_gpus"])],
        ["nodes freed", num(c["freed_nodes"])],
        ["moves started", num(c["started"])],
        ["moves verified", num(c["verified"])],
        ["moves failed", num(c["failed"])],
        ["nodes given up", num(c["abandoned"])],
        ["last plan: would free GPUs", num(c["would_free_gpus"])],
        ["last plan: would free nodes", num(c["would_free_nodes"])],
        ["last plan: moves", num(c["would_move"])],
        ["mode", html.escape(", ".join(c["modes"]) or "-")],
    ]
    freed = ", ".join(c["freed_node_names"]) or "none"
    return [
        "<h2>Consolidation</h2>",
        f'<p class="muted">Nodes freed of GPU pods for the autoscaler: {html.escape(freed)}.</p>',
        html_table(["consolidation", ""], rows),
    ]


_WORKLOAD_COLUMNS = (
    "workload",
    "GPU model",
    "samples",
    "GPU-h held",
    "GPU-h whole",
    "saved %",
    "saved USD",
    "compute over",
    "memory over",
    "changes",
    "decisions",
    "actions",
    "final fraction",
)


def _workload_row(w: Mapping[str, Any]) -> list[str]:
    return [
        html.escape(f"{w['namespace']}/{w['workload']}"),
        html.escape(w["gpu_model"] or "-"),
        num(w["samples"]),
        num(w["fraction_hours"]),
        num(w["whole_gpu_hours"]),
        num(w["savings_pct"]),
        usd(w["cost_saved_usd"]),
        num(w["compute_overrun_samples"]),
        num(w["memory_overrun_samples"]),
        num(w["resizes"]),
        num(w["decisions"]),
        num(len(w["actions"])),
        num(w["final_fraction"]),
    ]


def _workload_section(w: Mapping[str, Any], chart: bytes | None) -> str:
    name = f"{w['namespace']}/{w['workload']}"
    out = [f'<h3 id="{html.escape(name)}">{html.escape(name)}</h3>']
    out.append(
        f'<p class="muted">{num(w["samples"])} samples from {num(w["first_sample_at"])} to '
        f"{num(w['last_sample_at'])}; {num(w['fraction_hours'])} of "
        f"{num(w['whole_gpu_hours'])} GPU-hours held ({num(w['savings_pct'])}% saved, "
        f"{usd(w['cost_saved_usd'])} at {usd(w['usd_per_gpu_hour'])} per GPU-hour)</p>"
    )
    if chart is not None:
        out.append(img_tag(chart, f"usage against allocation of {name}"))
    if w["fraction_changes"]:
        rows = [[num(c["at"]), num(c["from"]), num(c["to"])] for c in w["fraction_changes"]]
        out.append(html_table(["fraction changed at", "from", "to"], rows))
    if w["actions"]:
        rows = [
            [
                num(a["finished_at"]),
                html.escape(a["plan"]),
                html.escape(a["outcome"]),
                num(a["fraction_before"]),
                num(a["fraction_after"]),
                html.escape(a["error"] or a["detail"] or ""),
            ]
            for a in w["actions"]
        ]
        out.append(
            html_table(
                ["action finished", "plan", "outcome", "before", "after", "detail"],
                rows,
                left=3,
                text_last=True,
            )
        )
    return "".join(out)


def render_html(
    document: Mapping[str, Any],
    fleet_png: bytes,
    charts: Mapping[str, bytes],
) -> str:
    """The page: fleet totals and chart, every workload in a table, and a section (with its
    chart) per workload in ``charts`` (keyed ``namespace/workload``)."""
    f = document["fleet"]
    workloads = document["workloads"]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>fracpilot report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fracpilot report</h1>",
        f'<p class="muted">from {num(document["since"])} to {num(document["until"])} '
        f"(when the server stored the messages); generated {num(document['generated_at'])}. "
        "The same numbers are in report.json beside this file.</p>",
        "<h2>Fleet</h2>",
        img_tag(fleet_png, "fleet: GPUs held against whole GPUs, and actions by plan"),
        _fleet(f),
        *_consolidation(document.get("consolidation")),
        "<h2>Workloads</h2>",
        '<p class="muted">Workloads with overruns first, then by GPU-hours held.</p>',
        html_table(_WORKLOAD_COLUMNS, [_workload_row(w) for w in workloads], 2),
    ]
    charted = [w for w in workloads if f"{w['namespace']}/{w['workload']}" in charts]
    if charted:
        more = len(workloads) - len(charted)
        note = f" ({more} more without a chart: see the table)" if more > 0 else ""
        out.append(f"<h2>Usage against allocation{html.escape(note)}</h2>")
        for w in charted:
            out.append(_workload_section(w, charts[f"{w['namespace']}/{w['workload']}"]))
    out.append("</body></html>")
    return "\n".join(out)


def render_report(report: Report, charts: int) -> tuple[dict[str, Any], str]:
    """The JSON document and the HTML page of a report, with charts for the first ``charts``
    workloads that have samples (in the report's order)."""
    document = report.as_dict()
    pngs: dict[str, bytes] = {}
    for w in report.workloads:
        if len(pngs) >= charts:
            break
        if w.replay.timeline:
            pngs[w.workload.display] = workload_chart(w)
    return document, render_html(document, fleet_chart(report), pngs)
