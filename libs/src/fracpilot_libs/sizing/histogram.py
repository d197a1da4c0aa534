"""The compute histogram's readings: its buckets, a percentile, and the soft level.

Compute lives in a decaying histogram of 1% buckets (:mod:`fracpilot_libs.sizing.state`);
these pure functions read it for the engine (:mod:`fracpilot_libs.sizing.engine`) and the
VPA-style baseline.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate

from fracpilot_libs.sizing.state import BUCKETS

EPS = 1e-9  # float noise: values closer than this are equal


def bucket_of(compute: float) -> int:
    """The histogram bucket whose upper edge is the smallest whole percent >= compute."""
    return min(BUCKETS - 1, max(0, math.ceil(compute * 100 - EPS)))


def histogram_percentile(weights: array[float], total: float, pct: float) -> float:
    """The upper edge of the bucket holding the pct-th percentile (0 for an empty histogram)."""
    if total <= 0:
        return 0.0
    index = bisect_left(list(accumulate(weights)), total * pct / 100.0 - total * EPS)
    return min(index, BUCKETS - 1) / 100.0


def soft_compute_level(weights: array[float], budget: float) -> float:
    """The lowest whole percent of a GPU above which at most ``budget`` of the compute work in
    the histogram lies: the work that waits when the GPU's other shares are busy (0 for an
    empty histogram). Work is counted at the buckets' upper edges."""
    # delayed(k) = sum over buckets b > k of w_b * (b - k); from the top it is a running sum of
    # the running sum of the weights: delayed(n - 2 - j) = D[j] over the n buckets up to the
    # highest one with weight, and D[n - 2] = delayed(0) is all the work (in percent of a GPU
    # times weight). The empty buckets above it are left out: they add nothing, and this runs
    # on every sample (the bytes of the trailing zero weights are found in C).
    n = (len(weights.tobytes().rstrip(b"\0")) + 7) // 8
    if n < 2:
        return 0.0
    delayed = list(accumulate(accumulate(reversed(weights[:n]))))
    work = delayed[n - 2]
    if work <= 0:
        return 0.0
    j = bisect_right(delayed, budget * work * (1 + EPS)) - 1
    return min(BUCKETS - 1, max(0, n - 2 - j)) / 100.0


def frequent_level(weights: array[float], rare: float) -> float:
    """The lowest whole percent of a GPU above which less than ``rare`` of the histogram's
    weight lies: the foot of the rare bursts (0 for an empty histogram)."""
    above = 0.0
    for b in range(len(weights) - 1, 0, -1):
        above += weights[b]
        if above >= rare:
            return b / 100.0
    return 0.0
