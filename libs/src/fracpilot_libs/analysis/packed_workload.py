"""One workload of the packed replay, and the order in which its samples act.

:class:`PackedWorkload` is what the replay loop
(:func:`fracpilot_libs.analysis.packing_replay.replay_packed`) keeps per workload; every sample
is a START event at its time and, unless its interval is 0 s, an END event where the interval
ends (:func:`sample_events`); the samples of one instant are replayed in rounds
(:func:`rounds_of`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fracpilot_libs.analysis.accounting import Metrics, sample_intervals
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import WorkloadRef

END, START = 0, 1  # at one instant, intervals end before samples start


@dataclass
class PackedWorkload:
    """One workload as the replay loop holds it, changed in place as its samples act."""

    ref: WorkloadRef
    key: str
    series: list[TracePoint]
    intervals: list[float]  # seconds each sample stands for
    leaves: list[bool]  # whether the workload leaves its card when a sample's interval ends
    metrics: Metrics
    fraction: float  # accounted (the fraction the scheduler holds)
    state: object
    base: float = 0.0  # what its sizer decided (shared isolation: its need; else the fraction)
    shown: float = 0.0  # memory share of the sample it arrived with (shared isolation)
    pending: float | None = None
    util: float = 0.0
    memory: int = 0
    on_card: bool = False  # placed and inside a sample's interval


def sample_events(workloads: list[PackedWorkload]) -> list[tuple[float, int, int, int]]:
    """(time, END or START, workload index, sample index), in time order. A sample's END
    event is at the next sample's time unless the interval was capped (a gap) or is the last;
    a sample at the same time as the next (an interval of 0 s) has none: see :func:`rounds_of`."""
    events = []
    for w, wl in enumerate(workloads):
        times = [p.sample.timestamp.timestamp() for p in wl.series]
        wl.intervals = sample_intervals(times)
        for i, (at, dt) in enumerate(zip(times, wl.intervals, strict=True)):
            events.append((at, START, w, i))
            leaves = i + 1 == len(times) or at + dt < times[i + 1]
            wl.leaves.append(leaves)
            if dt > 0:
                events.append((at + dt if leaves else times[i + 1], END, w, i))
    events.sort()
    return events


def rounds_of(
    starts: list[tuple[PackedWorkload, int]],
) -> list[list[tuple[PackedWorkload, int]]]:
    """The samples starting at one instant, in rounds: the n-th sample of each workload at
    that instant is in round n (a trace may repeat a timestamp; each sample still counts, and
    a decision on one applies to the next, as in the unpacked replay)."""
    rounds: list[list[tuple[PackedWorkload, int]]] = []
    seen: dict[str, int] = {}
    for wl, i in starts:
        n = seen[wl.key] = seen.get(wl.key, -1) + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append((wl, i))
    return rounds
