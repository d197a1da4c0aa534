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
from itertools import pairwise

from fracpilot_libs.contracts import (
    MIB,
    ComputeSizing,
    Direction,
    FractionDecision,
    MemoryHeadroomMode,
    Policy,
    ReasonCode,
    UsageSample,
)
from fracpilot_libs.sizing.explanations import kv_rule
from fracpilot_libs.sizing.explanations import numbers as _numbers
from fracpilot_libs.sizing.grids import Grid, downsize_band, grid_of
from fracpilot_libs.sizing.headroom import observe_headroom
from fracpilot_libs.sizing.histogram import (
    bucket_of,
    frequent_level,
    histogram_percentile,
    soft_compute_level,
)
from fracpilot_libs.sizing.kv_memory import PoolLearning, kv_sizing
from fracpilot_libs.sizing.need import Need
from fracpilot_libs.sizing.peak_profile import with_peak
from fracpilot_libs.sizing.state import BUCKETS, MEMORY_SLOTS, WorkloadState, evolve

_MAX_EXPONENT = 40.0  # rescale decaying weights before they grow past 2**40
EPS = 1e-9  # float noise: values closer than this are equal
_UP, _DOWN = Direction.UP, Direction.DOWN  # module constants: cheaper than enum lookups
_SOFT = ComputeSizing.SOFT
_LEARNED = MemoryHeadroomMode.LEARNED
_DAY_S = 24 * 3600.0
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


def observe(
    state: WorkloadState,
    sample: UsageSample,
    policy: Policy,
    now: float,
    position: int | None = None,
    memory_prior: float | None = None,
) -> WorkloadState:
    """Add a sample to the history: decayed compute weight, memory slot peak, peak profile,
    recent samples, the application's queue.

    While requests wait (vLLM's queue is non-empty) the workload's compute demand is above the
    fraction it holds, whatever the utilization says: the sample counts in the compute history
    as that fraction plus half the downsize band (by how much more, the queue does not say),
    so the sizing remembers what the queue asked for.

    ``position`` (where the sample sits in its stream) is kept as given; None keeps the last.
    ``memory_prior``: the population's jump, for a learned headroom still warming up
    (:func:`fracpilot_libs.sizing.headroom.learn`).
    """
    current = sample.allocated_fraction or state.current_fraction or policy.max_fraction
    signals = sample.signals
    compute = sample.compute
    if signals is None or signals.waiting_requests is None:
        waiting: tuple[int, ...] = ()
    else:
        waiting = (*state.recent_waiting, signals.waiting_requests)
        waiting = waiting[-(policy.queue_growth_samples + 1) :]
        if signals.waiting_requests > 0:
            compute = max(compute, min(1.0, current + downsize_band(policy) / 2))
    kv_cache = signals.kv_cache_usage if signals is not None else None

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
    bucket = math.ceil(compute * 100 - EPS)  # bucket_of, inlined (compute is within 0..1)
    weights[bucket if 0 <= bucket < BUCKETS else bucket_of(compute)] += weight
    total += weight

    # Memory peaks per slot, keyed by the slot's start time so that a change of window
    # keeps its meaning; a late sample folds into the newest slot, so the history stays
    # bounded whatever order samples arrive in.
    slot_len = policy.memory_window_s / MEMORY_SLOTS
    kv_anchor, kv_bpt, kv_sized, kv_note, kv_source = (
        state.kv_anchor,
        state.kv_bytes_per_token,
        state.kv_sized,
        state.kv_note,
        state.kv_pool_source,
    )
    llm = signals is not None and signals.llm_server is not None
    sized = kv_sizing(sample, _learning(state)) if llm else None
    if sized is None:
        share = sample.memory_share
    else:  # a preallocating LLM server: fixed part + used KV (at least its minimum pool)
        kv_need, learning = sized
        share = kv_need.need_bytes / sample.memory_total_bytes
        if learning.anchor_tokens is not None and learning.anchor_memory is not None:
            kv_anchor = (float(learning.anchor_tokens), float(learning.anchor_memory))
        kv_bpt, kv_note = learning.bytes_per_token, kv_need.reason[:300]
        kv_source = kv_need.pool_source
        kv_sized = None
        if kv_need.fixed_bytes is not None and kv_need.pool_bytes is not None:
            low = kv_need.min_pool_bytes
            kv_sized = (
                float(kv_need.fixed_bytes),
                float(kv_need.pool_bytes),
                -1.0 if low is None else float(low),
            )
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

    # The peak per period of the clock all workloads share (sizing/peak_profile.py, for the
    # card planner; a period is a memory slot), of the memory in use, as the replay keeps it.
    profile = with_peak(state.memory_profile, sample.memory_share, now, slot_len)

    jump, learned = state.memory_jump, None  # the learned headroom (sizing/headroom.py)
    if policy.memory_headroom.mode is _LEARNED:  # from the slots before this sample's
        oom = signals is not None and signals.oom_event
        jump, learned = observe_headroom(state, share, current, oom, now, policy, memory_prior)
    keep = policy.compute_upsize_confirmations
    recent = (*state.recent_compute, compute)[-keep:]
    # Positional, in WorkloadState's field order (keywords cost a third more, on every sample;
    # test_observe_keeps_every_field_it_does_not_update checks the order).
    return WorkloadState(
        weights,
        total,
        ref,
        slots,
        recent,
        state.memory_over,
        state.first_seen if state.first_seen is not None else now,
        state.samples + 1,
        current,
        state.decided_fraction,
        state.decided_at,
        state.last_change_at,
        state.below_since,
        state.hold_until,
        state.position if position is None else position,
        waiting,
        kv_cache,
        jump,
        learned,
        state.resize_times,
        profile,
        kv_anchor,
        kv_bpt,
        kv_sized,
        kv_note,
        kv_source,
    )


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


