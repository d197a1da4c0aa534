"""Packing items into cards: first-fit-decreasing and a lower bound no packing goes below.

One dimension (:func:`ffd_cards`, :func:`ffd_bins`: which items share a card), two dimensions
(:func:`ffd_cards_2d`: memory and compute, each at most the card's capacity), and Martello and
Toth's L2 bound (:func:`lower_bound_cards`). Used by the repacking bounds
(:mod:`fracpilot_libs.analysis.packing_bound`, :mod:`fracpilot_libs.analysis.two_part_bound`)
and the recommendations. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-9


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
