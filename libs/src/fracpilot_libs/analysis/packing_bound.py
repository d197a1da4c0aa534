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

Two parts (HAMi): HAMi fits a pod on a GPU by two sums, ``nvidia.com/gpumem`` (or
``gpumem-percentage``) and ``nvidia.com/gpucores``, each at most 100 % per GPU
(:mod:`fracpilot_libs.hami.fit`); fracpilot writes both from one fraction. :func:`two_part_bound`
repacks per-pod (memory, compute) shares in whole percents on those two sums (first-fit-
decreasing, see :func:`ffd_cards_2d`), so that a memory-heavy, compute-light pod may share
a card with a compute-heavy, memory-light one, which one number per pod forbids.
:func:`engine_parts` says what the engine's two parts are: it sizes them apart and holds only
the larger.

Time is cut at every sample boundary (each sample stands for the interval of
:func:`~fracpilot_libs.analysis.accounting.sample_intervals`, as in the packed account): card-
hours and whole-card-hours are summed over those slices, so ``whole_card_hours`` equals the
packed account's. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import Policy
from fracpilot_libs.hami.fit import percent
from fracpilot_libs.sizing.engine import clamp_to_policy
from fracpilot_libs.sizing.need import Need

HOUR_S = 3600.0
EPS = 1e-9
DEFAULT_HEADROOMS = (0.0, 0.02, 0.03, 0.05, 0.1)
DEFAULT_WINDOWS_S = (3600.0, 2 * 3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0)  # 24 h: the engine's
DEFAULT_OVERRUN_BUDGET = 8  # samples: 0.01% of the GenAI trace's 87,637
DEFAULT_RESIZES_PER_DAY = 4.0
CLAIRVOYANT_STEP_S = 900.0  # where the clairvoyant reservation may change
DEFAULT_WARMUP_S = 1800.0  # the engine's min_history_s: it holds a whole GPU until then
SHARED_WINDOWS_S = (3600.0, 4 * 3600.0, 24 * 3600.0)
SHARED_HEADROOMS = (0.0, 0.02, 0.05, 0.1, 0.15)
SHARED_COLLISION_PCT = 0.01  # of card-samples: the shared mode's memory safety limit

# (workload key, sample index) of every sample whose interval covers a slice
Slice = list[tuple[str, int]]


def ffd_cards(sizes: Sequence[float]) -> int:
    """Cards of size 1.0 first-fit-decreasing needs for ``sizes`` (each at most 1.0)."""
    free: list[float] = []
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if size <= room + EPS:
                free[i] = room - size
                break
        else:
            free.append(1.0 - size)
    return len(free)


def ffd_cards_2d(
    items: Sequence[tuple[float, float]], order: str = "pair", capacity: float = 1.0
) -> int:
    """FFD for (memory, compute) pairs: a card holds at most ``capacity`` of each (1.0; 100 for
    HAMi's whole percents, whose ``Fit`` refuses either sum above it:
    ``CardInsufficientMemory``, ``CardInsufficientCore``). ``order``: decreasing by the pair
    (memory, then compute), by the larger of the two ("max") or by their sum ("sum"), ties by
    the pair."""
    if order not in ("pair", "max", "sum"):
        raise ValueError(f"order must be 'pair', 'max' or 'sum', not {order!r}")

    def key(item: tuple[float, float]) -> tuple[float, float, float]:
        first = 0.0 if order == "pair" else max(item) if order == "max" else item[0] + item[1]
        return (first, *item)

    free: list[tuple[float, float]] = []
    for mem, comp in sorted(items, key=key, reverse=True):
        for i, (room_m, room_c) in enumerate(free):
            if mem <= room_m + EPS and comp <= room_c + EPS:
                free[i] = (room_m - mem, room_c - comp)
                break
        else:
            free.append((capacity - mem, capacity - comp))
    return len(free)


def ffd_bins(sizes: Sequence[float], capacity: float = 1.0) -> list[list[int]]:
    """First-fit-decreasing into cards of ``capacity``: the indices of ``sizes`` on each card
    (an item larger than the capacity gets a card of its own)."""
    free: list[float] = []
    bins: list[list[int]] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        size = sizes[i]
        for b, room in enumerate(free):
            if size <= room + EPS:
                free[b] = room - size
                bins[b].append(i)
                break
        else:
            free.append(capacity - size)
            bins.append([i])
    return bins


