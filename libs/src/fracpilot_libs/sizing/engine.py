"""The decision engine: pure functions from a workload's usage history and a policy to a decision.

No I/O and no clock: time is the sample's timestamp, so the same code runs in the service, in
``fracpilot replay`` and in the tests. See :class:`fracpilot_libs.contracts.Policy` for the
rules; in short, memory first (an overrun is an out-of-memory error), compute second (an
overrun is contention), upsize fast, downsize slowly, and every decision says why.

:func:`~fracpilot_libs.sizing.observation.observe` adds a sample to the history
(:mod:`fracpilot_libs.sizing.state`), :func:`need_of` sizes the workload from it, :func:`decide`
does both and says whether the fraction should change, by the timing rules of
:mod:`fracpilot_libs.sizing.hysteresis`; :mod:`fracpilot_libs.sizing.outlook` reads the same
rules for operators.
"""

from __future__ import annotations

import hashlib
import math

from fracpilot_libs.contracts import (
    MIB,
    ComputeSizing,
    Direction,
    FractionDecision,
    Policy,
    ReasonCode,
    UsageSample,
)
from fracpilot_libs.sizing.explanations import kv_rule
from fracpilot_libs.sizing.explanations import numbers as _numbers
from fracpilot_libs.sizing.grids import EPS, Grid, downsize_band, grid_of
from fracpilot_libs.sizing.histogram import (
    bucket_of,
    frequent_level,
    histogram_percentile,
    soft_compute_level,
)
from fracpilot_libs.sizing.hysteresis import (
    DAY_S,
    may_downsize,
    queue_growing,
    repeats_pending_request,
    sizing_direction,
    within_resize_budget,
)
from fracpilot_libs.sizing.need import Need
from fracpilot_libs.sizing.observation import observe
from fracpilot_libs.sizing.state import WorkloadState, evolve

_UP, _DOWN = Direction.UP, Direction.DOWN  # module constants: cheaper than enum lookups
_SOFT = ComputeSizing.SOFT
# Soft sizing leaves rare bursts out: compute above a level on fewer than this share of the
# samples (decayed weight, as the histogram counts them; of at least RARE_BURST_SAMPLES) neither
# upsizes on the soft level alone nor holds a downsize up. A lone spike can carry more than the
# delay budget of a low, steady load's work, so the level rose and decayed with each one: a
# workload with rare spikes resized up to 6 times a day (issue 25). Sustained compute, memory
# and the application's signals upsize as before.
RARE_BURST_SHARE = 0.03
RARE_BURST_SAMPLES = 100  # a younger history judges rarity as if it had this many samples


def round_up_to_grid(value: float, steps: int) -> float:
    # The tolerance keeps 0.375000001 (float noise) on 0.375 instead of 0.5.
    return math.ceil(value * steps - EPS) / steps


def clamp_to_policy(value: float, policy: Policy, grid: Grid | None = None) -> float:
    """``value`` rounded up to the policy's grid, within its bounds (which are on the grid)."""
    on_grid = (grid or grid_of(policy)).round_up(value)
    return min(policy.max_fraction, max(policy.min_fraction, on_grid))


def memory_need_of(peak: float, policy: Policy) -> float:
    return peak + max(peak * policy.memory_margin, policy.memory_min_headroom)


def _kv_words(state: WorkloadState, sample: UsageSample, need: Need) -> str:
    if not state.kv_note:
        return ""
    return kv_rule(
        state.kv_sized,
        state.kv_note,
        sample.memory_total_bytes,
        need.memory_peak,
        state.kv_pool_source,
    )


def need_of(state: WorkloadState, policy: Policy) -> Need:
    full = len(state.recent_compute) >= policy.compute_upsize_confirmations
    recent = min(state.recent_compute) if full and state.recent_compute else 0.0
    if policy.compute_sizing is _SOFT:
        level = soft_compute_level(state.compute_weights, policy.compute_delay_budget)
        c_need, r_need = level, recent
    else:
        tu = policy.target_utilization
        level = histogram_percentile(
            state.compute_weights, state.compute_total, policy.compute_percentile
        )
        c_need, r_need = level / tu, recent / tu
    slots = state.memory_slots
    peak = max(slots[1::2]) if slots else 0.0
    # memory_need_of and clamp_to_policy inlined, and conditionals for two-way max and min:
    # this runs on every sample. A learned headroom (sizing/headroom.py) replaces the rule.
    headroom = state.memory_headroom
    if headroom is None:
        margin, headroom = peak * policy.memory_margin, policy.memory_min_headroom
        headroom = margin if margin > headroom else headroom
    m_need = peak + headroom
    raw = c_need if c_need > r_need else r_need
    on_grid = grid_of(policy).round_up(m_need if m_need > raw else raw)
    low, high = policy.min_fraction, policy.max_fraction
    fraction = high if on_grid > high else (low if on_grid < low else on_grid)
    return Need(level, c_need, recent, r_need, peak, m_need, fraction)


