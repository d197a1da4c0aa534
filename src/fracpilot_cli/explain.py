"""``fracpilot explain``'s pure core: one workload's decisions and what the actuator did with each.

Decisions (the decisions stream) and actuation results (the actuations stream) are joined by
decision id. An entry is ordered by when the server stored its decision (or, for a result whose
decision is no longer in the stream, the result): both streams are stamped by the same server
clock, unlike ``decided_at``, which is the engine's clock (the samples' timestamps). Newest
first. No I/O here: :mod:`fracpilot_cli.operator_data` reads the streams.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fracpilot_cli.status import Recorded, StatusRow
from fracpilot_libs.contracts import ActuationResult, FractionDecision, WorkloadRef


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One decision (None when only its results are left) and its results, oldest first."""

    decision_id: str
    decision: FractionDecision | None
    results: tuple[ActuationResult, ...]
    recorded_at: datetime  # when the server stored the decision (else its first result)

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "recorded_at": self.recorded_at.isoformat(),
            "decision": self.decision.model_dump(mode="json") if self.decision else None,
            "actions": [r.model_dump(mode="json") for r in self.results],
        }


@dataclass(frozen=True, slots=True)
class DecisionTimeline:
    workload: WorkloadRef
    entries: tuple[TimelineEntry, ...]  # newest first
    status: StatusRow | None = None  # the workload's status row now, when known

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload.model_dump(mode="json"),
            "status": self.status.as_dict() if self.status is not None else None,
            "entries": [e.as_dict() for e in self.entries],
        }


def build_timeline(
    namespace: str,
    name: str,
    decisions: Iterable[Recorded[FractionDecision]],
    results: Iterable[Recorded[ActuationResult]],
    status: StatusRow | None = None,
) -> DecisionTimeline:
    """The decisions about ``namespace/name`` with their results, newest first. Messages of
    other workloads (the subjects may be shared by names that differ only in characters a
    subject cannot hold) are left out."""

    def mine(ref: WorkloadRef) -> bool:
        return ref.namespace == namespace and ref.owner_name == name

    by_decision: dict[str, list[Recorded[ActuationResult]]] = defaultdict(list)
    for r in results:
        if mine(r.value.workload):
            by_decision[r.value.decision_id].append(r)
    entries: list[tuple[datetime, int, int, TimelineEntry]] = []
    seen: set[str] = set()
    for d in decisions:
        if not mine(d.value.workload) or d.value.decision_id in seen:
            continue
        seen.add(d.value.decision_id)
        own = sorted(by_decision.get(d.value.decision_id, []), key=lambda r: r.sequence)
        entry = TimelineEntry(
            d.value.decision_id, d.value, tuple(r.value for r in own), d.received_at
        )
        entries.append((d.received_at, 1, d.sequence, entry))
    for decision_id, own in by_decision.items():
        if decision_id in seen:
            continue
        own.sort(key=lambda r: r.sequence)
        entry = TimelineEntry(decision_id, None, tuple(r.value for r in own), own[0].received_at)
        entries.append((own[0].received_at, 0, own[0].sequence, entry))
    # Newest first; at the same instant a decision goes before an orphan result.
    entries.sort(key=lambda e: e[:3], reverse=True)
    ordered = tuple(e[3] for e in entries)
    workload = WorkloadRef(namespace=namespace, owner_name=name)
    for e in ordered:
        if e.decision is not None:
            workload = e.decision.workload
            break
        if e.results:
            workload = e.results[0].workload
            break
    return DecisionTimeline(workload, ordered, status)
