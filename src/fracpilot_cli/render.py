"""What ``fracpilot status`` and ``fracpilot explain`` print, as data for the output layer
(:mod:`fracpilot_cli.output`: their columns, cells, documents and CSV records), and the
explain timeline's narrative text (pure: strings out).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fracpilot_cli.explain import DecisionTimeline, TimelineEntry
from fracpilot_cli.output import Column, Listing, align, table_lines, to_json, to_yaml
from fracpilot_cli.report import Report, WorkloadReport
from fracpilot_cli.status import ConsolidationStatus, Risk, StatusRow, totals
from fracpilot_libs.contracts import ActuationResult, FractionDecision, PlannedMove

__all__ = ["align", "report_listing", "status_listing", "timeline_listing", "to_json", "to_yaml"]

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
    if value is None:
        return "-"
    return f"-${-value:,.0f}" if round(value) < 0 else f"${max(value, 0.0):,.0f}"


def when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def state_text(row: StatusRow) -> str:
    if row.wait_s is not None:
        return f"{row.state} ({duration(row.wait_s)})"
    if row.requested is not None:
        return f"{row.state} (asked {fraction(row.requested)})"
    return row.state


def enforced_text(row: StatusRow) -> str:
    """The enforced share (HAMi-core's memory limit); "(lags)" when the accounting moved."""
    if row.enforced_fraction is None:
        return "-"
    return fraction(row.enforced_fraction) + (" (lags)" if row.enforcement_lags else "")


def action_text(row: StatusRow) -> str:
    if not row.last_plan:
        return "-"
    arrow = ""
    if row.last_fraction_before is not None and row.last_fraction_after is not None:
        arrow = f" {fraction(row.last_fraction_before)}->{fraction(row.last_fraction_after)}"
    return f"{row.last_plan}{arrow} {row.last_outcome}"


# --- status ----------------------------------------------------------------------------------

STATUS_COLUMNS: tuple[Column[StatusRow], ...] = (
    Column("NAMESPACE", lambda r: r.namespace),
    Column("WORKLOAD", lambda r: r.workload),
    Column("FRACTION", lambda r: fraction(r.fraction)),
    Column("GPU-MEM", lambda r: gib(r.gpu_memory_bytes)),
    Column("COMPUTE-P95", lambda r: percent(r.compute_of_fraction)),
    Column("MEM-PEAK", lambda r: percent(r.memory_of_fraction)),
    Column("TARGET", lambda r: fraction(r.target)),
    Column("STATE", state_text),
    Column("LAST-ACTION", action_text),
    Column("SAVED/MONTH", lambda r: money(r.saved_usd_month)),
    Column("WOULD-SAVE", lambda r: money(r.would_save_usd_month)),
    Column("RISK", lambda r: r.risk.label or "-", wide=True),
    Column("ENFORCED", enforced_text, wide=True),
    Column("NODE", lambda r: r.node or "-", wide=True),
    Column("GPU", lambda r: r.gpu or "-", wide=True),
    Column("GPU-MODEL", lambda r: r.gpu_model or "-", wide=True),
    Column("MIG-PROFILE", lambda r: r.mig_profile, wide=True),
    Column("SAMPLES", lambda r: str(r.samples), wide=True),
    Column("LAST-SAMPLE", lambda r: when(r.last_sample_at), wide=True),
    Column("ACTION-AT", lambda r: when(r.last_action_at), wide=True),
    Column("POLICY", lambda r: f"{r.policy_scope}@{r.policy_revision}", wide=True),
)
COLUMNS = tuple(c.header for c in STATUS_COLUMNS if not c.wide)
WIDE_COLUMNS = tuple(c.header for c in STATUS_COLUMNS)


def status_cells(row: StatusRow, wide: bool) -> list[str]:
    return [c.cell(row) for c in STATUS_COLUMNS if wide or not c.wide]


def status_lines(rows: Sequence[StatusRow], wide: bool = False) -> list[str]:
    """The table: a header, one line per row (in the rows' order), and a footer."""
    return table_lines(status_listing(rows, datetime.now(UTC)), wide)


def status_footer(rows: Sequence[StatusRow]) -> str:
    t = totals(rows)
    return (
        f"{t['workloads']:,.0f} workloads, {t['gpus_held']:,.2f} GPUs held, "
        f"{money(t['saved_usd_month'])}/month saved against whole GPUs, "
        f"{money(t['would_save_usd_month'])}/month more with the targets applied"
    )


MOVES_SHOWN = 5  # planned moves listed under the table (all of them in -o json)


def plural(count: int, one: str) -> str:
    return f"{count} {one}" if count == 1 else f"{count} {one}s"


def consolidation_line(c: ConsolidationStatus) -> str:
    """ "consolidation: would free N GPUs / M nodes (K moves)"; in auto mode what it freed
    today first."""
    would = (
        f"would free {plural(c.would_free_gpus, 'GPU')} / {plural(c.would_free_nodes, 'node')} "
        f"({plural(c.move_count, 'move')})"
    )
    if not c.auto:
        return f"consolidation: {would}"
    t = c.today
    return (
        f"consolidation: freed {plural(t.freed_gpus, 'GPU')} / "
        f"{plural(t.freed_nodes, 'node')} today ({plural(t.verified, 'move')}); {would} more"
    )


def move_text(m: PlannedMove) -> str:
    if m.kind == "shrink":
        return f"  shrink {m.pod} to {m.fraction:g} GPU in place on {m.to_node}/{m.to_gpu}"
    return (
        f"  move {m.pod} ({m.fraction:g} GPU): {m.from_node}/{m.from_gpu} -> {m.to_node}/{m.to_gpu}"
    )


def consolidation_footer(c: ConsolidationStatus | None) -> list[str]:
    """The consolidation line and the first :data:`MOVES_SHOWN` planned moves."""
    if c is None:
        return []
    lines = [consolidation_line(c), *(move_text(m) for m in c.moves[:MOVES_SHOWN])]
    if c.move_count > MOVES_SHOWN:
        lines.append(f"  ... {c.move_count - MOVES_SHOWN} more (-o json lists them)")
    return lines


def status_listing(
    rows: Sequence[StatusRow],
    generated_at: datetime,
    consolidation: ConsolidationStatus | None = None,
) -> Listing[StatusRow]:
    """``fracpilot status`` as data: a row per workload; the document is
    :func:`status_document`, each CSV row one of its items."""
    return Listing(
        rows=rows,
        columns=STATUS_COLUMNS,
        document=lambda: status_document(rows, generated_at, consolidation),
        record=StatusRow.as_dict,
        footer=[status_footer(rows), *consolidation_footer(consolidation)],
        style=lambda row: RISK_STYLES[row.risk],
    )


RISK_STYLES = {
    Risk.MEMORY_OVER: "bold red",
    Risk.COMPUTE_OVER: "red",
    Risk.NEAR: "yellow",
    Risk.UPSIZING: "cyan",
    Risk.FAILED: "magenta",
    Risk.NONE: "",
}


def status_document(
    rows: Sequence[StatusRow],
    generated_at: datetime,
    consolidation: ConsolidationStatus | None = None,
) -> dict[str, Any]:
    """``consolidation``: null when no actuator reported a plan."""
    return {
        "kind": "WorkloadStatusList",
        "generated_at": generated_at.isoformat(),
        "totals": dict(totals(rows)),
        "consolidation": consolidation.as_dict() if consolidation is not None else None,
        "items": [r.as_dict() for r in rows],
    }


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


def share_text(accounted: float, enforced: float | None) -> str:
    """Accounted (the scheduler's) versus enforced (the container's memory limit)."""
    if enforced is None:
        return f"accounted {fraction(accounted)}, memory not enforced (accounting only)"
    lag = " (lags until the pod restarts)" if abs(enforced - accounted) > 1e-6 else ""
    return f"accounted {fraction(accounted)}, enforced {fraction(enforced)}{lag}"


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
    if r.fraction_after is not None:
        lines.append(f"       share: {share_text(r.fraction_after, r.enforced_fraction)}")
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
            f"now: fraction {fraction(s.fraction)} ({gib(s.gpu_memory_bytes)}; enforced "
            f"{enforced_text(s)}), compute p95 "
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


def _last(e: TimelineEntry) -> ActuationResult | None:
    return e.results[-1] if e.results else None


def _decided(e: TimelineEntry, get: Any) -> str:
    return "-" if e.decision is None else str(get(e.decision))


def _did(e: TimelineEntry, get: Any) -> str:
    r = _last(e)
    return "-" if r is None else str(get(r))


TIMELINE_COLUMNS: tuple[Column[TimelineEntry], ...] = (
    Column("RECORDED", lambda e: when(e.recorded_at)),
    Column("DECISION", lambda e: e.decision_id),
    Column("FROM", lambda e: _decided(e, lambda d: fraction(d.current_fraction))),
    Column("TO", lambda e: _decided(e, lambda d: fraction(d.new_fraction))),
    Column("REASON", lambda e: _decided(e, lambda d: d.reason.value)),
    Column("PLAN", lambda e: _did(e, lambda r: r.plan.value)),
    Column("OUTCOME", lambda e: _did(e, lambda r: r.outcome.value)),
    Column("MODE", lambda e: _decided(e, lambda d: d.mode.value), wide=True),
    Column("POLICY-REV", lambda e: _decided(e, lambda d: d.policy_revision), wide=True),
    Column("ENFORCED", lambda e: _did(e, lambda r: fraction(r.enforced_fraction)), wide=True),
    Column("NODE", lambda e: _did(e, lambda r: r.node_after or r.node_before or "-"), wide=True),
    Column("FINISHED", lambda e: _did(e, lambda r: when(r.finished_at)), wide=True),
    Column("ERROR", lambda e: _did(e, lambda r: r.error or "-"), wide=True),
    Column("WHY", lambda e: _decided(e, lambda d: d.explanation), wide=True),
)


def timeline_record(e: TimelineEntry) -> dict[str, Any]:
    """One CSV row: the entry's decision and its last action, flat (their JSON values)."""
    d = e.decision
    r = _last(e)
    return {
        "decision_id": e.decision_id,
        "recorded_at": e.recorded_at.isoformat(),
        "decided_at": d.decided_at.isoformat() if d else None,
        "current_fraction": d.current_fraction if d else None,
        "new_fraction": d.new_fraction if d else None,
        "reason": d.reason.value if d else None,
        "mode": d.mode.value if d else None,
        "policy_revision": d.policy_revision if d else None,
        "explanation": d.explanation if d else None,
        "actions": len(e.results),
        "plan": r.plan.value if r else None,
        "outcome": r.outcome.value if r else None,
        "fraction_before": r.fraction_before if r else None,
        "fraction_after": r.fraction_after if r else None,
        "enforced_fraction": r.enforced_fraction if r else None,
        "node_after": r.node_after if r else None,
        "finished_at": r.finished_at.isoformat() if r and r.finished_at else None,
        "detail": r.detail if r else None,
        "error": r.error if r else None,
    }


def timeline_listing(t: DecisionTimeline) -> Listing[TimelineEntry]:
    """``fracpilot explain`` as data: a row per decision, newest first; the document is
    :meth:`DecisionTimeline.as_dict`."""
    return Listing(
        rows=t.entries,
        columns=TIMELINE_COLUMNS,
        document=t.as_dict,
        record=timeline_record,
        title=f"{t.workload.display} ({t.workload.owner_kind}, cluster {t.workload.cluster})",
    )


# --- report ----------------------------------------------------------------------------------

REPORT_COLUMNS: tuple[Column[WorkloadReport], ...] = (
    Column("NAMESPACE", lambda w: w.workload.namespace),
    Column("WORKLOAD", lambda w: w.workload.owner_name),
    Column("GPU-H", lambda w: f"{w.metrics.fraction_hours:,.1f}"),
    Column("WHOLE-GPU-H", lambda w: f"{w.metrics.whole_gpu_hours:,.1f}"),
    Column("SAVED", lambda w: f"{w.metrics.savings_pct:.1f}%"),
    Column("SAVED-USD", lambda w: money(w.metrics.cost_saved_usd)),
    Column("COMPUTE-OVER", lambda w: f"{w.metrics.compute_overrun_pct:.2f}%"),
    Column("MEMORY-OVER", lambda w: str(w.metrics.memory_overrun_samples)),
    Column("RESIZES", lambda w: str(w.metrics.resizes)),
    Column("FINAL", lambda w: fraction(w.replay.final_fraction)),
    Column("KIND", lambda w: w.workload.owner_kind, wide=True),
    Column("CLUSTER", lambda w: w.workload.cluster, wide=True),
    Column("GPU-MODEL", lambda w: w.gpu_model or "-", wide=True),
    Column("SAMPLES", lambda w: str(w.metrics.samples), wide=True),
    Column("DECISIONS", lambda w: str(len(w.decisions)), wide=True),
    Column("ACTIONS", lambda w: str(len(w.actions)), wide=True),
)


def report_summary(report: Report, document: dict[str, Any]) -> str:
    """``fracpilot report``'s one line: fraction-hours and cards, from report.json's numbers."""
    f = document["fleet"]
    c = f["cards"]
    return (
        f"{len(report.workloads)} workloads, {f['fraction_hours']:,.1f} of "
        f"{f['whole_gpu_hours']:,.1f} GPU-hours held, ${f['cost_saved_usd']:,.2f} saved; "
        f"{c['gpus_in_use']} GPUs in use for {c['gpus_whole']} pods ({c['cards_freed']} "
        f"freed), {c['card_hours']:,.1f} of {c['whole_card_hours']:,.1f} card-hours; "
        f"{f['actions']} actions"
    )


def report_consolidation(document: dict[str, Any]) -> str | None:
    """Consolidation over the window, from report.json's numbers (None: none in it)."""
    c = document.get("consolidation")
    if not c:
        return None
    return (
        f"consolidation: freed {plural(c['freed_gpus'], 'GPU')} / "
        f"{plural(c['freed_nodes'], 'node')} with {plural(c['verified'], 'move')} verified "
        f"({c['failed']} failed, {c['abandoned']} given up); last plan would free "
        f"{plural(c['would_free_gpus'], 'GPU')} / {plural(c['would_free_nodes'], 'node')} "
        f"({plural(c['would_move'], 'move')})"
    )


def report_listing(report: Report, document: dict[str, Any]) -> Listing[WorkloadReport]:
    """``fracpilot report`` as data: a row per workload (in the report's order); the document is
    report.json's, each CSV row one of its workloads."""
    return Listing(
        rows=report.workloads,
        columns=REPORT_COLUMNS,
        document=lambda: document,
        record=WorkloadReport.as_dict,
        footer=[
            report_summary(report, document),
            *filter(None, [report_consolidation(document)]),
        ],
    )


# --- replay ----------------------------------------------------------------------------------

REPLAY_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("NAMESPACE", lambda w: str(w["namespace"])),
    Column("WORKLOAD", lambda w: str(w["workload"])),
    Column("GPU-H", lambda w: f"{w['fraction_hours']:,.1f}"),
    Column("WHOLE-GPU-H", lambda w: f"{w['whole_gpu_hours']:,.1f}"),
    Column("SAVED", lambda w: f"{w['savings_pct']:.1f}%"),
    Column("SAVED-USD", lambda w: money(w["cost_saved_usd"])),
    Column("COMPUTE-OVER", lambda w: f"{w['compute_overrun_pct']:.2f}%"),
    Column("MEMORY-OVER", lambda w: str(w["memory_overrun_samples"])),
    Column("RESIZES", lambda w: str(w["resizes"])),
    Column("FINAL", lambda w: fraction(w["final_fraction"])),
    Column("SAMPLES", lambda w: str(w["samples"]), wide=True),
    Column("RESIZES/DAY", lambda w: f"{w['resizes_per_workload_day']:.2f}", wide=True),
    Column("LONGEST-OVERRUN", lambda w: duration(w["longest_overrun_s"]), wide=True),
    Column("COST-USD", lambda w: money(w["allocated_cost_usd"]), wide=True),
    Column("WHOLE-COST-USD", lambda w: money(w["whole_cost_usd"]), wide=True),
)


def replay_listing(document: dict[str, Any]) -> Listing[dict[str, Any]]:
    """``fracpilot replay`` as data: the document is its JSON (``replay --json``); a row per
    workload, most GPU-hours first, each CSV row one of the document's workloads."""
    rows = sorted(
        document["workloads"],
        key=lambda w: (-w["fraction_hours"], w["namespace"], w["workload"]),
    )
    t = document["totals"]
    return Listing(
        rows=rows,
        columns=REPLAY_COLUMNS,
        document=lambda: document,
        record=lambda w: w,
        footer=[
            f"{t['workloads']:,} workloads, {t['fraction_hours']:,.1f} of "
            f"{t['whole_gpu_hours']:,.1f} GPU-hours allocated ({t['savings_pct']:.1f}% saved), "
            f"{t['resizes']:,} resizes"
        ],
    )
