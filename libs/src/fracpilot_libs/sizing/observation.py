"""What the engine keeps of a sample: :func:`observe` adds it to a workload's history.

The decayed compute weights, the memory slot peaks (or, for a preallocating LLM server, the
memory its KV cache actually uses: :mod:`fracpilot_libs.sizing.kv_memory`), the peak profile,
the recent samples, the application's queue and the learned headroom. Kept apart from the
rules that read the history (:mod:`fracpilot_libs.sizing.engine`,
:mod:`fracpilot_libs.sizing.hysteresis`): what is recorded changes for other reasons than
when to resize. Pure; time is passed in.
"""

from __future__ import annotations

import math
from array import array

from fracpilot_libs.contracts import MemoryHeadroomMode, Policy, UsageSample
from fracpilot_libs.sizing.grids import EPS, downsize_band
from fracpilot_libs.sizing.headroom import observe_headroom
from fracpilot_libs.sizing.histogram import bucket_of
from fracpilot_libs.sizing.kv_memory import PoolLearning, kv_sizing
from fracpilot_libs.sizing.peak_profile import with_peak
from fracpilot_libs.sizing.state import BUCKETS, MEMORY_SLOTS, WorkloadState

_MAX_EXPONENT = 40.0  # rescale decaying weights before they grow past 2**40
_LEARNED = MemoryHeadroomMode.LEARNED  # a module constant: cheaper than an enum lookup


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


def _learning(state: WorkloadState) -> PoolLearning:
    anchor = state.kv_anchor
    if anchor is None:
        return PoolLearning(bytes_per_token=state.kv_bytes_per_token)
    return PoolLearning(anchor[0], anchor[1], state.kv_bytes_per_token)
