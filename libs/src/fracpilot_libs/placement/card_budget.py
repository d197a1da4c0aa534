"""Dividing one GPU among its tenants where memory is shared (``shared`` isolation).

Under KAI's GPU sharing without a memory cap a pod's fraction is scheduler accounting: a pod
may use more memory than its fraction, and what fails is the card, when its tenants together
use more memory than it has. So the tenants of a card share **one pooled memory headroom** and
**one burst budget**, because their jumps rarely coincide:

- each tenant brings its predicted need (:class:`TenantForecast`, what the engine publishes per
  workload: its memory peak, its jump statistic, its compute level and burst);
- the card's pooled memory headroom is ``factor`` x the largest jump of its tenants, at least
  ``floor``: one tenant jumping at a time (:func:`pooled_headroom`); its burst budget is the
  largest compute burst of its tenants (time-sliced compute: a burst costs only when
  co-tenants burst at the same moment);
- a card admits a set of tenants when its memory budget fits in 1.0, and their compute levels
  plus the burst budget too (:func:`fits`); it keeps them while they leave ``keep_share`` of
  the pooled budgets free (:func:`holds`: hysteresis when below 1.0). A tenant's ``spare`` (a
  young workload's unsettled margin) counts for admitting it, not for keeping it. The memory
  budget is the tenants' peaks plus the pooled headroom (plus their spares), where a tenant's
  peak is its need on the grid (``pooled_peaks`` off) or, with ``pooled_peaks``, the card's
  *joint* peak: the most the tenants held together in any one period of their peak profiles
  (each tenant's peak per period of the engine's memory window, on one clock; a tenant without
  a profile counts its need in every period). Peaks that never coincided are not reserved
  twice (:func:`joint_peak`);
- each tenant's accounted fraction is its share of that budget: its need on the grid plus its
  share of the pooled headroom, in proportion to its jump (:func:`divide`); with
  ``pooled_peaks`` the whole budget in proportion to the tenants' needs (a tenant may then
  hold less than its own peak: under shared isolation a fraction is accounting, and the card's
  budget covers the peak its tenants reach together). The fractions sum to at most 1.0, so the
  scheduler's free share of the card stays truly free.

Pure: numbers in, numbers out. The same code divides a card in ``fracpilot replay --pack
--isolation shared`` (:mod:`fracpilot_libs.analysis.shared_packing`) and is meant for the
actuator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

EPS = 1e-9


class Isolation(StrEnum):
    """How a GPU-sharing backend holds a pod to its fraction of memory."""

    SHARED = "shared"  # KAI without a memory cap (time-slicing): the card is the limit
    ENFORCED = "enforced"  # HAMi, or KAI with HAMi-core limits: a pod above its cap is killed


@dataclass(frozen=True, slots=True)
class TenantForecast:
    """What the engine predicts of one workload, shares of a card."""

    memory_peak: float  # memory peak over the engine's window
    memory_jump: float  # how far above that peak it may jump (its jump statistic)
    compute: float  # the compute level that sizes it
    burst: float = 0.0  # how far above that level its compute bursts
    # (period index, memory peak in it) on a clock shared by all tenants, oldest first; empty:
    # the need counts in every period
    profile: tuple[tuple[int, float], ...] = ()
    # memory a card must also have free to admit this tenant, which it may use before the
    # card moves anyone (a young tenant's unsettled margin: hysteresis)
    spare: float = 0.0

    @property
    def need(self) -> float:
        """Its own need, before any headroom: the larger of memory peak and compute level."""
        return self.memory_peak if self.memory_peak > self.compute else self.compute


@dataclass(frozen=True, slots=True)
class CardRules:
    """How a card's pooled budgets are set (shared isolation)."""

    # pooled memory headroom = factor x the largest jump, at least the floor (tuned on half the
    # GenAI trace's pods: docs/sizing.md)
    headroom_factor: float = 0.5
    headroom_floor: float = 0.05
    step: float = 0.01  # the fractions' grid (hundredths: KAI and HAMi alike)
    pooled_peaks: bool = True  # budget the card's joint peak, not the sum of its tenants'
    # a card keeps its tenants while their peaks leave this share of the pooled headroom (and
    # burst budget) free; it admits one only with all of it free. Below 1.0 a new peak inside
    # the headroom moves nobody at once (hysteresis). 0.75 and 1.0 tied on half the GenAI
    # trace's pods (docs/sizing.md): 1.0 keeps the whole headroom on every card
    keep_share: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.keep_share <= 1.0:
            raise ValueError("keep_share is a share of the pooled budgets: 0 to 1")

    def up(self, value: float) -> float:
        return math.ceil(value / self.step - EPS) * self.step

    def down(self, value: float) -> float:
        return math.floor(value / self.step + EPS) * self.step