def lower_bound_cards(sizes: Sequence[float]) -> int:
    """Martello and Toth's L2: no packing of ``sizes`` in cards of 1.0 uses fewer cards. For
    each threshold K in [0, 1/2]: an item above 1 - K shares its card with no item of size K
    or more; an item in (1/2, 1 - K] needs a card of its own as well; the items in [K, 1/2]
    can fill at most the room those leave, and the rest of them needs further cards."""
    if not sizes:
        return 0
    items = sorted(sizes)
    best = math.ceil(sum(items) - EPS)
    for k in {0.0, *(x for x in items if x <= 0.5 + EPS)}:
        big = [x for x in items if x > 1.0 - k + EPS]
        mid = [x for x in items if 0.5 + EPS < x <= 1.0 - k + EPS]
        small = sum(x for x in items if k - EPS <= x <= 0.5 + EPS)
        room = sum(1.0 - x for x in mid)
        best = max(best, len(big) + len(mid) + max(0, math.ceil(small - room - EPS)))
    return best


def slices(groups: Mapping[str, list[TracePoint]]) -> Iterator[tuple[float, Slice]]:
    """(seconds, the samples whose interval covers them) for every slice between sample
    boundaries in which at least one workload reports, in time order."""
    starts: list[tuple[float, float, str, int]] = []
    for key, series in groups.items():
        times = [p.sample.timestamp.timestamp() for p in series]
        for i, (at, dt) in enumerate(zip(times, sample_intervals(times), strict=True)):
            if dt > 0:
                starts.append((at, at + dt, key, i))
    starts.sort()
    bounds = sorted({s[0] for s in starts} | {s[1] for s in starts})
    active: dict[str, tuple[float, int]] = {}
    n = 0
    for at, until in pairwise(bounds):
        while n < len(starts) and starts[n][0] <= at:
            _, end, key, i = starts[n]
            active[key] = (end, i)
            n += 1
        for key in [k for k, (end, _) in active.items() if end <= at]:
            del active[key]
        if active:
            yield until - at, [(key, i) for key, (_, i) in active.items()]


@dataclass
class WindowRule:
    """What the window peak + hindsight headroom rule reserved and overran."""

    headroom: dict[str, float]  # per workload key
    overrun_samples: int = 0
    card_hours: float = 0.0
    fraction_hours: float = 0.0


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


def past_peaks(series: Sequence[TracePoint], window_s: float) -> list[float | None]:
    """At each sample, the peak memory share of the samples before it within ``window_s``
    (None when there are none): what an online rule knows when the sample arrives."""
    out: list[float | None] = []
    kept: deque[tuple[float, float]] = deque()  # (time, share), shares decreasing
    for point in series:
        at, share = point.sample.timestamp.timestamp(), point.sample.memory_share
        while kept and kept[0][0] <= at - window_s:
            kept.popleft()
        out.append(kept[0][1] if kept else None)
        while kept and kept[-1][1] <= share:
            kept.pop()
        kept.append((at, share))
    return out


def _reserve(peak: float | None, headroom: float, warm: bool) -> float:
    if not warm or peak is None:
        return 1.0
    return min(1.0, math.ceil((peak + headroom) * 100 - EPS) / 100)


