"""The decision engine: pure functions from usage history and a policy to a fraction decision.

No I/O and no clock: time is the sample's timestamp. The same code runs in the service, in
replay and in the tests. This is the walking skeleton's first policy: a percentile of compute
over the window divided by the target utilization, the memory peak plus a margin, the larger
of the two rounded up to the grid; upsize at once, downsize only after the need stayed a full
step lower for the hold, and never within the cooldown after a change.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from fracpilot_libs.contracts import (
    MIB,
    Direction,
    FractionDecision,
    Policy,
    ReasonCode,
    UsageSample,
)


@dataclass(frozen=True, slots=True)
class Point:
    at: datetime
    compute: float
    memory_share: float


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """What the engine remembers of one workload, bounded by the policy window."""

    points: tuple[Point, ...] = ()
    current_fraction: float | None = None  # as last observed or decided
    decided_fraction: float | None = None  # the last fraction this engine asked for
    decided_at: datetime | None = None
    last_change_at: datetime | None = None
    below_since: datetime | None = None  # when the need first fell a full step below


@dataclass(frozen=True, slots=True)
class Need:
    compute_percentile: float
    compute_need: float
    memory_peak: float
    memory_need: float
    fraction: float  # on the grid, clamped

    @property
    def driver(self) -> ReasonCode:
        return (
            ReasonCode.MEMORY_HIGH
            if self.memory_need >= self.compute_need
            else ReasonCode.COMPUTE_HIGH
        )


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def round_up_to_grid(value: float, steps: int) -> float:
    # A small tolerance keeps 0.375000001 (float noise) on 0.375 instead of 0.5.
    return math.ceil(value * steps - 1e-9) / steps


def compute_need(points: tuple[Point, ...], policy: Policy) -> Need:
    compute_p = percentile([p.compute for p in points], policy.compute_percentile)
    memory_peak = max(p.memory_share for p in points)
    c_need = compute_p / policy.target_utilization
    m_need = memory_peak * (1.0 + policy.memory_margin)
    on_grid = round_up_to_grid(max(c_need, m_need), policy.grid_steps)
    fraction = min(policy.max_fraction, max(policy.min_fraction, on_grid))
    return Need(compute_p, c_need, memory_peak, m_need, fraction)


def observe(history: WorkloadHistory, sample: UsageSample, policy: Policy) -> WorkloadHistory:
    """Add a sample and forget what fell out of the window."""
    horizon = sample.timestamp - timedelta(seconds=policy.window_s)
    kept = tuple(p for p in history.points if p.at > horizon)
    point = Point(sample.timestamp, sample.compute, sample.memory_share)
    current = sample.allocated_fraction or history.current_fraction or policy.max_fraction
    return replace(history, points=(*kept, point), current_fraction=current)


def decision_id(sample: UsageSample, new_fraction: float) -> str:
    """Deterministic, so a redelivered sample yields the same id and is applied once."""
    digest = hashlib.sha256(f"{sample.workload.key}|{sample.sample_id}|{new_fraction}".encode())
    return digest.hexdigest()[:32]


def decide(
    history: WorkloadHistory, sample: UsageSample, policy: Policy
) -> tuple[WorkloadHistory, FractionDecision | None]:
    """Observe the sample, then decide whether the workload's fraction should change."""
    now = sample.timestamp
    history = observe(history, sample, policy)
    need = compute_need(history.points, policy)
    current = history.current_fraction or policy.max_fraction
    target = need.fraction
    step = 1.0 / policy.grid_steps

    if target > current:
        direction = Direction.UP
        history = replace(history, below_since=None)
    elif target <= current - step + 1e-9:
        below_since = history.below_since or now
        history = replace(history, below_since=below_since)
        if not _may_downsize(history, policy, now, below_since):
            return history, None
        direction = Direction.DOWN
    else:
        return replace(history, below_since=None), None

    # The actuator may lag: do not repeat the same request until a cooldown has passed.
    if (
        history.decided_fraction == target
        and history.decided_at is not None
        and (now - history.decided_at).total_seconds() < policy.cooldown_s
    ):
        return history, None

    decision = _make_decision(sample, policy, need, current, target, direction)
    history = replace(
        history,
        decided_fraction=target,
        decided_at=now,
        last_change_at=now,
        current_fraction=target,
        below_since=None,
    )
    return history, decision


def _may_downsize(
    history: WorkloadHistory, policy: Policy, now: datetime, below_since: datetime
) -> bool:
    span = (now - history.points[0].at).total_seconds()
    if span < policy.min_history_s:
        return False
    if (now - below_since).total_seconds() < policy.downsize_hold_s:
        return False
    return not (
        history.last_change_at is not None
        and (now - history.last_change_at).total_seconds() < policy.cooldown_s
    )


def _make_decision(
    sample: UsageSample,
    policy: Policy,
    need: Need,
    current: float,
    target: float,
    direction: Direction,
) -> FractionDecision:
    reason = need.driver if direction is Direction.UP else ReasonCode.UNDERUSED
    window_h = policy.window_s / 3600
    rule = (
        "upsize at once: need exceeds the current fraction"
        if direction is Direction.UP
        else f"downsize: need stayed a full step below for {policy.downsize_hold_s / 3600:g} h"
    )
    explanation = (
        f"{rule}. compute p{policy.compute_percentile:g} over {window_h:g} h = "
        f"{need.compute_percentile:.3f} GPU / target utilization {policy.target_utilization:g} "
        f"= {need.compute_need:.3f}; memory peak {need.memory_peak:.3f} x "
        f"(1 + {policy.memory_margin:g}) = {need.memory_need:.3f}; larger need rounded up to "
        f"1/{policy.grid_steps} and clamped to [{policy.min_fraction:g}, {policy.max_fraction:g}]"
        f" = {target:g} (was {current:g}); expected compute utilization "
        f"{need.compute_percentile / target:.0%} of the fraction, memory "
        f"{need.memory_peak / target:.0%}."
    )
    total = sample.memory_total_bytes
    return FractionDecision(
        decision_id=decision_id(sample, target),
        workload=sample.workload,
        decided_at=sample.timestamp,
        pod=sample.pod,
        gpu_uuid=sample.gpu_uuid,
        current_fraction=current,
        new_fraction=target,
        device_memory_bytes=total,
        current_memory_mib=int(current * total) // MIB,
        new_memory_mib=int(target * total) // MIB,
        direction=direction,
        reason=reason,
        explanation=explanation,
        policy_revision=policy.revision,
        mode=policy.mode,
        trigger_sample_id=sample.sample_id,
    )