def pooled_headroom(tenants: Iterable[TenantForecast], rules: CardRules) -> float:
    """The card's one memory headroom: ``factor`` x its tenants' largest jump, at least the
    floor (0 for an empty card)."""
    largest = -1.0
    for t in tenants:
        largest = max(largest, t.memory_jump)
    if largest < 0:
        return 0.0
    return max(rules.headroom_floor, rules.headroom_factor * largest)


def burst_budget(tenants: Iterable[TenantForecast]) -> float:
    """The card's one compute burst budget: its tenants' largest burst."""
    return max((t.burst for t in tenants), default=0.0)


def joint_peak(tenants: Iterable[TenantForecast]) -> float:
    """The most memory the tenants held together in one period of their profiles (a tenant
    without a profile holds its need in every period)."""
    ts = list(tenants)
    constant = sum(t.need for t in ts if not t.profile)
    by_period: dict[int, float] = {}
    for t in ts:
        for period, peak in t.profile:
            by_period[period] = by_period.get(period, 0.0) + peak
    return constant + max(by_period.values(), default=0.0)


def memory_budget(tenants: Iterable[TenantForecast], rules: CardRules) -> float:
    """The memory the card reserves for these tenants: their peaks (each one's need on the
    grid, or with ``pooled_peaks`` their joint peak) plus the pooled headroom."""
    ts = list(tenants)
    peaks = rules.up(joint_peak(ts)) if rules.pooled_peaks else sum(rules.up(t.need) for t in ts)
    return peaks + pooled_headroom(ts, rules) + sum(t.spare for t in ts)


def holds_memory(tenants: Iterable[TenantForecast], rules: CardRules) -> bool:
    """Whether a card keeps these tenants' memory: their peaks leave ``keep_share`` of the
    pooled headroom free (none of their ``spare``)."""
    ts = list(tenants)
    peaks = rules.up(joint_peak(ts)) if rules.pooled_peaks else sum(rules.up(t.need) for t in ts)
    return peaks + rules.keep_share * pooled_headroom(ts, rules) <= 1.0 + EPS


def holds(tenants: Iterable[TenantForecast], rules: CardRules) -> bool:
    """Whether a card keeps these tenants: as :func:`fits`, but leaving free only
    ``keep_share`` of the pooled headroom and of the burst budget, and none of the tenants'
    ``spare``. A card that fits its tenants holds them."""
    ts = list(tenants)
    compute = sum(t.compute for t in ts) + rules.keep_share * burst_budget(ts)
    return compute <= 1.0 + EPS and holds_memory(ts, rules)


def budget(tenants: Iterable[TenantForecast], rules: CardRules) -> float:
    """What the card must hold for these tenants: its memory budget, or their compute
    levels plus the burst budget, whichever is larger."""
    ts = list(tenants)
    compute = sum(t.compute for t in ts) + burst_budget(ts)
    return max(memory_budget(ts, rules), compute)


def fits(tenants: Iterable[TenantForecast], rules: CardRules) -> bool:
    """Whether one card holds these tenants with their pooled budgets."""
    return budget(tenants, rules) <= 1.0 + EPS


def divide(tenants: Mapping[str, TenantForecast], rules: CardRules) -> dict[str, float]:
    """Each tenant's accounted fraction: its need on the grid plus its share of the pooled
    headroom, in proportion to its jump (equal shares when none jumps), rounded down to the
    grid so that the fractions never sum above 1.0. With ``pooled_peaks``, the card's whole
    budget (as much as 1.0 holds) in proportion to the tenants' needs, rounded down. A card
    that does not hold its tenants (:func:`fits` is False) gives each its need and no
    headroom, capped at 1.0 (without ``pooled_peaks``; with it, its share of 1.0)."""
    if not tenants:
        return {}
    if rules.pooled_peaks:
        whole = min(1.0, budget(tenants.values(), rules))
        total = sum(t.need for t in tenants.values())
        n = len(tenants)
        return {
            k: round(rules.down(whole * (t.need / total if total > EPS else 1.0 / n)), 6)
            for k, t in tenants.items()
        }
    headroom = pooled_headroom(tenants.values(), rules)
    needs = {k: min(1.0, rules.up(t.need)) for k, t in tenants.items()}
    if not fits(tenants.values(), rules):
        return needs
    room = 1.0 - sum(needs.values())
    headroom = min(headroom, room)
    jumps = sum(t.memory_jump for t in tenants.values())
    n = len(tenants)
    out = {}
    for key, t in tenants.items():
        weight = t.memory_jump / jumps if jumps > EPS else 1.0 / n
        out[key] = round(needs[key] + rules.down(headroom * weight), 6)
    return out