def window_reservations(
    groups: Mapping[str, list[TracePoint]],
    window_s: float,
    overrun_budget: int = DEFAULT_OVERRUN_BUDGET,
    warmup_s: float = DEFAULT_WARMUP_S,
    uniform: bool = False,
) -> tuple[WindowRule, dict[str, list[float]]]:
    """The window peak + hindsight headroom rule of the module doc: its per-pod headrooms and
    overruns, and the reservation at each sample (card-hours are left to :func:`pack_bound`)."""
    peaks: dict[str, list[float | None]] = {}
    excess: dict[str, list[float]] = {}  # per pod, what each sample asks above its past peak
    hours: dict[str, float] = {}
    for key, series in groups.items():
        peaks[key] = past_peaks(series, window_s)
        start = series[0].sample.timestamp.timestamp()
        over = [
            max(0.0, p.sample.memory_share - peak)
            for p, peak in zip(series, peaks[key], strict=True)
            if peak is not None and p.sample.timestamp.timestamp() - start >= warmup_s
        ]
        excess[key] = [*sorted(over, reverse=True), 0.0]
        times = [p.sample.timestamp.timestamp() for p in series]
        hours[key] = sum(sample_intervals(times)) / HOUR_S
    if uniform:  # at most overrun_budget samples ask more than the budget-th largest excess
        every = sorted((x for k in groups for x in excess[k]), reverse=True)
        one = every[min(overrun_budget, len(every) - 1)]
        return _reserved(groups, peaks, WindowRule(headroom=dict.fromkeys(groups, one)), warmup_s)
    spent = dict.fromkeys(groups, 0)
    for _ in range(overrun_budget):  # each overrun sample where it lowers the most card-hours
        open_ = [k for k in sorted(groups) if spent[k] + 1 < len(excess[k])]
        if not open_:
            break
        k = max(open_, key=lambda k: (excess[k][spent[k]] - excess[k][spent[k] + 1]) * hours[k])
        spent[k] += 1
    rule = WindowRule(headroom={k: excess[k][spent[k]] for k in groups})
    return _reserved(groups, peaks, rule, warmup_s)


def _reserved(
    groups: Mapping[str, list[TracePoint]],
    peaks: Mapping[str, list[float | None]],
    rule: WindowRule,
    warmup_s: float,
) -> tuple[WindowRule, dict[str, list[float]]]:
    held: dict[str, list[float]] = {}
    for key, series in groups.items():
        start = series[0].sample.timestamp.timestamp()
        held[key] = [
            _reserve(peak, rule.headroom[key], p.sample.timestamp.timestamp() - start >= warmup_s)
            for p, peak in zip(series, peaks[key], strict=True)
        ]
        rule.overrun_samples += sum(
            p.sample.memory_share > r + EPS for p, r in zip(series, held[key], strict=True)
        )
    return rule, held


def clairvoyant_reservations(
    series: Sequence[TracePoint],
    changes: int,
    step_s: float = CLAIRVOYANT_STEP_S,
) -> list[float]:
    """At each sample, the reservation (hundredths) of the clairvoyant few-resize rule of the
    module doc: at most ``changes`` changes, at multiples of ``step_s`` from the first sample,
    never below the memory in use, fewest reservation-hours."""
    times = [p.sample.timestamp.timestamp() for p in series]
    dts = sample_intervals(times)
    block_of = [int((at - times[0]) // step_s) for at in times]
    blocks = block_of[-1] + 1
    need, hours = [0.0] * blocks, [0.0] * blocks
    for b, p, dt in zip(block_of, series, dts, strict=True):
        share = min(1.0, math.ceil(p.sample.memory_share * 100 - EPS) / 100)
        need[b] = max(need[b], share)
        hours[b] += dt / HOUR_S
    # cost[c][j]: fewest reservation-hours for blocks [0, j) in c + 1 pieces; cut: where the
    # last piece starts
    inf = math.inf
    cost = [[inf] * (blocks + 1) for _ in range(changes + 1)]
    cut = [[0] * (blocks + 1) for _ in range(changes + 1)]
    for c in range(changes + 1):
        cost[c][0] = 0.0
        for j in range(1, blocks + 1):
            top = run_hours = 0.0
            for i in range(j - 1, -1, -1):  # the last piece is blocks [i, j)
                top, run_hours = max(top, need[i]), run_hours + hours[i]
                before = 0.0 if i == 0 else (cost[c - 1][i] if c else inf)
                if before + top * run_hours < cost[c][j]:
                    cost[c][j], cut[c][j] = before + top * run_hours, i
    level = [0.0] * blocks
    c, j = changes, blocks
    while j > 0:
        i = cut[c][j]
        for b in range(i, j):
            level[b] = max(need[i:j])
        j, c = i, max(c - 1, 0)
    return [level[b] for b in block_of]


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
        w: _reserved(
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


@dataclass
class TwoPartBound:
    """Card-hours of (memory, compute) shares repacked from scratch at every instant, on
    HAMi's two sums, per FFD order; saved against ``whole_card_hours`` (as :class:`PackBound`)."""

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
