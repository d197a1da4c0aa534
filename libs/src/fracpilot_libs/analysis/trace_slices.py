"""A trace cut at every sample boundary: the slices in which the same samples report.

Each sample stands for the interval of
:func:`~fracpilot_libs.analysis.accounting.sample_intervals` (as in the packed account), so
hours summed over the slices are the packed account's. The repacking bounds
(:mod:`fracpilot_libs.analysis.packing_bound`, :mod:`fracpilot_libs.analysis.two_part_bound`)
repack every slice from scratch. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import pairwise

from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.trace import TracePoint

# (workload key, sample index) of every sample whose interval covers a slice
Slice = list[tuple[str, int]]


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