def _rare_weight(state: WorkloadState) -> float:
    """The most compute weight that is still rare (RARE_BURST_SHARE of the history, judged as
    if it had at least RARE_BURST_SAMPLES samples)."""
    young = RARE_BURST_SAMPLES / state.samples if state.samples else 1.0
    return RARE_BURST_SHARE * state.compute_total * (young if young > 1.0 else 1.0)


def rare_bursts_above(state: WorkloadState, policy: Policy, current: float) -> bool:
    """Soft sizing: the compute history above ``current`` is rare bursts (see
    RARE_BURST_SHARE), so an upsize on the soft level alone waits (False in percentile mode,
    whose percentile already leaves rare samples out)."""
    if policy.compute_sizing is not _SOFT:
        return False
    return sum(state.compute_weights[bucket_of(current) + 1 :]) < _rare_weight(state)


def _without_rare_bursts(state: WorkloadState, need: Need, policy: Policy) -> float:
    """The fraction the need calls for with the soft level lowered to the rare bursts' foot:
    where a downsize goes."""
    level = min(need.compute_need, frequent_level(state.compute_weights, _rare_weight(state)))
    return clamp_to_policy(max(level, need.recent_need, need.memory_need), policy)


def _level_step(policy: Policy) -> float:
    """One histogram bucket, as a need: the compute level moves in such steps as its
    percentile crosses a bucket edge from one sample to the next. An upsize on the level alone
    waits for more than one step above the fraction, so that a stationary workload whose need
    sits on a grid edge is not downsized and upsized again a few minutes later (the samples in
    a row above the fraction still upsize at once)."""
    step = 1.0 / 100
    return step / policy.target_utilization if policy.compute_sizing is not _SOFT else step


def compute_level_upsizes(state: WorkloadState, need: Need, policy: Policy, current: float) -> bool:
    """The compute level alone calls for an upsize: more than one level step above the
    fraction, and not over rare bursts only (which soft sizing leaves out)."""
    return need.compute_need > current + _level_step(policy) and not rare_bursts_above(
        state, policy, current
    )


def upsize_target(need: Need, policy: Policy) -> float:
    """Where an upsize goes: half ``downsize_min_change`` above the need, so that a need
    creeping up (a memory peak, a busier day) does not resize at every step of a fine grid,
    and a downsize needs the need to fall well below where it was."""
    raw = max(need.compute_need, need.recent_need, need.memory_need)
    return clamp_to_policy(raw + policy.downsize_min_change / 2, policy)


def decision_id(sample: UsageSample, new_fraction: float) -> str:
    """Deterministic, so a redelivered sample yields the same id and is applied once."""
    digest = hashlib.sha256(f"{sample.workload.key}|{sample.sample_id}|{new_fraction}".encode())
    return digest.hexdigest()[:32]


def decide(
    state: WorkloadState,
    sample: UsageSample,
    policy: Policy,
    position: int | None = None,
    memory_prior: float | None = None,
) -> tuple[WorkloadState, FractionDecision | None]:
    """Observe the sample, then decide whether the workload's fraction should change.

    ``position``: where the sample sits in its stream, kept in the state (see
    :attr:`WorkloadState.position`); None keeps the state's. ``memory_prior``: see
    :func:`observe`.
    """
    now = sample.timestamp.timestamp()
    state = observe(state, sample, policy, now, position, memory_prior)
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
    elif moving is _UP and (
        memory_over >= policy.memory_upsize_confirmations
        or need.recent_need > current + EPS
        or compute_level_upsizes(state, need, policy, current)
    ):
        if memory_over >= policy.memory_upsize_confirmations:
            rule = "upsize at once: memory need exceeds the fraction"
        elif need.recent_need > current + EPS:
            rule = (
                f"upsize: compute exceeded what the fraction holds for "
                f"{policy.compute_upsize_confirmations} samples in a row"
            )
        elif policy.compute_sizing is _SOFT:
            rule = (
                f"upsize: more than {policy.compute_delay_budget:.1%} of the compute work lies "
                f"above the fraction, on at least {RARE_BURST_SHARE:.0%} of the samples"
            )
        else:
            rule = "upsize: the compute percentile need exceeds the fraction"
        direction, reason = Direction.UP, need.driver
        target = upsize_target(need, policy)
        state = evolve(state, memory_over=memory_over, below_since=None)
    elif state.recent_waiting and queue_growing(state, policy):
        return _on_queue(state, sample, policy, now, current, need, memory_over)
    elif moving is _UP:
        return _settled(state, memory_over), None
    elif moving is _DOWN:
        below_since = state.below_since if state.below_since is not None else now
        if state.memory_over != memory_over or state.below_since != below_since:
            state = evolve(state, memory_over=memory_over, below_since=below_since)
        if not may_downsize(state, policy, now, below_since):
            return state, None
        rule = (
            f"downsize: need stayed {downsize_band(policy):g} or more below for "
            f"{(now - below_since) / 3600:.1f} h (hold {policy.downsize_hold_s / 3600:g} h)"
        )
        direction, reason = Direction.DOWN, ReasonCode.UNDERUSED
        if policy.compute_sizing is _SOFT:  # rare bursts do not hold the fraction up
            target = min(target, _without_rare_bursts(state, need, policy))
    else:
        return _settled(state, memory_over), None

    if repeats_pending_request(state, target, now, policy):
        return state, None
    # Memory first: an upsize for memory (and a return within the policy's bounds) is never
    # withheld by the resize budget, but it counts.
    memory_first = direction is _UP and memory_over >= policy.memory_upsize_confirmations
    if (
        not memory_first
        and reason is not ReasonCode.POLICY_BOUNDS
        and not within_resize_budget(state, policy, now)
    ):
        return state, None
    decision = _make_decision(
        sample,
        policy,
        current,
        target,
        direction,
        reason,
        f"{rule}. {_numbers(need, policy, current, target, _kv_words(state, sample, need))}",
        need,
    )
    return _after_change(state, target, now), decision


