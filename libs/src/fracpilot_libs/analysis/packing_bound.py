"""Bounds on the cards a trace needs when every pod holds a hard memory reservation.

The packed replay (:mod:`fracpilot_libs.analysis.packing_replay`) counts the cards an online
sizer and the actuator's planner use. This module asks what no sizer and no planner can beat,
so that a missed card-hours target can be told apart from an impossible one. Every figure
repacks the workloads *from scratch at every instant* (moves are free and unlimited) with
first-fit-decreasing (FFD), each workload on at most one card, reserving per workload:

- **actual**: the memory it uses at that instant (and, in the same FFD, its compute: a card
  serves at most 1.0 of both). No pod can hold less memory than it uses without an
  out-of-memory error, so no sizer with a hard per-pod memory limit does better. FFD is a
  packing, not the optimum; :func:`lower_bound_cards` (Martello and Toth's L2 bound) of the
  memory alone is a count no packing goes below, so the saving of **actual_lower** is an upper
  bound on any such policy's card-hours saved, and the two meeting shows FFD is optimal there.
- **static peak + h**: its whole-trace memory peak plus ``h`` of the card, held throughout
  (a clairvoyant static sizing: the smallest reservation with no overrun, then headroom ``h``).
- **fractions** (optional): the fractions a replay held, repacked: how much of the gap between
  the packed replay and the bounds is the planner's (incremental, few moves) and how much the
  fractions'.
- **clairvoyant, few resizes**: per pod, a reservation that never falls below the memory in
  use (no overrun at all), changed at most ``resizes_per_day`` times per day of the pod (at
  quarter-hour boundaries), the one with the fewest reservation-hours (exact, by dynamic
  programming over the boundaries). It knows the future, so it is no policy to run; it says
  what hard per-pod memory allows under the resize limit.
- **window peak + hindsight headroom** (per window W): an *online* memory rule, the peak of
  the pod's own samples over the last W plus a headroom, rounded up to hundredths (whole card
  for the first ``warmup_s``, as the engine starts at a whole GPU), with each pod's headroom
  chosen *in hindsight*: the smallest that overruns only on the samples of an overrun budget,
  the budget handed out greedily (each overrun sample to the pod whose headroom it lowers by
  the most card-hours). Resizes are free and unlimited. The engine's memory rule is this
  rule with W = ``memory_window_s`` and one headroom for all, known in advance; so what this
  saves at the engine's window is more than the engine can (up to FFD and the greedy budget).
  With ``uniform``, one headroom for every pod (the smallest that keeps the overruns within
  the budget), as the engine has: the best its memory rule could do with free moves and
  unlimited resizes.

Shared isolation (a pod may use more memory than its fraction; what fails is the card):

- **shared window peak + pooled headroom** (per window W and headroom H): each pod reserves the
  peak of its own samples over the last W, no headroom of its own (whole card for the first
  ``warmup_s``), and every card keeps one pooled headroom H free (FFD into cards of 1 - H).
  Safety is per card: a **card-level collision** is a card-sample (a card of the packing in a
  slice) whose pods use more memory than the card. Per W, the smallest H of the grid within
  the collision budget (``shared_collision_pct`` of card-samples) is the line's figure.

Two parts (HAMi), one number per pod against two: :mod:`fracpilot_libs.analysis.two_part_bound`.
The packings are :mod:`fracpilot_libs.analysis.bin_packing`'s, the per-pod reservations
:mod:`fracpilot_libs.analysis.reservation_rules`'.

Time is cut at every sample boundary (:mod:`fracpilot_libs.analysis.trace_slices`: each
sample stands for the interval of :func:`~fracpilot_libs.analysis.accounting.sample_intervals`,
as in the packed account): card-hours and whole-card-hours are summed over those slices, so
``whole_card_hours`` equals the packed account's. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.bin_packing import (
    EPS,
    ffd_bins,
    ffd_cards,
    ffd_cards_2d,
    lower_bound_cards,
)
from fracpilot_libs.analysis.reservation_rules import (
    CLAIRVOYANT_STEP_S,
    DEFAULT_OVERRUN_BUDGET,
    DEFAULT_WARMUP_S,
    WindowRule,
    clairvoyant_reservations,
    past_peaks,
    reservations_at,
    window_reservations,
)
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.analysis.trace_slices import Slice, slices
from fracpilot_libs.analysis.two_part_bound import (
    TwoPartBound,
    engine_parts,
    held_parts,
    two_part_bound,
)

# the packings, the reservation rules, the slices and the two-part bound have modules of their
# own; the names callers import from here stay importable
__all__ = [
    "CLAIRVOYANT_STEP_S",
    "DEFAULT_HEADROOMS",
    "DEFAULT_OVERRUN_BUDGET",
    "DEFAULT_RESIZES_PER_DAY",
    "DEFAULT_WARMUP_S",
    "DEFAULT_WINDOWS_S",
    "EPS",
    "SHARED_COLLISION_PCT",
    "SHARED_HEADROOMS",
    "SHARED_WINDOWS_S",
    "PackBound",
    "SharedRule",
    "Slice",
    "TwoPartBound",
    "WindowRule",
    "clairvoyant_reservations",
    "engine_parts",
    "ffd_bins",
    "ffd_cards",
    "ffd_cards_2d",
    "held_fractions",
    "held_parts",
    "lower_bound_cards",
    "pack_bound",
    "past_peaks",
    "slices",
    "two_part_bound",
    "window_reservations",
]

HOUR_S = 3600.0
DEFAULT_HEADROOMS = (0.0, 0.02, 0.03, 0.05, 0.1)
DEFAULT_WINDOWS_S = (3600.0, 2 * 3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0)  # 24 h: the engine's
DEFAULT_RESIZES_PER_DAY = 4.0
SHARED_WINDOWS_S = (3600.0, 4 * 3600.0, 24 * 3600.0)
SHARED_HEADROOMS = (0.0, 0.02, 0.05, 0.1, 0.15)
SHARED_COLLISION_PCT = 0.01  # of card-samples: the shared mode's memory safety limit


@dataclass
class SharedRule:
    """What the shared window peak + pooled headroom rule packed, and its collisions."""

    window_s: float
    headroom: float
    card_hours: float = 0.0
    card_samples: int = 0
    collision_card_samples: int = 0

    @property
    def collision_pct(self) -> float:
        return 100.0 * self.collision_card_samples / self.card_samples if self.card_samples else 0.0


@dataclass
class PackBound:
    """Card-hours of each repacking; saved against ``whole_card_hours``."""

    whole_card_hours: float = 0.0
    actual: float = 0.0  # FFD of memory and compute in use
    actual_lower: float = 0.0  # L2 of memory in use: no packing goes below
    static_peak: dict[float, float] = field(default_factory=dict)  # headroom -> card-hours
    fractions: float | None = None
    # fraction-hours (by the fractions held) above 1/2 of a card: those cannot share a card
    # with another such pod
    fraction_hours_over_half: float | None = None
    fraction_hours: float | None = None
    # the fractions as two parts on HAMi's sums (memory, cores): see two_part_bound
    fractions_two_part: float | None = None
    clairvoyant: float = 0.0  # card-hours of the clairvoyant few-resize reservations
    clairvoyant_fraction_hours: float = 0.0
    # window (s) -> the window peak + hindsight headroom rule's result, per pod and uniform
    window_peak: dict[float, WindowRule] = field(default_factory=dict)
    window_uniform: dict[float, WindowRule] = field(default_factory=dict)
    # (window s, pooled headroom) -> the shared rule's result (card-level collisions)
    shared: dict[tuple[float, float], SharedRule] = field(default_factory=dict)

    def shared_chosen(self, collision_pct: float = SHARED_COLLISION_PCT) -> dict[float, SharedRule]:
        """Per window, the shared rule with the smallest pooled headroom within the collision
        budget (the largest headroom tried when none is)."""
        out: dict[float, SharedRule] = {}
        for (window, _), rule in sorted(self.shared.items()):
            if window in out and out[window].collision_pct <= collision_pct:
                continue
            out[window] = rule
        return out

    def saved_pct(self, card_hours: float) -> float:
        if not self.whole_card_hours:
            return 0.0
        return 100.0 * (1.0 - card_hours / self.whole_card_hours)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "whole_card_hours": round(self.whole_card_hours, 4),
            "actual_card_hours": round(self.actual, 4),
            "actual_saved_pct": round(self.saved_pct(self.actual), 3),
            "actual_lower_card_hours": round(self.actual_lower, 4),
            "actual_saved_pct_at_most": round(self.saved_pct(self.actual_lower), 3),
            "static_peak": [
                {
                    "headroom": h,
                    "card_hours": round(c, 4),
                    "saved_pct": round(self.saved_pct(c), 3),
                }
                for h, c in sorted(self.static_peak.items())
            ],
        }
        out["clairvoyant_card_hours"] = round(self.clairvoyant, 4)
        out["clairvoyant_saved_pct"] = round(self.saved_pct(self.clairvoyant), 3)
        out["window_peak"] = [
            {
                "window_h": w / HOUR_S,
                "memory_overrun_samples": r.overrun_samples,
                "card_hours": round(r.card_hours, 4),
                "saved_pct": round(self.saved_pct(r.card_hours), 3),
                "fraction_hours_saved_pct": round(self.saved_pct(r.fraction_hours), 3),
            }
            for w, r in sorted(self.window_peak.items())
        ]
        out["window_uniform"] = [
            {
                "window_h": w / HOUR_S,
                "headroom": round(next(iter(r.headroom.values()), 0.0), 4),
                "memory_overrun_samples": r.overrun_samples,
                "card_hours": round(r.card_hours, 4),
                "saved_pct": round(self.saved_pct(r.card_hours), 3),
                "fraction_hours_saved_pct": round(self.saved_pct(r.fraction_hours), 3),
            }
            for w, r in sorted(self.window_uniform.items())
        ]
        chosen = self.shared_chosen()
        out["shared_window_pooled"] = [
            {
                "window_h": r.window_s / HOUR_S,
                "pooled_headroom": r.headroom,
                "card_samples": r.card_samples,
                "memory_collision_card_samples": r.collision_card_samples,
                "memory_collision_pct": round(r.collision_pct, 4),
                "card_hours": round(r.card_hours, 4),
                "saved_pct": round(self.saved_pct(r.card_hours), 3),
                "chosen": chosen.get(r.window_s) is r,
            }
            for _, r in sorted(self.shared.items())
        ]
        if self.fractions is not None:
            out["fractions_card_hours"] = round(self.fractions, 4)
            out["fractions_saved_pct"] = round(self.saved_pct(self.fractions), 3)
        if self.fractions_two_part is not None:
            out["fractions_two_part_card_hours"] = round(self.fractions_two_part, 4)
            out["fractions_two_part_saved_pct"] = round(self.saved_pct(self.fractions_two_part), 3)
        if self.fraction_hours and self.fraction_hours_over_half is not None:
            share = 100.0 * self.fraction_hours_over_half / self.fraction_hours
            out["fraction_hours_over_half_pct"] = round(share, 3)
        return out


def pack_bound(
    groups: Mapping[str, list[TracePoint]],
    headrooms: Sequence[float] = DEFAULT_HEADROOMS,
    fractions: Mapping[str, Sequence[float]] | None = None,
    windows_s: Sequence[float] = DEFAULT_WINDOWS_S,
    overrun_budget: int = DEFAULT_OVERRUN_BUDGET,
    warmup_s: float = DEFAULT_WARMUP_S,
    resizes_per_day: float = DEFAULT_RESIZES_PER_DAY,
    shared_windows_s: Sequence[float] = SHARED_WINDOWS_S,
    shared_headrooms: Sequence[float] = SHARED_HEADROOMS,
) -> PackBound:
    """The bounds of the module doc on ``groups``; ``fractions`` maps a workload key to the
    fraction held at each of its samples (a replay's timeline), to repack those too."""
    peak = {k: max(p.sample.memory_share for p in s) for k, s in groups.items()}
    bound = PackBound(static_peak=dict.fromkeys(headrooms, 0.0))
    rules = {w: window_reservations(groups, w, overrun_budget, warmup_s) for w in windows_s}
    bound.window_peak = {w: rule for w, (rule, _) in rules.items()}
    uniform = {
        w: window_reservations(groups, w, overrun_budget, warmup_s, uniform=True) for w in windows_s
    }
    bound.window_uniform = {w: rule for w, (rule, _) in uniform.items()}
    clairvoyant = {}
    for key, series in groups.items():
        times = [p.sample.timestamp.timestamp() for p in series]
        days = sum(sample_intervals(times)) / HOUR_S / 24
        clairvoyant[key] = clairvoyant_reservations(series, int(resizes_per_day * days + EPS))
    shared_peaks = {
        w: reservations_at(
            groups,
            {k: past_peaks(s, w) for k, s in groups.items()},
            WindowRule(headroom=dict.fromkeys(groups, 0.0)),
            warmup_s,
        )[1]
        for w in shared_windows_s
    }
    bound.shared = {(w, h): SharedRule(w, h) for w in shared_windows_s for h in shared_headrooms}
    if fractions is not None:
        bound.fractions = bound.fraction_hours = bound.fraction_hours_over_half = 0.0
    for seconds, on in slices(groups):
        hours = seconds / HOUR_S
        samples = [groups[k][i].sample for k, i in on]
        memory = [min(1.0, s.memory_share) for s in samples]
        bound.whole_card_hours += hours * len(on)
        bound.actual += hours * ffd_cards_2d(
            [(m, min(1.0, s.compute)) for m, s in zip(memory, samples, strict=True)]
        )
        bound.actual_lower += hours * lower_bound_cards(memory)
        for h in headrooms:
            sizes = [min(1.0, peak[k] + h) for k, _ in on]
            bound.static_peak[h] += hours * ffd_cards(sizes)
        sizes = [clairvoyant[k][i] for k, i in on]
        bound.clairvoyant += hours * ffd_cards(sizes)
        bound.clairvoyant_fraction_hours += hours * sum(sizes)
        for rule, reserved in [*rules.values(), *uniform.values()]:
            sizes = [reserved[k][i] for k, i in on]
            rule.card_hours += hours * ffd_cards(sizes)
            rule.fraction_hours += hours * sum(sizes)
        for (w, h), shared in bound.shared.items():
            sizes = [shared_peaks[w][k][i] for k, i in on]
            cards = ffd_bins(sizes, 1.0 - h)
            shared.card_hours += hours * len(cards)
            shared.card_samples += len(cards)
            shared.collision_card_samples += sum(
                sum(memory[i] for i in card) > 1.0 + EPS for card in cards
            )
        if fractions is not None:
            held = [fractions[k][i] for k, i in on]
            bound.fractions = (bound.fractions or 0.0) + hours * ffd_cards(held)
            bound.fraction_hours = (bound.fraction_hours or 0.0) + hours * sum(held)
            over = sum(f for f in held if f > 0.5 + EPS)
            bound.fraction_hours_over_half = (bound.fraction_hours_over_half or 0.0) + hours * over
    return bound


def held_fractions(
    timelines: Mapping[str, Sequence[tuple[float, float, float, float]]],
) -> dict[str, list[float]]:
    """The fraction held at each sample, from replay timelines ``(at, compute, memory,
    fraction)`` (:func:`fracpilot_libs.analysis.replay.replay_workload` with ``keep_timeline``)."""
    return {k: [row[3] for row in rows] for k, rows in timelines.items()}
