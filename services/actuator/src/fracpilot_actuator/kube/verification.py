"""Recreates waiting to be verified: a result says what the replacement pod really holds. Pure.

An eviction is not the end of a recreate: the workload's controller makes a replacement, the
admission webhooks size it (fracpilot's first, KAI's after) and a scheduler binds it. A
recreate is APPLIED only once each evicted pod has a replacement bound to a node, and what the
result says about it is read from the new pod (:func:`replacement_verdict`): its share (the
``gpu-fraction`` annotation or HAMi's allocation), the node and GPU it landed on, and its
enforced limit (KAI's ``GPU_PORTION`` from the GPU-sharing ConfigMap, HAMi-core's
``CUDA_DEVICE_MEMORY_LIMIT``: :mod:`.enforcement`). Until then the decision is
:attr:`~fracpilot_libs.contracts.Outcome.PENDING`.

A replacement born at another share than the plan's (fracpilot's webhook was down: its
``failurePolicy: Ignore`` lets the pod through with the template's share) is reported with the
share it has; the backend then corrects it once, within the disruption budget.

A pending recreate outlives the process that evicted: :func:`recreate_record` writes it as
JSON (kept in the actuator's state by :class:`~fracpilot_actuator.stores.ports.PendingRecreates`)
and :func:`recreate_from_record` reads it back, so a restarted actuator or a new leader carries
on verifying and publishes the final result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from fracpilot_actuator.kube.cluster_view import ClusterView
from fracpilot_actuator.kube.enforcement import NOT_ENFORCED
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_libs.contracts import FractionDecision, PlanKind
from fracpilot_libs.placement.planner import ResizePlan

SAME_SHARE = 0.005
"""Two shares closer than this are one: KAI keeps hundredths (``GPU_PORTION`` is ``%.2f``)."""


@dataclass
class PendingRecreate:
    """Pods evicted for a decision, waiting for their replacements to be bound."""

    decision: FractionDecision
    kind: PlanKind  # RECREATE_ELSEWHERE, or SCALE_UP once capacity came and pods were evicted
    step: ResizePlan  # the reported step: what the pod was, and the share it is to have
    node_before: str
    evicted: int  # as many replacements are awaited
    known_uids: frozenset[str]  # the workload's pods when they were evicted: none replaces one
    started_at: datetime
    placeholders: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Scale-up placeholders kept until the replacements are bound (make before break)."""
    notes: list[str] = field(default_factory=list)
    corrections: int = 0  # how often a replacement born at the wrong share was recreated


class _Record(BaseModel):
    """A :class:`PendingRecreate` as stored (field for field)."""

    model_config = ConfigDict(extra="ignore")

    decision: FractionDecision
    kind: PlanKind
    step: ResizePlan
    node_before: str
    evicted: int
    known_uids: list[str]
    started_at: datetime
    placeholders: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    corrections: int = 0


def recreate_record(pending: PendingRecreate) -> str:
    """The pending recreate as JSON, to be kept across restarts."""
    return _Record(
        decision=pending.decision,
        kind=pending.kind,
        step=pending.step,
        node_before=pending.node_before,
        evicted=pending.evicted,
        known_uids=sorted(pending.known_uids),
        started_at=pending.started_at,
        placeholders=pending.placeholders,
        notes=pending.notes,
        corrections=pending.corrections,
    ).model_dump_json()


def recreate_from_record(text: str | bytes) -> PendingRecreate:
    """A pending recreate as :func:`recreate_record` wrote it; ValueError when it is not one."""
    r = _Record.model_validate_json(text)
    return PendingRecreate(
        decision=r.decision,
        kind=r.kind,
        step=r.step,
        node_before=r.node_before,
        evicted=r.evicted,
        known_uids=frozenset(r.known_uids),
        started_at=r.started_at,
        placeholders=dict(r.placeholders),
        notes=list(r.notes),
        corrections=r.corrections,
    )


@dataclass(frozen=True)
class Replacement:
    """A replacement pod as read: where it is and what it holds."""

    pod: str
    node: str
    gpu: str
    fraction: float | None  # None: it holds no share fracpilot can read
    enforced: float | None  # the container's enforced limit as a share; None: not enforced


@dataclass(frozen=True)
class Verdict:
    state: Literal["waiting", "verified", "wrong_share", "timed_out"]
    reason: str
    replacement: Replacement | None = None  # the one reported (first by name)


def replacements_of(pending: PendingRecreate, view: ClusterView) -> list[PodInfo]:
    """The workload's live pods that were not there when its pods were evicted."""
    return sorted((p for p in view.live if p.uid not in pending.known_uids), key=lambda p: p.name)


def _read(pod: PodInfo, view: ClusterView) -> Replacement:
    enforced = view.enforcement.get(pod.name, NOT_ENFORCED)
    share = pod.share
    if share is not None:
        fraction: float | None = share.fraction
    else:  # a target of 1.0 is a whole-GPU pod (KAI accepts no gpu-fraction of 1): it holds 1.0
        fraction = 1.0 if pod.whole_gpus == 1 else None
    return Replacement(
        pod=pod.name,
        node=pod.node,
        gpu=share.gpu_uuid if share is not None else "",
        fraction=fraction,
        enforced=enforced.fraction,
    )


def _waiting_for(pods: list[PodInfo]) -> str:
    """Why the replacements are not bound yet, as their PodScheduled conditions say."""
    texts = []
    for pod in pods:
        status = pod.raw.get("status") or {}
        condition: dict[str, Any] = next(
            (c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), {}
        )
        why = condition.get("message") or condition.get("reason") or "not scheduled yet"
        texts.append(f"{pod.name}: {why}")
    return "; ".join(texts)


def replacement_verdict(
    pending: PendingRecreate, view: ClusterView, now: datetime, timeout_s: float
) -> Verdict:
    """Whether the evicted pods' replacements are bound, at which share, or too late."""
    new = replacements_of(pending, view)
    bound = [p for p in new if p.node]
    target = pending.step.fraction_after
    if len(bound) >= pending.evicted:
        read = [_read(p, view) for p in bound]
        wrong = [r for r in read if r.fraction is None or abs(r.fraction - target) > SAME_SHARE]
        if wrong:
            first = wrong[0]
            held = "no share it can read" if first.fraction is None else f"{first.fraction:g}"
            return Verdict(
                "wrong_share",
                f"replacement {first.pod} was born with {held}, not {target:g}: it was not "
                "sized on admission (fracpilot's webhook unreachable? its failurePolicy is "
                "Ignore)",
                first,
            )
        return Verdict(
            "verified", f"replacement {read[0].pod} bound on {read[0].node} at {target:g}", read[0]
        )
    if now - pending.started_at > timedelta(seconds=timeout_s):
        unbound = [p for p in new if not p.node]
        why = _waiting_for(unbound) if unbound else "no replacement pod was created"
        return Verdict(
            "timed_out",
            f"{len(bound)} of {pending.evicted} replacement(s) bound within {timeout_s:g} s "
            f"({why})",
        )
    return Verdict("waiting", f"{len(bound)} of {pending.evicted} replacement(s) bound")
