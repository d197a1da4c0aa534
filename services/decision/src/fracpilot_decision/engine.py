"""The decision engine: pure functions from a workload's usage history and a policy to a decision.

No I/O and no clock: time is the sample's timestamp, so the same code runs in the service, in
``fracpilot replay`` and in the tests. See :class:`fracpilot_libs.contracts.Policy` for the
rules; in short, memory first (an overrun is an out-of-memory error), compute second (an
overrun is contention), upsize fast, downsize slowly, and every decision says why.

History per workload is bounded: compute lives in a decaying histogram of 1% buckets (as the
VPA recommender keeps CPU), memory in per-slot peaks over the memory window, plus the last few
samples for upsize confirmation. :func:`dump_state` and :func:`load_state` checkpoint it.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate, chain
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fracpilot_libs.contracts import (
    MIB,
    Direction,
    FractionDecision,
    Policy,
    ReasonCode,
    UsageSample,
)

BUCKETS = 101  # compute histogram: bucket i holds samples in ((i-1)%, i%]
MEMORY_SLOTS = 24  # the memory window is kept as this many per-slot peaks
_MAX_EXPONENT = 40.0  # rescale decaying weights before they grow past 2**40
_EPS = 1e-9


def _empty_histogram() -> array[float]:
    return array("d", bytes(8 * BUCKETS))


_NO_SLOTS: array[float] = array("d")  # shared by every state without memory history (never
# mutated: observe copies before it writes)


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """What the engine remembers of one workload. Times are unix seconds.

    About 2 KiB in memory once the memory window is full (``bench/decision_memory.py``):
    numbers live in flat ``array('d')`` rather than tuples of boxed floats.
    """

    compute_weights: array[float] = field(default_factory=_empty_histogram)
    compute_total: float = 0.0
    compute_ref: float = 0.0  # reference time of the decaying weights
    # Memory peaks per slot, flat: slot start, peak, slot start, peak..., oldest first.
    memory_slots: array[float] = field(default_factory=lambda: _NO_SLOTS)
    recent_compute: tuple[float, ...] = ()  # the last few compute samples, newest last
    memory_over: int = 0  # consecutive samples with memory need above the fraction
    first_seen: float | None = None
    samples: int = 0
    current_fraction: float | None = None  # as last observed or decided
    decided_fraction: float | None = None  # the last fraction this engine asked for
    decided_at: float | None = None
    last_change_at: float | None = None
    below_since: float | None = None  # when the need first fell a full step below
    hold_until: float | None = None  # no downsize before this (after a signal)
    # Where the last sample observed sits in its stream (set by the service, 0 elsewhere): a
    # sample delivered again after a hand-over (at or before it) is not counted twice.
    position: int = 0

    @property
    def memory_peaks(self) -> tuple[tuple[float, float], ...]:
        """(slot start, peak) per memory slot, oldest first."""
        slots = self.memory_slots
        return tuple((slots[i], slots[i + 1]) for i in range(0, len(slots), 2))


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
    return math.ceil(value * steps - _EPS) / steps


def clamp_to_policy(value: float, policy: Policy) -> float:
    on_grid = round_up_to_grid(value, policy.grid_steps)
    return min(policy.max_fraction, max(policy.min_fraction, on_grid))


def bucket_of(compute: float) -> int:
    """The histogram bucket whose upper edge is the smallest whole percent >= compute."""
    return min(BUCKETS - 1, max(0, math.ceil(compute * 100 - _EPS)))


def histogram_percentile(weights: array[float], total: float, pct: float) -> float:
    """The upper edge of the bucket holding the pct-th percentile (0 for an empty histogram)."""
    if total <= 0:
        return 0.0
    index = bisect_left(list(accumulate(weights)), total * pct / 100.0 - total * _EPS)
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


_FIELDS = WorkloadState.__slots__


def _evolve(state: WorkloadState, **changes: Any) -> WorkloadState:
    """``dataclasses.replace`` without its generic overhead (this is the hot path)."""
    return WorkloadState(*[changes[f] if f in changes else getattr(state, f) for f in _FIELDS])


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
    memory_over = state.memory_over + 1 if need.memory_need > current + _EPS else 0
    target = need.fraction
    if not policy.min_fraction - _EPS <= current <= policy.max_fraction + _EPS:
        rule = (
            f"policy bounds: {current:g} is outside [{policy.min_fraction:g}, "
            f"{policy.max_fraction:g}]"
        )
        direction = Direction.UP if target > current else Direction.DOWN
        reason = ReasonCode.POLICY_BOUNDS
        state = _evolve(state, memory_over=memory_over)
    elif target > current + _EPS:
        memory_confirmed = memory_over >= policy.memory_upsize_confirmations
        compute_confirmed = max(need.compute_need, need.recent_need) > current + _EPS
        if not (memory_confirmed or compute_confirmed):
            return _evolve(state, memory_over=memory_over, below_since=None), None
        if memory_confirmed:
            rule = "upsize at once: memory need exceeds the fraction"
        elif need.recent_need > current + _EPS:
            rule = (
                f"upsize: compute exceeded what the fraction holds for "
                f"{policy.compute_upsize_confirmations} samples in a row"
            )
        else:
            rule = "upsize: the compute percentile need exceeds the fraction"
        direction, reason = Direction.UP, need.driver
        state = _evolve(state, memory_over=memory_over, below_since=None)
    elif target <= current - policy.step + _EPS:
        below_since = state.below_since if state.below_since is not None else now
        state = _evolve(state, memory_over=memory_over, below_since=below_since)
        if not _may_downsize(state, policy, now, below_since):
            return state, None
        rule = (
            f"downsize: need stayed a full step below for "
            f"{(now - below_since) / 3600:.1f} h (hold {policy.downsize_hold_s / 3600:g} h)"
        )
        direction, reason = Direction.DOWN, ReasonCode.UNDERUSED
    else:
        return _evolve(state, memory_over=memory_over, below_since=None), None

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
    state = _evolve(state, hold_until=now + policy.signal_hold_s, below_since=None)
    if target <= current + _EPS or _repeats_pending_request(state, target, now, policy):
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
    return _evolve(
        state,
        decided_fraction=target,
        decided_at=now,
        last_change_at=now,
        current_fraction=target,
        below_since=None,
        memory_over=0,
    )


def _repeats_pending_request(
    state: WorkloadState, target: float, now: float, policy: Policy
) -> bool:
    """The actuator may lag: do not repeat the same request within the cooldown."""
    return (
        state.decided_fraction == target
        and state.decided_at is not None
        and now - state.decided_at < policy.cooldown_s
    )


def _may_downsize(state: WorkloadState, policy: Policy, now: float, below_since: float) -> bool:
    if state.first_seen is None or now - state.first_seen < policy.min_history_s:
        return False
    if now - below_since < policy.downsize_hold_s:
        return False
    if state.hold_until is not None and now < state.hold_until:
        return False
    return not (state.last_change_at is not None and now - state.last_change_at < policy.cooldown_s)


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


# --- outlook: what the engine is about to do, for operators (fracpilot status) -----------


class Outlook(StrEnum):
    NO_HISTORY = "no history"
    STABLE = "stable"
    UPSIZING = "upsizing"  # need above the fraction (confirming), or an upsize asked for
    DOWNSIZING = "downsizing"  # a downsize asked for, or due at the next sample
    WAITING_TO_DOWNSIZE = "waiting to downsize"  # need a step lower, a hold not over yet


@dataclass(frozen=True, slots=True)
class EngineOutlook:
    """The engine's view of one workload at an instant, read from its state alone."""

    outlook: Outlook
    current: float  # the fraction the workload holds
    target: float  # the fraction the engine sizes it to with the history so far
    need: Need
    requested: float | None  # a change asked for within the cooldown, not applied yet
    wait_s: float  # waiting to downsize: engine seconds before a downsize may happen
    held_by: str  # what the wait is for: downsize hold, history, signal hold or cooldown


