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
- a card holds a set of tenants when their peaks (on the grid) plus the pooled headroom fit in
  1.0, and their compute levels plus the burst budget too (:func:`fits`);
- each tenant's accounted fraction is its own need on the grid plus its share of the pooled
  headroom, in proportion to its jump (:func:`divide`). The fractions sum to at most 1.0, so
  the scheduler's free share of the card stays truly free.

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

    @property
    def need(self) -> float:
        """Its own need, before any headroom: the larger of memory peak and compute level."""
        return self.memory_peak if self.memory_peak > self.compute else self.compute


@dataclass(frozen=True, slots=True)
class CardRules:
    """How a card's pooled budgets are set (shared isolation)."""

    headroom_factor: float = 1.0  # pooled memory headroom = factor x the largest jump...
    headroom_floor: float = 0.05  # ... and at least this
    step: float = 0.01  # the fractions' grid (hundredths: KAI and HAMi alike)

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


def budget(tenants: Iterable[TenantForecast], rules: CardRules) -> float:
    """What the card must hold for these tenants: their needs on the grid plus the pooled
    headroom (memory), or their compute levels plus the burst budget, whichever is larger."""
    ts = list(tenants)
    memory = sum(rules.up(t.need) for t in ts) + pooled_headroom(ts, rules)
    compute = sum(t.compute for t in ts) + burst_budget(ts)
    return max(memory, compute)


def fits(tenants: Iterable[TenantForecast], rules: CardRules) -> bool:
    """Whether one card holds these tenants with their pooled budgets."""
    return budget(tenants, rules) <= 1.0 + EPS


def divide(tenants: Mapping[str, TenantForecast], rules: CardRules) -> dict[str, float]:
    """Each tenant's accounted fraction: its need on the grid plus its share of the pooled
    headroom, in proportion to its jump (equal shares when none jumps), rounded down to the
    grid so that the fractions never sum above 1.0. A card that does not hold its tenants
    (:func:`fits` is False) gives each its need and no headroom, capped at 1.0."""
    if not tenants:
        return {}
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
