"""What packed fractions cost in cards, and what sharing a card costs the workloads on it.

:mod:`fracpilot_libs.analysis.packing_replay` places the workloads of a replay on GPUs and tells
this account, interval by interval, who is on which card and what they use. Definitions:

- A workload is *on* a card from the start of a sample to the end of the interval the sample
  stands for (:func:`fracpilot_libs.analysis.accounting.sample_intervals`; gaps capped the same
  way, so a workload that stops reporting leaves its card until it reports again).
- **card-hours**: for every card, the time during which at least one workload is on it.
  **whole-card-hours**: the time each workload is on some card, summed over workloads (one
  whole GPU each, as without fractions); with every sample placed it equals the unpacked
  replay's whole GPU-hours. Saved: ``100 * (1 - card_hours / whole_card_hours)``.
- **compute contention**: compute work is ``gpu_util * hours`` (GPU-hours of compute asked
  for). Over an interval in which the workloads on a card ask for ``D = sum(gpu_util)`` of
  it, the card serves at most 1.0, so ``max(0, D - 1) * hours`` is work *delayed*.
  ``contention_pct = 100 * sum(delayed) / sum(work)`` over every card and interval. Each
  interval's delay is charged to the workloads on the card in proportion to their
  ``gpu_util`` (:meth:`PackedAccount.most_contended`).
- **memory collision**: a sample whose card holds more memory in use (the sum of the latest
  ``gpu_mem_used_bytes`` of the workloads on it, after every sample and decision of that
  instant) than the card has. Only a memory overrun (a workload above its fraction) can cause
  one, since fractions on a card sum to at most 1.0. Counted per tenant's sample
  (``memory_collision_samples``) and per **card-sample** (a card at an instant at which one
  of its tenants reports: ``card_samples``, ``memory_collision_card_samples``;
  ``memory_collision_pct`` is of card-samples).
- **moves** are recreates on another card (the planner's ``recreate_elsewhere``, including a
  move onto a card added for it, and a consolidation: a move of the consolidation planner,
  which empties a card onto cards in use); **in-place** changes keep the card. Both per
  workload-day (``whole_card_hours / 24``). Placing a workload that arrives, or returns
  after a gap, is a *placement*, neither a move nor an in-place change.
- **isolation**: ``shared`` (memory shared on the card: cards sized by their tenants
  together, :mod:`fracpilot_libs.analysis.shared_packing`), ``enforced`` (a per-pod cap), or
  None (not set: today's per-pod sizing). Under ``shared`` a card re-divided among its
  tenants changes their fractions in place (*re-divisions*, no restart); every move is
  counted whoever's change caused it (a co-tenant moved to make room is a move), by cause
  (``moves_by_cause``), and memory moves beyond the move budget (``moves_over_budget``).
- With the card count pinned (``--gpus N``) a change that fits nowhere is *refused* (the
  workload keeps its fraction) and a workload that arrives to no room is *unplaced* (its
  samples are not replayed until it fits).

Pure: time is data (seconds passed in), no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HOUR_S = 3600.0


@dataclass
class Contended:
    """One workload's compute work and the part of it delayed by its card's neighbours."""

    workload: str
    work_gpu_hours: float
    delayed_gpu_hours: float

    @property
    def contention_pct(self) -> float:
        return 100.0 * self.delayed_gpu_hours / self.work_gpu_hours if self.work_gpu_hours else 0.0


@dataclass
class PackedAccount:
    """Card-hours, contention, memory collisions and placement changes of one packed replay."""

    card_memory_bytes: int
    gpus: int | None = None  # the pinned card count; None when cards are added as needed
    card_hours: float = 0.0
    whole_card_hours: float = 0.0
    work_gpu_hours: float = 0.0
    delayed_gpu_hours: float = 0.0
    samples: int = 0
    memory_collision_samples: int = 0
    memory_overrun_samples: int = 0
    card_samples: int = 0
    memory_collision_card_samples: int = 0
    isolation: str | None = None
    redivisions: int = 0
    placements: int = 0
    moves: int = 0
    # of the moves, consolidations (the consolidation planner's moves; under shared isolation,
    # of a workload another's change left alone): moves no decision of that workload asked for
    neighbour_moves: int = 0
    in_place: int = 0
    # shared isolation: the moves by cause (SharedCluster.move_causes), the memory moves made
    # beyond a workload's move budget (never withheld, counted) and that budget
    moves_by_cause: dict[str, int] = field(default_factory=dict)
    moves_over_budget: int = 0
    move_budget_per_day: float | None = None
    decisions_refused: int = 0
    unplaced_samples: int = 0
    unplaced: set[str] = field(default_factory=set)
    peak_cards: int = 0
    peak_card_fraction: float = 0.0  # the most of one card ever held, in fractions (<= 1.0)
    # (unix seconds, cards in use from then on), one entry per change: the plot's line
    cards_in_use: list[tuple[float, int]] = field(default_factory=list)
    work: dict[str, float] = field(default_factory=dict)
    delayed: dict[str, float] = field(default_factory=dict)
    # Nodes of ``gpus_per_node`` cards: hours of nodes with a pod on them, and of the nodes
    # the whole-GPU baseline needs (each workload on a card of its own, nodes filled).
    gpus_per_node: int = 1
    node_hours: float = 0.0
    whole_node_hours: float = 0.0
    peak_nodes: int = 0

    def hold_nodes(self, seconds: float, nodes: int, workloads: int) -> None:
        """``seconds`` during which ``nodes`` nodes have a pod on them and ``workloads``
        workloads are on cards."""
        hours = seconds / HOUR_S
        self.node_hours += nodes * hours
        self.whole_node_hours += -(-workloads // self.gpus_per_node) * hours
        self.peak_nodes = max(self.peak_nodes, nodes)

    @property
    def freed_card_hours(self) -> float:
        return self.whole_card_hours - self.card_hours

    @property
    def freed_on_whole_nodes_card_hours(self) -> float:
        """Of the card-hours freed, those of whole nodes given back (the baseline's nodes less
        the nodes in use, in cards): the rest are idle cards on nodes that stay."""
        return (self.whole_node_hours - self.node_hours) * self.gpus_per_node

    @property
    def freed_on_whole_nodes_pct(self) -> float:
        freed = self.freed_card_hours
        return 100.0 * self.freed_on_whole_nodes_card_hours / freed if freed > 0 else 0.0

    @property
    def node_hours_saved_pct(self) -> float:
        if not self.whole_node_hours:
            return 0.0
        return 100.0 * (1 - self.node_hours / self.whole_node_hours)

    def hold(self, seconds: float, cards: Iterable[Mapping[str, float]]) -> None:
        """``seconds`` during which each card in ``cards`` holds the workloads it maps to their
        ``gpu_util``; an empty mapping is a card nobody is on (it costs nothing)."""
        hours = seconds / HOUR_S
        for on_card in cards:
            if not on_card:
                continue
            self.card_hours += hours
            self.whole_card_hours += hours * len(on_card)
            demand = sum(on_card.values())
            self.work_gpu_hours += demand * hours
            if demand > 1.0:
                excess = (demand - 1.0) * hours
                self.delayed_gpu_hours += excess
                for workload, util in on_card.items():
                    share = excess * util / demand
                    self.delayed[workload] = self.delayed.get(workload, 0.0) + share
            for workload, util in on_card.items():
                self.work[workload] = self.work.get(workload, 0.0) + util * hours

    def in_use(self, at: float, cards: int) -> None:
        """From ``at`` on, ``cards`` cards have someone on them."""
        self.peak_cards = max(self.peak_cards, cards)
        if not self.cards_in_use or self.cards_in_use[-1][1] != cards:
            if self.cards_in_use and self.cards_in_use[-1][0] == at:
                self.cards_in_use[-1] = (at, cards)
            else:
                self.cards_in_use.append((at, cards))

    @property
    def workload_days(self) -> float:
        return self.whole_card_hours / 24

    @property
    def card_hours_saved_pct(self) -> float:
        if not self.whole_card_hours:
            return 0.0
        return 100.0 * (1 - self.card_hours / self.whole_card_hours)

    @property
    def contention_pct(self) -> float:
        return 100.0 * self.delayed_gpu_hours / self.work_gpu_hours if self.work_gpu_hours else 0.0

    @property
    def memory_collision_pct(self) -> float:
        """Card-samples whose tenants use more memory than the card has, percent."""
        if not self.card_samples:
            return 0.0
        return 100.0 * self.memory_collision_card_samples / self.card_samples

    @property
    def moves_per_workload_day(self) -> float:
        return self.moves / self.workload_days if self.workload_days else 0.0

    @property
    def in_place_per_workload_day(self) -> float:
        return self.in_place / self.workload_days if self.workload_days else 0.0

    def merged(self, other: PackedAccount) -> PackedAccount:
        """This account and ``other``'s, of other workloads on other cards, added up (the
        cards in use summed over time)."""
        out = PackedAccount(card_memory_bytes=max(self.card_memory_bytes, other.card_memory_bytes))
        for name in (
            "card_hours", "whole_card_hours", "work_gpu_hours", "delayed_gpu_hours", "samples",
            "node_hours", "whole_node_hours",
            "memory_collision_samples", "memory_overrun_samples", "card_samples",
            "memory_collision_card_samples", "redivisions", "placements", "moves", "in_place",
            "decisions_refused", "unplaced_samples",
        ):  # fmt: skip
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.gpus_per_node = self.gpus_per_node
        out.peak_nodes = self.peak_nodes + other.peak_nodes  # disjoint nodes (an upper bound)
        out.unplaced = self.unplaced | other.unplaced
        out.peak_card_fraction = max(self.peak_card_fraction, other.peak_card_fraction)
        for mine, theirs in ((self.work, other.work), (self.delayed, other.delayed)):
            target = out.work if mine is self.work else out.delayed
            target.update(mine)
            target.update(theirs)
        changes = sorted(
            [(at, 0, n) for at, n in self.cards_in_use]
            + [(at, 1, n) for at, n in other.cards_in_use]
        )
        now = [0, 0]
        for at, side, n in changes:
            now[side] = n
            out.in_use(at, now[0] + now[1])
        return out

    def most_contended(self, n: int) -> list[Contended]:
        """The n workloads with the most compute work delayed (ties by name), none unharmed."""
        ranked = sorted(
            ((w, d) for w, d in self.delayed.items() if d > 0), key=lambda wd: (-wd[1], wd[0])
        )
        return [Contended(w, self.work.get(w, 0.0), d) for w, d in ranked[:n]]

    def as_dict(self, most_contended: int = 5) -> dict[str, Any]:
        return {
            "card_hours": round(self.card_hours, 4),
            "whole_card_hours": round(self.whole_card_hours, 4),
            "card_hours_saved_pct": round(self.card_hours_saved_pct, 3),
            "contention_pct": round(self.contention_pct, 4),
            "memory_collision_samples": self.memory_collision_samples,
            "moves_per_workload_day": round(self.moves_per_workload_day, 3),
            "in_place_per_workload_day": round(self.in_place_per_workload_day, 3),
            "moves": self.moves,
            "in_place": self.in_place,
            "placements": self.placements,
            "memory_overrun_samples": self.memory_overrun_samples,
            "compute_gpu_hours": round(self.work_gpu_hours, 4),
            "delayed_gpu_hours": round(self.delayed_gpu_hours, 4),
            "samples": self.samples,
            "gpus": self.gpus,
            "isolation": self.isolation,
            "card_samples": self.card_samples,
            "memory_collision_card_samples": self.memory_collision_card_samples,
            "memory_collision_pct": round(self.memory_collision_pct, 4),
            "moves_by_cause": dict(self.moves_by_cause),
            "moves_over_budget": self.moves_over_budget,
            "move_budget_per_day": self.move_budget_per_day,
            "redivisions": self.redivisions,
            "redivisions_per_workload_day": round(
                self.redivisions / self.workload_days if self.workload_days else 0.0, 3
            ),
            "peak_cards": self.peak_cards,
            "nodes": {
                "gpus_per_node": self.gpus_per_node,
                "node_hours": round(self.node_hours, 4),
                "whole_node_hours": round(self.whole_node_hours, 4),
                "node_hours_saved_pct": round(self.node_hours_saved_pct, 3),
                "peak_nodes": self.peak_nodes,
                "freed_card_hours": round(self.freed_card_hours, 4),
                "freed_on_whole_nodes_card_hours": round(self.freed_on_whole_nodes_card_hours, 4),
                "freed_on_whole_nodes_pct": round(self.freed_on_whole_nodes_pct, 3),
            },
            "peak_card_fraction": round(self.peak_card_fraction, 6),
            "card_memory_bytes": self.card_memory_bytes,
            "decisions_refused": self.decisions_refused,
            "unplaced_workloads": len(self.unplaced),
            "unplaced_samples": self.unplaced_samples,
            "most_contended": [
                {
                    "workload": c.workload,
                    "delayed_gpu_hours": round(c.delayed_gpu_hours, 4),
                    "contention_pct": round(c.contention_pct, 3),
                }
                for c in self.most_contended(most_contended)
            ],
        }