def describe(
    state: WorkloadState, policy: Policy, now: float, current: float | None = None
) -> EngineOutlook:
    """What :func:`decide` would make of this state at ``now`` (unix seconds, engine time:
    the samples' timestamps), given usage like the history's. ``current`` is the fraction the
    workload holds when known better than the state (the allocations bucket)."""
    need = need_of(state, policy)
    held = current if current is not None else state.current_fraction or policy.max_fraction
    requested = None
    if (
        state.decided_fraction is not None
        and state.decided_at is not None
        and now - state.decided_at < policy.cooldown_s
        and abs(state.decided_fraction - held) > _EPS
    ):
        requested = state.decided_fraction
    wait_s, held_by = 0.0, ""
    if state.samples == 0:
        outlook = Outlook.NO_HISTORY
    elif requested is not None:
        outlook = Outlook.UPSIZING if requested > held else Outlook.DOWNSIZING
    elif need.fraction > held + _EPS:
        outlook = Outlook.UPSIZING
    elif need.fraction <= held - policy.step + _EPS:
        # The conditions of _may_downsize, as time left (the latest one decides).
        below = state.below_since if state.below_since is not None else now
        first = state.first_seen if state.first_seen is not None else now
        waits = [
            ("downsize hold", below + policy.downsize_hold_s - now),
            ("history", first + policy.min_history_s - now),
        ]
        if state.hold_until is not None:
            waits.append(("signal hold", state.hold_until - now))
        if state.last_change_at is not None:
            waits.append(("cooldown", state.last_change_at + policy.cooldown_s - now))
        held_by, longest = max(waits, key=lambda w: w[1])
        if longest > 0:
            outlook, wait_s = Outlook.WAITING_TO_DOWNSIZE, longest
        else:
            outlook, held_by = Outlook.DOWNSIZING, ""
    else:
        outlook = Outlook.STABLE
    return EngineOutlook(outlook, held, need.fraction, need, requested, wait_s, held_by)