def _on_signal(
    state: WorkloadState, sample: UsageSample, policy: Policy, now: float, current: float
) -> tuple[WorkloadState, FractionDecision | None]:
    signals = sample.signals
    assert signals is not None
    kind = ReasonCode.OOM_SIGNAL if signals.oom_event else ReasonCode.CONTENTION_SIGNAL
    band = downsize_band(policy)
    bump = max(current * policy.signal_multiplier, current + band)
    need = need_of(state, policy)
    target = clamp_to_policy(max(bump, need.fraction), policy)
    state = evolve(state, hold_until=now + policy.signal_hold_s, below_since=None)
    if target <= current + EPS or repeats_pending_request(state, target, now, policy):
        return state, None
    if kind is not ReasonCode.OOM_SIGNAL and not within_resize_budget(state, policy, now):
        return state, None
    event = "out-of-memory" if kind is ReasonCode.OOM_SIGNAL else "contention"
    explanation = (
        f"upsize at once on an {event} event: {current:g} x {policy.signal_multiplier:g} "
        f"or {current:g} + {band:g}, whichever is larger, and at least the need "
        f"({need.fraction:g}) = {target:g}; held for {policy.signal_hold_s / 3600:g} h before "
        f"any downsize. {_numbers(need, policy, current, target, _kv_words(state, sample, need))}"
    )
    decision = _make_decision(sample, policy, current, target, _UP, kind, explanation, need)
    return _after_change(state, target, now), decision


def _on_queue(
    state: WorkloadState,
    sample: UsageSample,
    policy: Policy,
    now: float,
    current: float,
    need: Need,
    memory_over: int,
) -> tuple[WorkloadState, FractionDecision | None]:
    """The application's queue grew: one step up, whatever the utilization says (a fraction
    that caps compute, or requests waiting on the KV cache, can look idle to the GPU)."""
    band = downsize_band(policy)
    target = clamp_to_policy(max(current + band, need.fraction), policy)
    waiting = state.recent_waiting
    # Growth counted from here on: the next step needs as many samples of growth again.
    state = evolve(
        state,
        memory_over=memory_over,
        below_since=None,
        recent_waiting=waiting[-1:],
        hold_until=now + policy.signal_hold_s,
    )
    if target <= current + EPS or repeats_pending_request(state, target, now, policy):
        return state, None
    if not within_resize_budget(state, policy, now):
        return state, None
    explanation = (
        f"upsize: the application's queue grew from {waiting[0]} to {waiting[-1]} waiting "
        f"requests over {len(waiting) - 1} samples while compute was {sample.compute:.2f} of "
        f"a GPU: {current:g} + {band:g}, and at least the need ({need.fraction:g}) = "
        f"{target:g}; held for {policy.signal_hold_s / 3600:g} h, and no downsize while requests "
        f"wait. {_numbers(need, policy, current, target, _kv_words(state, sample, need))}"
    )
    decision = _make_decision(
        sample, policy, current, target, _UP, ReasonCode.QUEUE_GROWING, explanation, need
    )
    return _after_change(state, target, now), decision


def _settled(state: WorkloadState, memory_over: int) -> WorkloadState:
    """No change due: the memory count kept, the downsize wait reset (the state as it is when
    both are already so: most samples, and a copy saved)."""
    if state.memory_over == memory_over and state.below_since is None:
        return state
    return evolve(state, memory_over=memory_over, below_since=None)


def _after_change(state: WorkloadState, target: float, now: float) -> WorkloadState:
    # Every change is remembered for a day, whatever the budget: a budget set later counts it.
    times = (*(t for t in state.resize_times if now - t < DAY_S), now)
    return evolve(
        state,
        resize_times=times,
        decided_fraction=target,
        decided_at=now,
        last_change_at=now,
        current_fraction=target,
        below_since=None,
        memory_over=0,
    )


def _make_decision(
    sample: UsageSample,
    policy: Policy,
    current: float,
    target: float,
    direction: Direction,
    reason: ReasonCode,
    explanation: str,
    need: Need,
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
        memory_need_mib=math.ceil(need.memory_need * (total / MIB) - EPS),  # the memory floor
        enforcement=policy.enforcement,
    )
