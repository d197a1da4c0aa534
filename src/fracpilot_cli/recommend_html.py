"""``fracpilot recommend -o html``: one self-contained page, as ``fracpilot report`` writes one
(:mod:`fracpilot_cli.report_html`: the same number formatting, the chart a PNG data URI drawn
on Matplotlib's Agg canvas). Every number is taken from the JSON document ``-o json`` prints.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fracpilot_cli.plots import ALLOCATION, BASELINE
from fracpilot_cli.report_html import html_table, img_tag, num, png_bytes, usd

CHART_WORKLOADS = 30  # the chart's bars: the workloads that would save the most

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 20px; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th.l, td.l { text-align: left; }
.muted { color: #666; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.card { border: 1px solid #e3e3e3; border-radius: 6px; padding: 8px 14px; min-width: 150px; }
.card b { display: block; font-size: 20px; }
"""
COLUMNS = (
    "namespace",
    "workload",
    "kind",
    "held",
    "recommended",
    "compute peak",
    "memory peak (GiB)",
    "memory peak (share)",
    "mode",
    "saved %",
    "USD / month",
    "GPU model",
    "pods",
    "samples",
)
GIB = 1024**3


def _row(w: Mapping[str, Any]) -> list[str]:
    return [
        html.escape(w["namespace"]),
        html.escape(w["workload"]),
        html.escape(w["kind"]),
        num(w["held_fraction"]),
        num(w["recommended_fraction"]),
        num(w["compute_peak"]),
        num(round(w["memory_peak_bytes"] / GIB, 2)),
        num(w["memory_peak_share"]),
        html.escape(w["mode"]),
        num(w["saved_pct"]),
        usd(w["monthly_saving_usd"]),
        html.escape(w["gpu_model"] or "-"),
        num(w["pods"]),
        num(w["samples"]),
    ]


def chart(workloads: Sequence[Mapping[str, Any]]) -> bytes:
    """Held against recommended, one pair of bars per workload (those saving the most)."""
    top = sorted(
        workloads, key=lambda w: w["held_fraction"] - w["recommended_fraction"], reverse=True
    )[:CHART_WORKLOADS]
    fig = Figure(figsize=(9, 1.2 + 0.32 * max(1, len(top))), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names = [f"{w['namespace']}/{w['workload']}" for w in top]
    ys = range(len(top))
    ax.barh([y + 0.2 for y in ys], [w["held_fraction"] for w in top], 0.4, color=BASELINE)
    ax.barh([y - 0.2 for y in ys], [w["recommended_fraction"] for w in top], 0.4, color=ALLOCATION)
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("fraction of one GPU")
    ax.legend(["held", "recommended"], loc="lower right", fontsize=8)
    ax.set_title("held against recommended", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def render(document: Mapping[str, Any], since: str, url: str) -> str:
    """The page of ``document`` (:meth:`Recommendations.as_dict`)."""
    t = document["totals"]
    workloads = document["workloads"]
    cards = [
        ("workloads", num(t["workloads"])),
        ("cards held now", num(t["cards_held"])),
        ("cards at the recommendations", num(t["cards_packed"])),
        ("cards packing would free", num(t["cards_freed"])),
        ("nodes packing would free", num(t.get("nodes_freed"))),
        ("GPU-hours saved over the history", f"{num(t['saved_pct'])}%"),
        ("a month at the recommendations", usd(t["monthly_saving_usd"])),
    ]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>fracpilot recommend</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fracpilot recommend</h1>",
        f'<p class="muted">{num(t["workloads"])} workloads, {num(t.get("samples"))} samples '
        f"over the last {html.escape(since)} from {html.escape(url)}. The same numbers: "
        "<code>-o json</code>.</p>",
        '<div class="cards">',
        *(f'<div class="card"><b>{v}</b>{html.escape(k)}</div>' for k, v in cards),
        "</div>",
        html_table(
            ["nodes held now", "nodes at the recommendations", "nodes freed"],
            [[num(t.get("nodes_held")), num(t.get("nodes_packed")), num(t.get("nodes_freed"))]],
            0,
        ),
    ]
    if workloads:
        out.append(img_tag(chart(workloads), "held against recommended"))
    out.append("<h2>Workloads</h2>")
    out.append(html_table(COLUMNS, [_row(w) for w in workloads], 3))
    out.append("</body></html>")
    return "\n".join(out)
