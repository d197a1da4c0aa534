"""The fractions as two parts on HAMi's two sums, repacked: what one number per pod costs.

HAMi fits a pod on a GPU by two sums, ``nvidia.com/gpumem`` (or ``gpumem-percentage``) and
``nvidia.com/gpucores``, each at most 100 % per GPU (:mod:`fracpilot_libs.hami.fit`);
fracpilot writes both from one fraction. :func:`two_part_bound` repacks per-pod (memory,
compute) shares in whole percents on those two sums (first-fit-decreasing, see
:func:`~fracpilot_libs.analysis.bin_packing.ffd_cards_2d`) in every slice of the trace
(:func:`~fracpilot_libs.analysis.trace_slices.slices`), so that a memory-heavy, compute-light
pod may share a card with a compute-heavy, memory-light one, which one number per pod forbids.
:func:`engine_parts` says what the engine's two parts are: it sizes them apart and holds only
the larger. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fracpilot_libs.analysis.bin_packing import ffd_cards_2d
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.analysis.trace_slices import slices
from fracpilot_libs.contracts import Policy
from fracpilot_libs.hami.fit import percent
from fracpilot_libs.sizing.engine import clamp_to_policy
from fracpilot_libs.sizing.need import Need

HOUR_S = 3600.0


@dataclass
class TwoPartBound:
    """Card-hours of (memory, compute) shares repacked from scratch at every instant, on
    HAMi's two sums, per FFD order; saved against ``whole_card_hours`` (as
    :class:`~fracpilot_libs.analysis.packing_bound.PackBound`)."""

    whole_card_hours: float = 0.0
    card_hours: dict[str, float] = field(default_factory=dict)  # FFD order -> card-hours
    fraction_hours: float = 0.0  # hours x the larger part, summed (the one-number fractions')

    def saved_pct(self, card_hours: float) -> float:
        if not self.whole_card_hours:
            return 0.0
        return 100.0 * (1.0 - card_hours / self.whole_card_hours)

    def best(self) -> float:
        """The fewest card-hours of the orders tried."""
        return min(self.card_hours.values())


def two_part_bound(
    groups: Mapping[str, list[TracePoint]],
    shares: Mapping[str, Sequence[tuple[float, float]]],
    orders: Sequence[str] = ("max", "sum"),
) -> TwoPartBound:
    """``shares`` maps a workload key to its (memory, compute) share of a card at each of its
    samples; each becomes HAMi's whole percents (rounded up, as fracpilot writes them) and is
    repacked by :func:`ffd_cards_2d` on cards of 100 in every slice. One number per pod is the
    case (f, f), in whole percents."""
    bound = TwoPartBound(card_hours=dict.fromkeys(orders, 0.0))
    for seconds, on in slices(groups):
        hours = seconds / HOUR_S
        held = [shares[k][i] for k, i in on]
        items = [(percent(m), percent(c)) for m, c in held]
        bound.whole_card_hours += hours * len(on)
        bound.fraction_hours += hours * sum(max(m, c) for m, c in items) / 100
        for order in orders:
            bound.card_hours[order] += hours * ffd_cards_2d(items, order, capacity=100)
    return bound


def held_parts(held: float, need: Need, policy: Policy) -> tuple[float, float]:
    """A held fraction as two parts: the part that sized it (the larger of
    :func:`engine_parts`) held at the fraction, the other at its own need, never above the
    fraction. What an engine deciding the two apart would hold if the other part's resizes
    were free (one resize of the fraction sets both)."""
    memory, compute = engine_parts(need, policy)
    if memory >= compute:
        return held, min(held, compute)
    return min(held, memory), held


def engine_parts(need: Need, policy: Policy) -> tuple[float, float]:
    """The engine's memory part and compute part of ``need``, each as the engine would hold it
    alone: on the policy's grid, within its bounds. The engine sizes both and holds only the
    larger (``need_of`` in :mod:`fracpilot_libs.sizing.engine`: ``memory_need`` is the memory
    peak plus the headroom, learned or the policy's; the compute part is the larger of
    ``compute_need`` and ``recent_need``; ``fraction`` is the larger of the two on the grid,
    clamped); so ``max`` of the two parts is ``need.fraction``."""
    compute = max(need.compute_need, need.recent_need)
    return clamp_to_policy(need.memory_need, policy), clamp_to_policy(compute, policy)