# --- checkpoints --------------------------------------------------------------------------

_STATE_VERSION = 1


def dump_state(state: WorkloadState) -> bytes:
    """A compact JSON checkpoint of one workload's state (under 2 KiB)."""
    body: dict[str, Any] = {}
    for name in WorkloadState.__slots__:
        if name == "memory_slots":
            body["memory_peaks"] = state.memory_peaks
        else:
            body[name] = getattr(state, name)
    # Exact floats (a rounded weight no longer sums to compute_total), trailing empties dropped.
    weights = state.compute_weights
    last = len(weights)
    while last and weights[last - 1] == 0.0:
        last -= 1
    body["compute_weights"] = weights[:last].tolist()
    body["v"] = _STATE_VERSION
    return json.dumps(body, separators=(",", ":")).encode()


class _Checkpoint(BaseModel):
    """The checkpoint's shape, checked on load: a field missing or of the wrong type fails,
    and so does NaN or an infinity (it would poison every later decision of the workload)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    v: Literal[1]
    compute_weights: list[float] = Field(max_length=BUCKETS)
    compute_total: float = Field(ge=0)
    compute_ref: float
    memory_peaks: list[tuple[float, float]] = Field(max_length=4 * MEMORY_SLOTS)
    recent_compute: list[float] = Field(max_length=20)
    memory_over: int = Field(ge=0)
    first_seen: float | None
    samples: int = Field(ge=0)
    current_fraction: float | None
    decided_fraction: float | None
    decided_at: float | None
    last_change_at: float | None
    below_since: float | None
    hold_until: float | None
    position: int = Field(default=0, ge=0)  # absent from checkpoints written before it


def load_state(data: bytes) -> WorkloadState:
    """Restore a checkpoint written by :func:`dump_state`; raises ValueError if it is not one."""
    try:
        c = _Checkpoint.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"not a decision-engine checkpoint: {exc}") from exc
    # Straight from the validated fields: a restore of 100,000 workloads (or a fleet's
    # ``fracpilot status``) pays for every step here.
    weights = _empty_histogram()
    n = len(c.compute_weights)
    weights[0:n] = array("d", c.compute_weights)
    slots = array("d", chain.from_iterable(c.memory_peaks)) if c.memory_peaks else _NO_SLOTS
    return WorkloadState(
        compute_weights=weights,
        compute_total=c.compute_total,
        compute_ref=c.compute_ref,
        memory_slots=slots,
        recent_compute=tuple(c.recent_compute),
        memory_over=c.memory_over,
        first_seen=c.first_seen,
        samples=c.samples,
        current_fraction=c.current_fraction,
        decided_fraction=c.decided_fraction,
        decided_at=c.decided_at,
        last_change_at=c.last_change_at,
        below_since=c.below_since,
        hold_until=c.hold_until,
        position=c.position,
    )
