"""The decision engine: pure functions from a workload's usage history and a policy to a decision.

No I/O and no clock: time is the sample's timestamp, so the same code runs in the service, in
``fracpilot replay`` and in the tests. See :class:`fracpilot_libs.contracts.Policy` for the
rules; in short, memory first (an overrun is an out-of-memory error), compute second (an
overrun is contention), upsize fast, downsize slowly, and every decision says why.

:func:`observe` adds a sample to the history (:mod:`fracpilot_libs.sizing.state`),
:func:`need_of` sizes the workload from it, :func:`decide` does both and says whether the
fraction should change; :mod:`fracpilot_libs.sizing.outlook` reads the same rules for operators.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from fracpilot_libs.contracts import (
    MIB,
    Direction,
    FractionDecision,
    Policy,
    ReasonCode,
    UsageSample,
)
from fracpilot_libs.sizing.state import BUCKETS, MEMORY_SLOTS, WorkloadState, evolve

_MAX_EXPONENT = 40.0  # rescale decaying weights before they grow past 2**40
EPS = 1e-9  # float noise: values closer than this are equal
_UP, _DOWN = Direction.UP, Direction.DOWN  # module constants: cheaper than enum lookups


@dataclass(frozen=True, slots=True)
class Need:
    """The numbers behind a decision."""

    compute_percentile: float  # the policy percentile of compute, share of a GPU
    compute_need: float  # percentile / target utilization
    recent_compute: float  # the lowest of the last confirmation samples
    recent_need: float  # that / target utilization
    memory_peak: float  # share of the device over the memory window
    memory_need: float  # peak plus headroom
    fraction: float  # the larger need on the grid, clamped

    @property
    def driver(self) -> ReasonCode:
        if self.memory_need >= max(self.compute_need, self.recent_need):
            return ReasonCode.MEMORY_HIGH
        return ReasonCode.COMPUTE_HIGH


def round_up_to_grid(value: float, steps: int) -> float:
    # The tolerance keeps 0.375000001 (float noise) on 0.375 instead of 0.5.
    return math.ceil(value * steps - EPS) / steps


def clamp_to_policy(value: float, policy: Policy) -> float:
    on_grid = round_up_to_grid(value, policy.grid_steps)
    return min(policy.max_fraction, max(policy.min_fraction, on_grid))


def bucket_of(compute: float) -> int:
    """The histogram bucket whose upper edge is the smallest whole percent >= compute."""
    return min(BUCKETS - 1, max(0, math.ceil(compute * 100 - EPS)))


def histogram_percentile(weights: array[float], total: float, pct: float) -> float:
    """The upper edge of the bucket holding the pct-th percentile (0 for an empty histogram)."""
    if total <= 0:
        return 0.0
    index = bisect_left(list(accumulate(weights)), total * pct / 100.0 - total * EPS)
    return min(index, BUCKETS - 1) / 100.0


def memory_need_of(peak: float, policy: Policy) -> float:
    return peak + max(peak * policy.memory_margin, policy.memory_min_headroom)


def observe(
    state: WorkloadState,
    sample: UsageSample,
    policy: Policy,
    now: float,
    position: int | None = None,
) -> WorkloadState:
    """Add a sample to the history: decayed compute weight, memory slot peak, recent samples.

    ``position`` (where the sample sits in its stream) is kept as given; None keeps the last.
    """
    weights = array("d", state.compute_weights)
    ref, total = state.compute_ref, state.compute_total
    if state.samples == 0:
        ref = now
    exponent = (now - ref) / policy.compute_half_life_s
    if exponent > _MAX_EXPONENT:  # rescale so the weights stay in range
        scale = 2.0**-exponent
        weights = array("d", (w * scale for w in weights))
        total *= scale
        ref, exponent = now, 0.0
    weight = 2.0**exponent
    weights[bucket_of(sample.compute)] += weight
    total += weight

    # Memory peaks per slot, keyed by the slot's start time so that a change of window
    # keeps its meaning; a late sample folds into the newest slot, so the history stays
    # bounded whatever order samples arrive in.
    slot_len = policy.memory_window_s / MEMORY_SLOTS
    share = sample.memory_share
    slots = state.memory_slots
    n = len(slots)
    if n and now < slots[n - 2] + slot_len:
        if share > slots[n - 1]:
            slots = array("d", slots)
            slots[n - 1] = share
    else:
        horizon = now - policy.memory_window_s
        kept = array("d")
        for i in range(0, n, 2):
            if slots[i] + slot_len > horizon:
                kept.append(slots[i])
                kept.append(slots[i + 1])
        kept.append(now)
        kept.append(share)
        slots = kept

    keep = policy.compute_upsize_confirmations
    recent = (*state.recent_compute, sample.compute)[-keep:]
    current = sample.allocated_fraction or state.current_fraction or policy.max_fraction
    return WorkloadState(
        compute_weights=weights,
        compute_total=total,
        compute_ref=ref,
        memory_slots=slots,
        recent_compute=recent,
        memory_over=state.memory_over,
        first_seen=state.first_seen if state.first_seen is not None else now,
        samples=state.samples + 1,
        current_fraction=current,
        decided_fraction=state.decided_fraction,
        decided_at=state.decided_at,
        last_change_at=state.last_change_at,
        below_since=state.below_since,
        hold_until=state.hold_until,
        position=state.position if position is None else position,
    )


def need_of(state: WorkloadState, policy: Policy) -> Need:
    tu = policy.target_utilization
    pct = histogram_percentile(
        state.compute_weights, state.compute_total, policy.compute_percentile
    )
    full = len(state.recent_compute) >= policy.compute_upsize_confirmations
    recent = min(state.recent_compute) if full and state.recent_compute else 0.0
    peak = max(state.memory_slots[1::2], default=0.0)
    m_need = memory_need_of(peak, policy)
    fraction = clamp_to_policy(max(pct / tu, recent / tu, m_need), policy)
    return Need(pct, pct / tu, recent, recent / tu, peak, m_need, fraction)


def decision_id(sample: UsageSample, new_fraction: float) -> str:
    """Deterministic, so a redelivered sample yields the same id and is applied once."""
    digest = hashlib.sha256(f"{sample.workload.key}|{sample.sample_id}|{new_fraction}".encode())
    return digest.hexdigest()[:32]


def decide(
    state: WorkloadState, sample: UsageSample, policy: Policy, position: int | None = None
) -> tuple[WorkloadState, FractionDecision | None]:
    """Observe the sample, then decide whether the workload's fraction should change.

    ``position``: where the sample sits in its stream, kept in the state (see
    :attr:`WorkloadState.position`); None keeps the state's.
    """
    now = sample.timestamp.timestamp()
    state = observe(state, sample, policy, now, position)
    current = state.current_fraction or policy.max_fraction
    signals = sample.signals
    if signals is not None and (signals.oom_event or signals.contention_event):
        return _on_signal(state, sample, policy, now, current)

    need = need_of(state, policy)
    memory_over = state.memory_over + 1 if need.memory_need > current + EPS else 0
    target = need.fraction
    moving = sizing_direction(target, current, policy)
    if not policy.min_fraction - EPS <= current <= policy.max_fraction + EPS:
        rule = (
            f"policy bounds: {current:g} is outside [{policy.min_fraction:g}, "
            f"{policy.max_fraction:g}]"
        )
        direction = Direction.UP if target > current else Direction.DOWN
        reason = ReasonCode.POLICY_BOUNDS
        state = evolve(state, memory_over=memory_over)
    elif moving is _UP:
        memory_confirmed = memory_over >= policy.memory_upsize_confirmations
        compute_confirmed = max(need.compute_need, need.recent_need) > current + EPS
        if not (memory_confirmed or compute_confirmed):
            return evolve(state, memory_over=memory_over, below_since=None), None
        if memory_confirmed:
            rule = "upsize at once: memory need exceeds the fraction"
        elif need.recent_need > current + EPS:
            rule = (
                f"upsize: compute exceeded what the fraction holds for "
                f"{policy.compute_upsize_confirmations} samples in a row"
            )
        else:
            rule = "upsize: the compute percentile need exceeds the fraction"
        direction, reason = Direction.UP, need.driver
        state = evolve(state, memory_over=memory_over, below_since=None)
    elif moving is _DOWN:
        below_since = state.below_since if state.below_since is not None else now
        state = evolve(state, memory_over=memory_over, below_since=below_since)
        if not _may_downsize(state, policy, now, below_since):
            return state, None
        rule = (
            f"downsize: need stayed a full step below for "
            f"{(now - below_since) / 3600:.1f} h (hold {policy.downsize_hold_s / 3600:g} h)"
        )
        direction, reason = Direction.DOWN, ReasonCode.UNDERUSED
    else:
        return evolve(state, memory_over=memory_over, below_since=None), None

    if _repeats_pending_request(state, target, now, policy):
        return state, None
    decision = _make_decision(
        sample,
        policy,
        current,
        target,
        direction,
        reason,
        f"{rule}. {_numbers(need, policy, current, target)}",
    )
    return _after_change(state, target, now), decision


def _on_signal(
    state: WorkloadState, sample: UsageSample, policy: Policy, now: float, current: float
) -> tuple[WorkloadState, FractionDecision | None]:
    signals = sample.signals
    assert signals is not None
    kind = ReasonCode.OOM_SIGNAL if signals.oom_event else ReasonCode.CONTENTION_SIGNAL
    bump = max(current * policy.signal_multiplier, current + policy.step)
    need = need_of(state, policy)
    target = clamp_to_policy(max(bump, need.fraction), policy)
    state = evolve(state, hold_until=now + policy.signal_hold_s, below_since=None)
    if target <= current + EPS or _repeats_pending_request(state, target, now, policy):
        return state, None
    event = "out-of-memory" if kind is ReasonCode.OOM_SIGNAL else "contention"
    explanation = (
        f"upsize at once on an {event} event: {current:g} x {policy.signal_multiplier:g} "
        f"or one step of 1/{policy.grid_steps}, whichever is larger, and at least the need "
        f"({need.fraction:g}) = {target:g}; held for {policy.signal_hold_s / 3600:g} h before "
        f"any downsize. {_numbers(need, policy, current, target)}"
    )
    decision = _make_decision(sample, policy, current, target, Direction.UP, kind, explanation)
    return _after_change(state, target, now), decision


def _after_change(state: WorkloadState, target: float, now: float) -> WorkloadState:
    return evolve(
        state,
        decided_fraction=target,
        decided_at=now,
        last_change_at=now,
        current_fraction=target,
        below_since=None,
        memory_over=0,
    )


def sizing_direction(target: float, current: float, policy: Policy) -> Direction | None:
    """Which way a workload holding ``current`` should move to ``target``: up when the target is
    above it, down only when a full step below, else None (within a step: stay)."""
    if target > current + EPS:
        return _UP
    if target <= current - policy.step + EPS:
        return _DOWN
    return None


def pending_request(state: WorkloadState, now: float, policy: Policy) -> float | None:
    """The fraction this engine asked for within the cooldown (the actuator may not have
    applied it yet), else None."""
    if (
        state.decided_fraction is not None
        and state.decided_at is not None
        and now - state.decided_at < policy.cooldown_s
    ):
        return state.decided_fraction
    return None


def _repeats_pending_request(
    state: WorkloadState, target: float, now: float, policy: Policy
) -> bool:
    """The actuator may lag: do not repeat the same request within the cooldown."""
    return pending_request(state, now, policy) == target


def downsize_wait(
    state: WorkloadState, policy: Policy, now: float, below_since: float
) -> tuple[str, float]:
    """How long a downsize must still wait at ``now`` (engine seconds; 0 or less: it may
    happen), and what for: the downsize hold, the history, a signal hold or the cooldown (the
    longest wait decides). ``below_since``: when the need first fell a full step below."""
    first = state.first_seen if state.first_seen is not None else now
    name, longest = "downsize hold", policy.downsize_hold_s - (now - below_since)
    history = policy.min_history_s - (now - first)
    if history > longest:
        name, longest = "history", history
    if state.hold_until is not None and state.hold_until - now > longest:
        name, longest = "signal hold", state.hold_until - now
    if state.last_change_at is not None:
        cooldown = policy.cooldown_s - (now - state.last_change_at)
        if cooldown > longest:
            name, longest = "cooldown", cooldown
    return name, longest


def _may_downsize(state: WorkloadState, policy: Policy, now: float, below_since: float) -> bool:
    if state.first_seen is None:
        return False
    return downsize_wait(state, policy, now, below_since)[1] <= 0


def _numbers(need: Need, policy: Policy, current: float, target: float) -> str:
    return (
        f"compute p{policy.compute_percentile:g} (half-life "
        f"{policy.compute_half_life_s / 3600:g} h) = {need.compute_percentile:.2f} GPU / target "
        f"utilization {policy.target_utilization:g} = {need.compute_need:.3f}; last "
        f"{policy.compute_upsize_confirmations} samples >= {need.recent_compute:.2f} -> "
        f"{need.recent_need:.3f}; memory peak over {policy.memory_window_s / 3600:g} h = "
        f"{need.memory_peak:.3f} of the device + max({policy.memory_margin:g} x peak, "
        f"{policy.memory_min_headroom:g}) = {need.memory_need:.3f}; the larger need rounded up "
        f"to 1/{policy.grid_steps} within [{policy.min_fraction:g}, {policy.max_fraction:g}] "
        f"= {target:g} (was {current:g}); expected utilization after the change: compute "
        f"{need.compute_percentile / target:.0%}, memory {need.memory_peak / target:.0%} of "
        f"the fraction."
    )


def _make_decision(
    sample: UsageSample,
    policy: Policy,
    current: float,
    target: float,
    direction: Direction,
    reason: ReasonCode,
    explanation: str,
) -> FractionDecision:
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
        explanation=explanation[:4000],
        policy_revision=policy.revision,
        mode=policy.mode,
        trigger_sample_id=sample.sample_id,
    )
