"""What the engine predicts of a workload, for a planner that sizes a card's tenants together.

Where memory is shared (``shared`` isolation) a card planner
(:mod:`fracpilot_libs.placement.card_budget`) divides each GPU among its tenants; it needs,
per workload, its memory peak, how far it may jump above that peak (its *jump statistic*) and
a compute summary (the level that sizes it, and how far it bursts above it). The engine stays
per workload: these pure functions read its state (:mod:`fracpilot_libs.sizing.state`) and
the jump statistic, which the caller keeps beside the state (one number per workload).

The jump statistic is the largest jump of memory in use above the workload's own trailing peak
(over ``memory_window_s``) seen so far. A workload with less than ``warmup`` seconds of history
has not shown its jumps yet: it takes at least the *population prior*, a high quantile of the
jump statistics of the workloads that have (:func:`population_prior`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.headroom import trailing_peak
from fracpilot_libs.sizing.histogram import histogram_percentile
from fracpilot_libs.sizing.state import MEMORY_SLOTS, WorkloadState

BURST_PERCENTILE = 99.5  # the compute a burst reaches, of the decaying histogram
DEFAULT_PRIOR = 0.1  # the jump assumed before any workload has history (memory_min_headroom)


class Forecast(NamedTuple):
    """One workload's predicted need, shares of a card."""

    memory_peak: float  # memory peak over the engine's window
    memory_jump: float  # the jump statistic (with the population prior while warming up)
    compute: float  # the compute level that sizes it
    burst: float  # how far above that level compute reaches (its BURST_PERCENTILE)


def jump_after(
    jump: float, state: WorkloadState, share: float, now: float, policy: Policy
) -> float:
    """The jump statistic after a sample of ``share`` memory at ``now``, from the state as it
    was *before* the engine observed that sample."""
    peak = trailing_peak(state.memory_slots, now, policy)
    if peak is None or share - peak <= jump:
        return jump
    return min(1.0, share - peak)


def peak_profile(state: WorkloadState, now: float, policy: Policy) -> tuple[tuple[int, float], ...]:
    """The workload's memory peak per period of ``memory_window_s / MEMORY_SLOTS`` over the
    window, on the clock all workloads share (period ``k`` is ``[k, k + 1)`` periods since the
    epoch), oldest first. The engine's slots start where the workload's samples fell, so a
    slot's peak counts in both periods it overlaps: the profile never understates."""
    length = policy.memory_window_s / MEMORY_SLOTS
    horizon = now - policy.memory_window_s
    slots = state.memory_slots
    profile: dict[int, float] = {}
    for i in range(0, len(slots), 2):
        start, peak = slots[i], slots[i + 1]
        if start + length <= horizon:
            continue
        first = int(start // length)
        for period in (first, int((start + length) // length)):
            if peak > profile.get(period, -1.0):
                profile[period] = peak
    return tuple(sorted(profile.items()))


def population_prior(jumps: Iterable[float], quantile: float = 0.9) -> float:
    """The jump a workload without history is assumed to make: the ``quantile`` of the jump
    statistics of workloads with history (DEFAULT_PRIOR when there are none)."""
    ranked = sorted(jumps)
    if not ranked:
        return DEFAULT_PRIOR
    return ranked[min(len(ranked) - 1, int(quantile * len(ranked)))]


def forecast_of(
    state: WorkloadState,
    policy: Policy,
    jump: float,
    compute_level: float,
    memory_peak: float | None = None,
) -> Forecast:
    """The workload's forecast: its memory peak over the window (or ``memory_peak`` given),
    its jump statistic, its compute level and its burst above it."""
    slots = state.memory_slots
    peak = memory_peak if memory_peak is not None else (max(slots[1::2]) if slots else 0.0)
    high = histogram_percentile(state.compute_weights, state.compute_total, BURST_PERCENTILE)
    return Forecast(peak, jump, compute_level, max(0.0, high - compute_level))
