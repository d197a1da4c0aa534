"""Text, JSON and YAML for ``fracpilot status`` and ``fracpilot explain`` (pure: strings out).

Tables are plain aligned columns, as kubectl prints them: fast for ten thousand rows,
greppable, and coloured by the caller only when the output is a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import pydantic_core

from fracpilot_cli.explain import DecisionTimeline, TimelineEntry
from fracpilot_cli.status import Risk, StatusRow, totals
from fracpilot_libs.contracts import ActuationResult, FractionDecision

Output = Literal["table", "wide", "json", "yaml"]
OUTPUTS: tuple[Output, ...] = ("table", "wide", "json", "yaml")
GIB = 1024**3

# --- small formats ---------------------------------------------------------------------------


def fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def gib(value: int | None) -> str:
    if value is None:
        return "-"
    g = value / GIB
    return f"{g:.0f}Gi" if abs(g - round(g)) < 0.05 else f"{g:.1f}Gi"


def duration(seconds: float | None) -> str:
    """Like kubectl's ages: 45s, 42m, 3h10m, 2d4h."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 3600:
        return f"{m}m"
    if s < 86400:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    return f"{d}d{h % 24}h" if h % 24 else f"{d}d"


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def state_text(row: StatusRow) -> str:
    if row.wait_s is not None:
        return f"{row.state} ({duration(row.wait_s)})"
    if row.requested is not None:
        return f"{row.state} (asked {fraction(row.requested)})"
    return row.state


def action_text(row: StatusRow) -> str:
    if not row.last_plan:
        return "-"
    arrow = ""
    if row.last_fraction_before is not None and row.last_fraction_after is not None:
        arrow = f" {fraction(row.last_fraction_before)}->{fraction(row.last_fraction_after)}"
    return f"{row.last_plan}{arrow} {row.last_outcome}"


# --- status ----------------------------------------------------------------------------------

COLUMNS = (
    "NAMESPACE",
    "WORKLOAD",
    "FRACTION",
    "GPU-MEM",
    "COMPUTE-P95",
    "MEM-PEAK",
    "TARGET",
    "STATE",
    "LAST-ACTION",
    "SAVED/MONTH",
)
WIDE_COLUMNS = (
    *COLUMNS,
    "RISK",
    "NODE",
    "GPU",
    "GPU-MODEL",
    "SAMPLES",
    "LAST-SAMPLE",
    "ACTION-AT",
    "POLICY",
)


def status_cells(row: StatusRow, wide: bool) -> list[str]:
    cells = [
        row.namespace,
        row.workload,
        fraction(row.fraction),
        gib(row.gpu_memory_bytes),
        percent(row.compute_of_fraction),
        percent(row.memory_of_fraction),
        fraction(row.target),
        state_text(row),
        action_text(row),
        money(row.saved_usd_month),
    ]
    if wide:
        cells += [
            row.risk.label or "-",
            row.node or "-",
            row.gpu or "-",
            row.gpu_model or "-",
            str(row.samples),
            when(row.last_sample_at),
            when(row.last_action_at),
            f"{row.policy_scope}@{row.policy_revision}",
        ]
    return cells


