"""Per-pod memory reservations at each sample, by the rules the repacking bounds repack.

- **window peak + hindsight headroom** (:func:`window_reservations`): the peak of the pod's
  own samples over the last window (:func:`past_peaks`) plus a headroom chosen in hindsight
  within an overrun budget (per pod, or one for all with ``uniform``);
- **clairvoyant, few resizes** (:func:`clairvoyant_reservations`): the fewest
  reservation-hours that never fall below the memory in use, within a number of changes.

What each line means, and how its card-hours are counted, is
:mod:`fracpilot_libs.analysis.packing_bound`'s module doc. Pure.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.bin_packing import EPS
from fracpilot_libs.analysis.trace import TracePoint

HOUR_S = 3600.0
DEFAULT_OVERRUN_BUDGET = 8  # samples: 0.01% of the GenAI trace's 87,637
CLAIRVOYANT_STEP_S = 900.0  # where the clairvoyant reservation may change
DEFAULT_WARMUP_S = 1800.0  # the engine's min_history_s: it holds a whole GPU until then


@dataclass
class WindowRule:
    """What the window peak + hindsight headroom rule reserved and overran."""

    headroom: dict[str, float]  # per workload key
    overrun_samples: int = 0
    card_hours: float = 0.0
    fraction_hours: float = 0.0


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
    """The window peak + hindsight headroom rule (module doc of
    :mod:`~fracpilot_libs.analysis.packing_bound`): its per-pod headrooms and overruns, and the
    reservation at each sample (card-hours are left to
    :func:`~fracpilot_libs.analysis.packing_bound.pack_bound`)."""
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
        return reservations_at(
            groups, peaks, WindowRule(headroom=dict.fromkeys(groups, one)), warmup_s
        )
    spent = dict.fromkeys(groups, 0)
    for _ in range(overrun_budget):  # each overrun sample where it lowers the most card-hours
        open_ = [k for k in sorted(groups) if spent[k] + 1 < len(excess[k])]
        if not open_:
            break
        k = max(open_, key=lambda k: (excess[k][spent[k]] - excess[k][spent[k] + 1]) * hours[k])
        spent[k] += 1
    rule = WindowRule(headroom={k: excess[k][spent[k]] for k in groups})
    return reservations_at(groups, peaks, rule, warmup_s)


def reservations_at(
    groups: Mapping[str, list[TracePoint]],
    peaks: Mapping[str, list[float | None]],
    rule: WindowRule,
    warmup_s: float,
) -> tuple[WindowRule, dict[str, list[float]]]:
    """``rule`` with its overruns counted, and the reservation at each sample: the past peak
    plus the pod's headroom in ``rule``, in hundredths (a whole card until ``warmup_s``)."""
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
    """At each sample, the reservation (hundredths) of the clairvoyant few-resize rule (module
    doc of :mod:`~fracpilot_libs.analysis.packing_bound`): at most ``changes`` changes, at
    multiples of ``step_s`` from the first sample, never below the memory in use, fewest
    reservation-hours."""
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