def _learning(state: WorkloadState) -> PoolLearning:
    anchor = state.kv_anchor
    if anchor is None:
        return PoolLearning(bytes_per_token=state.kv_bytes_per_token)
    return PoolLearning(anchor[0], anchor[1], state.kv_bytes_per_token)


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


def queue_growing(state: WorkloadState, policy: Policy) -> bool:
    """The application's queue grew over the last ``queue_growth_samples`` samples: never
    shorter from one to the next, and longer at the end."""
    w = state.recent_waiting
    if len(w) <= policy.queue_growth_samples or w[-1] <= w[0]:
        return False
    return all(a <= b for a, b in pairwise(w))


def queue_busy(state: WorkloadState, policy: Policy) -> bool:
    """Requests wait (vLLM's queue is non-empty) or the KV cache is nearly full: the
    application is short of the GPU now, whatever the utilization says."""
    waiting = state.recent_waiting
    kv = state.kv_cache_usage
    return bool(waiting and waiting[-1] > 0) or (kv is not None and kv >= policy.kv_cache_busy)


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
        if not _may_downsize(state, policy, now, below_since):
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

    if _repeats_pending_request(state, target, now, policy):
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
    if target <= current + EPS or _repeats_pending_request(state, target, now, policy):
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
    if target <= current + EPS or _repeats_pending_request(state, target, now, policy):
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


def within_resize_budget(state: WorkloadState, policy: Policy, now: float) -> bool:
    """Whether one more resize keeps the workload within ``resize_budget_per_day`` over the
    last 24 h (always, without a budget)."""
    budget = policy.resize_budget_per_day
    if budget is None:
        return True
    recent = sum(1 for t in state.resize_times if now - t < _DAY_S)
    return recent + 1 <= budget + EPS


def _after_change(state: WorkloadState, target: float, now: float) -> WorkloadState:
    # Every change is remembered for a day, whatever the budget: a budget set later counts it.
    times = (*(t for t in state.resize_times if now - t < _DAY_S), now)
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


def sizing_direction(target: float, current: float, policy: Policy) -> Direction | None:
    """Which way a workload holding ``current`` should move to ``target``: up when the target is
    above it, down only when ``downsize_band`` (and a grid step) below, else None (stay)."""
    if target > current + EPS:
        return _UP
    if target <= current - downsize_band(policy) + EPS:
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
    if state.first_seen is None or queue_busy(state, policy):
        return False
    return downsize_wait(state, policy, now, below_since)[1] <= 0


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