def align(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, three spaces apart, the last one unpadded."""
    widths = [len(h) for h in header]
    for cells in body:
        for i, cell in enumerate(cells):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    last = len(header) - 1

    def line(cells: Sequence[str]) -> str:
        return "   ".join(
            c if i == last else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    return [line(header), *(line(c) for c in body)]


def status_lines(rows: Sequence[StatusRow], wide: bool = False) -> list[str]:
    """The table: a header, one line per row (in the rows' order), and a footer."""
    header = WIDE_COLUMNS if wide else COLUMNS
    lines = align(header, [status_cells(r, wide) for r in rows])
    t = totals(rows)
    lines.append("")
    lines.append(
        f"{t['workloads']:,.0f} workloads, {t['gpus_held']:,.2f} GPUs held, "
        f"{money(t['saved_usd_month'])}/month saved against whole GPUs"
    )
    return lines


RISK_STYLES = {
    Risk.MEMORY_OVER: "bold red",
    Risk.COMPUTE_OVER: "red",
    Risk.NEAR: "yellow",
    Risk.UPSIZING: "cyan",
    Risk.FAILED: "magenta",
    Risk.NONE: "",
}


def status_document(rows: Sequence[StatusRow], generated_at: datetime) -> dict[str, Any]:
    return {
        "kind": "WorkloadStatusList",
        "generated_at": generated_at.isoformat(),
        "totals": dict(totals(rows)),
        "items": [r.as_dict() for r in rows],
    }


def to_json(document: object) -> str:
    """Indented JSON (pydantic-core's encoder: ten times the standard library's with indent)."""
    return pydantic_core.to_json(document, indent=2).decode()


# --- YAML ------------------------------------------------------------------------------------
# A block-style emitter for JSON-shaped documents (dicts with string keys, lists, scalars):
# PyYAML's Python representer takes seconds on ten thousand rows. Strings are plain only when
# nothing could read them as another type; otherwise double-quoted with JSON's escapes, which
# YAML's double-quoted style shares. Floats always carry a dot or .inf/.nan, as YAML 1.1 wants.

_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*(?: [A-Za-z0-9_./()-]+)*")
_NOT_PLAIN = {"yes", "no", "on", "off", "true", "false", "null", "y", "n", "nan", "inf"}


def _yaml_scalar(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}{e}{exponent}"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _NOT_PLAIN:
        return text
    return _quoted(text)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _quoted(text: str) -> str:
    """Double-quoted: printable ASCII as it is, anything else escaped (\\uXXXX, \\UXXXXXXXX)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _yaml_lines(value: object, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            k = _yaml_scalar(key)
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}{k}:")
                _yaml_lines(item, indent + 2, out)
            else:
                out.append(f"{pad}{k}: {_yaml_inline(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                start = len(out)
                _yaml_lines(item, indent + 2, out)
                out[start] = f"{pad}- {out[start][indent + 2 :]}"
            else:
                out.append(f"{pad}- {_yaml_inline(item)}")
    else:
        out.append(f"{pad}{_yaml_scalar(value)}")


def _yaml_inline(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


def to_yaml(document: object) -> str:
    """Block-style YAML of a JSON-shaped document."""
    if isinstance(document, dict | list) and not document:
        return _yaml_inline(document) + "\n"
    out: list[str] = []
    _yaml_lines(document, 0, out)
    return "\n".join(out) + "\n"


# --- explain ---------------------------------------------------------------------------------


def _decision_lines(d: FractionDecision) -> list[str]:
    verb = "upsize" if d.new_fraction > d.current_fraction else "downsize"
    return [
        f"decided {when(d.decided_at)} (engine time): {verb} "
        f"{fraction(d.current_fraction)} -> {fraction(d.new_fraction)} "
        f"({d.current_memory_mib:,} -> {d.new_memory_mib:,} MiB), reason {d.reason.value}, "
        f"policy revision {d.policy_revision}, mode {d.mode.value}",
        f"  why: {d.explanation}",
    ]


def _result_lines(r: ActuationResult) -> list[str]:
    moved = ""
    if r.fraction_before is not None and r.fraction_after is not None:
        moved = f": {fraction(r.fraction_before)} -> {fraction(r.fraction_after)}"
    where = ""
    if r.node_before or r.node_after:
        before = f"{r.node_before or '?'} {r.gpu_before}".strip()
        after = f"{r.node_after or '?'} {r.gpu_after}".strip()
        where = f" on {before}" if before == after else f", {before} -> {after}"
    lines = [f"  did: {r.plan.value}, {r.outcome.value} at {when(r.finished_at)}{moved}{where}"]
    if r.detail:
        lines.append(f"       detail: {r.detail}")
    if r.error:
        lines.append(f"       error: {r.error}")
    return lines


def entry_lines(e: TimelineEntry) -> list[str]:
    lines = [f"* {when(e.recorded_at)}  decision {e.decision_id}"]
    if e.decision is not None:
        lines += [f"  {line}" for line in _decision_lines(e.decision)]
    else:
        lines.append("  (the decision is no longer in the decisions stream)")
    for r in e.results:
        lines += _result_lines(r)
    if not e.results:
        lines.append("  did: nothing recorded yet (the actuator has not reported on it)")
    return lines


def timeline_lines(t: DecisionTimeline) -> list[str]:
    wl = t.workload
    lines = [f"{wl.display} ({wl.owner_kind}, cluster {wl.cluster}): newest first"]
    if t.status is not None:
        s = t.status
        lines.append(
            f"now: fraction {fraction(s.fraction)} ({gib(s.gpu_memory_bytes)}), compute p95 "
            f"{percent(s.compute_of_fraction)} and memory peak {percent(s.memory_of_fraction)} "
            f"of it; target {fraction(s.target)}, {state_text(s)}; policy "
            f"{s.policy_scope} revision {s.policy_revision}"
        )
    lines.append("")
    for e in t.entries:
        lines += entry_lines(e)
        lines.append("")
    pod = next((e.decision.pod for e in t.entries if e.decision and e.decision.pod), "")
    if pod:  # the actuator's Kubernetes backend leaves an Event on the pod for each action
        lines.append(
            f"Kubernetes Events: kubectl -n {wl.namespace} get events "
            f"--field-selector involvedObject.name={pod}"
        )
    return lines
