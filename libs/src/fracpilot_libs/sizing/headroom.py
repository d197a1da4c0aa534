"""Per-workload memory headroom learned online (``memory_headroom: {mode: learned}``).

The uniform rule gives every workload the same headroom above its memory peak, and that one
headroom must cover the largest jump of the jumpiest workload. The learned rule gives each
workload its own: ``factor`` times the largest jump above its own trailing peak (over
``memory_window_s``) it has shown so far, within ``[floor, cap]`` (the settings are
``Policy.memory_headroom``, a :class:`~fracpilot_libs.contracts.MemoryHeadroom`). Until the
workload has ``warmup`` seconds of history it keeps the uniform headroom (a conservative
start). Memory first: an overrun (an out-of-memory signal, or memory in use above the fraction
held) raises the learned jump at once to at least the headroom that failed plus the floor, so
the next headroom is larger by the floor or reaches the cap. Given a *population prior* (the
jump statistics of the other workloads, :func:`fracpilot_libs.sizing.forecast.population_prior`)
a workload warming up takes ``factor`` x the larger of its own jump and the prior instead.

State: two numbers in :class:`~fracpilot_libs.sizing.state.WorkloadState`, ``memory_jump``
(the largest jump so far) and ``memory_headroom`` (the learned headroom; None while the uniform
rule applies), checkpointed with the rest of the workload's history.
"""

from __future__ import annotations

from collections.abc import Sequence

from fracpilot_libs.contracts import MemoryHeadroomMode, Policy
from fracpilot_libs.sizing.state import MEMORY_SLOTS, WorkloadState

EPS = 1e-9
_LEARNED = MemoryHeadroomMode.LEARNED


def uniform_headroom(peak: float, policy: Policy) -> float:
    """The uniform rule: the larger of ``memory_margin`` x peak and ``memory_min_headroom``."""
    return max(peak * policy.memory_margin, policy.memory_min_headroom)


def learned_headroom(jump: float, policy: Policy) -> float:
    """``factor`` x the largest jump, within the floor and the cap."""
    rule = policy.memory_headroom
    return min(rule.cap, max(rule.floor, jump * rule.factor))


def trailing_peak(slots: Sequence[float], now: float, policy: Policy) -> float | None:
    """The memory peak over the window before ``now`` from the state's flat (slot start, peak)
    slots; None without history."""
    slot_len = policy.memory_window_s / MEMORY_SLOTS
    horizon = now - policy.memory_window_s
    peaks = [slots[i + 1] for i in range(0, len(slots), 2) if slots[i] + slot_len > horizon]
    return max(peaks) if peaks else None


def learn(
    jump: float,
    headroom: float | None,
    share: float,
    peak: float | None,
    held: float,
    oom: bool,
    history_s: float,
    policy: Policy,
    prior: float | None = None,
) -> tuple[float, float | None]:
    """The learned jump and headroom after one sample.

    ``jump``, ``headroom``: as learned before the sample (headroom None: the uniform rule was
    in force); ``share``: memory in use (share of the device); ``peak``: the trailing peak
    before this sample (None: none yet); ``held``: the fraction held; ``oom``: an
    out-of-memory signal; ``history_s``: how long the workload has been observed; ``prior``:
    the population's jump (:func:`fracpilot_libs.sizing.forecast.population_prior`), which a
    workload still warming up learns from instead of the uniform rule (None: no population).
    """
    if peak is not None and share - peak > jump:
        jump = share - peak
    if oom or share > held + EPS:
        # The headroom in force failed: learn at least it plus the floor (memory first).
        in_force = headroom if headroom is not None else uniform_headroom(peak or 0.0, policy)
        jump = max(jump, in_force + policy.memory_headroom.floor)
    jump = min(jump, 1.0)
    if history_s < policy.memory_headroom.warmup:
        if prior is None:
            return jump, None
        return jump, learned_headroom(max(jump, prior), policy)
    return jump, learned_headroom(jump, policy)


def headroom_rule(policy: Policy) -> str:
    """How the memory headroom is chosen, for a decision's explanation."""
    rule = policy.memory_headroom
    if rule.mode is _LEARNED:
        return (
            f"learned headroom ({rule.factor:g} x the largest jump above its peak, within "
            f"[{rule.floor:g}, {rule.cap:g}]; for the first {rule.warmup / 3600:g} h the "
            "population's prior where there is one, else uniform)"
        )
    return f"max({policy.memory_margin:g} x peak, {policy.memory_min_headroom:g})"


def observe_headroom(
    state: WorkloadState,
    share: float,
    held: float,
    oom: bool,
    now: float,
    policy: Policy,
    prior: float | None = None,
) -> tuple[float, float | None]:
    """:func:`learn` from one sample, before the engine adds it to ``state``'s memory slots."""
    peak = trailing_peak(state.memory_slots, now, policy)
    history = now - state.first_seen if state.first_seen is not None else 0.0
    return learn(
        state.memory_jump, state.memory_headroom, share, peak, held, oom, history, policy, prior
    )
