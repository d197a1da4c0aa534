"""Replay a usage trace through a sizer and measure what would have happened.

A trace is a CSV (or CSV.gz) with ``timestamp,namespace,workload,pod,gpu_util,
gpu_mem_used_bytes,gpu_mem_total_bytes`` and optional ``requested_fraction`` (the starting
fraction; default 1.0; a static baseline holds its own fraction from the start) and
``gpu_model`` (prices the GPU-hours; the caller's default model otherwise). Each
workload is replayed on its own, in time order: a sample is judged against the allocation in
force, then shown to the sizer, and a new fraction applies from the next sample on. The same
engine as the service's runs here.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from fracpilot_decision.baselines import Sizer
from fracpilot_libs.contracts import UsageSample, WorkloadRef
from fracpilot_libs.pricing import GpuPrices

REQUIRED_COLUMNS = (
    "timestamp",
    "namespace",
    "workload",
    "pod",
    "gpu_util",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
)
_EPS = 1e-9


class TraceError(ValueError):
    """The trace cannot be read: a missing column, or a row that does not parse."""


@dataclass(frozen=True, slots=True)
class TracePoint:
    sample: UsageSample
    requested_fraction: float | None


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _describe(exc: ValidationError) -> str:
    """A validation error on one line: ``field: message (got value)`` per problem."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}"
        + (f" (got {e['input']!r})" if e["loc"] else "")
        for e in exc.errors(include_url=False)
    )


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


_CONVERSIONS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("timestamp", _timestamp, "an RFC 3339 time"),
    ("gpu_util", float, "a number"),
    ("gpu_mem_used_bytes", int, "a whole number of bytes"),
    ("gpu_mem_total_bytes", int, "a whole number of bytes"),
    ("requested_fraction", float, "a number"),
)


def _which_field(row: dict[str | Any, str | Any], exc: ValueError) -> str:
    """Name the field that failed to parse (only called on the error path)."""
    for column, convert, kind in _CONVERSIONS:
        value = row.get(column)
        if not value:
            continue
        try:
            convert(value)
        except ValueError:
            return f"{column}: {value!r} is not {kind}"
    return str(exc)


def read_trace(path: Path, cluster: str = "replay", gpu_model: str = "") -> Iterator[TracePoint]:
    """Rows of the trace as validated samples; a bad row raises TraceError naming its line.

    ``gpu_model`` names the GPU of rows that have no ``gpu_model`` column of their own."""
    with _open_text(path) as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        has_requested = "requested_fraction" in (reader.fieldnames or [])
        has_model = "gpu_model" in (reader.fieldnames or [])
        refs: dict[tuple[str, str], WorkloadRef] = {}
        expected = len(reader.fieldnames or [])
        for row in reader:
            line = reader.line_num  # the physical line: blank lines are skipped, not counted out
            try:
                if None in row or None in row.values():
                    raise ValueError(f"expected {expected} fields")
                key = (row["namespace"], row["workload"])
                ref = refs.get(key)
                if ref is None:
                    ref = refs[key] = WorkloadRef(
                        cluster=cluster, namespace=key[0], owner_name=key[1]
                    )
                at = _timestamp(row["timestamp"])
                sample = UsageSample(
                    sample_id=f"{line}",
                    workload=ref,
                    pod=row["pod"],
                    timestamp=at,
                    compute=float(row["gpu_util"]),
                    memory_used_bytes=int(row["gpu_mem_used_bytes"]),
                    memory_total_bytes=int(row["gpu_mem_total_bytes"]),
                    gpu_model=(row["gpu_model"] if has_model else "") or gpu_model,
                    source="replay",
                )
                requested = (
                    float(row["requested_fraction"])
                    if has_requested and row["requested_fraction"]
                    else None
                )
                if requested is not None and not 0.0 < requested <= 1.0:
                    raise ValueError(f"requested_fraction {requested} is not in (0, 1]")
            except ValidationError as exc:
                raise TraceError(f"{path}:{line}: {_describe(exc)}") from exc
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {_which_field(row, exc)}") from exc
            yield TracePoint(sample, requested)


@dataclass
class Metrics:
    """What a replay measures, for one workload or in total."""

    samples: int = 0
    workloads: int = 0
    fraction_hours: float = 0.0
    whole_gpu_hours: float = 0.0
    compute_overrun_samples: int = 0
    memory_overrun_samples: int = 0
    resizes: int = 0
    longest_overrun_s: float = 0.0
    allocated_cost_usd: float = 0.0
    whole_cost_usd: float = 0.0

    @property
    def cost_saved_usd(self) -> float:
        return self.whole_cost_usd - self.allocated_cost_usd

    @property
    def savings_pct(self) -> float:
        if not self.whole_gpu_hours:
            return 0.0
        return 100.0 * (1 - self.fraction_hours / self.whole_gpu_hours)

    @property
    def compute_overrun_pct(self) -> float:
        return 100.0 * self.compute_overrun_samples / self.samples if self.samples else 0.0

    @property
    def memory_overrun_pct(self) -> float:
        return 100.0 * self.memory_overrun_samples / self.samples if self.samples else 0.0

    @property
    def resizes_per_workload_day(self) -> float:
        days = self.whole_gpu_hours / 24
        return self.resizes / days if days else 0.0

    def add(self, other: Metrics) -> None:
        self.samples += other.samples
        self.workloads += other.workloads
        self.fraction_hours += other.fraction_hours
        self.whole_gpu_hours += other.whole_gpu_hours
        self.compute_overrun_samples += other.compute_overrun_samples
        self.memory_overrun_samples += other.memory_overrun_samples
        self.resizes += other.resizes
        self.allocated_cost_usd += other.allocated_cost_usd
        self.whole_cost_usd += other.whole_cost_usd
        self.longest_overrun_s = max(self.longest_overrun_s, other.longest_overrun_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "workloads": self.workloads,
            "fraction_hours": round(self.fraction_hours, 4),
            "whole_gpu_hours": round(self.whole_gpu_hours, 4),
            "savings_pct": round(self.savings_pct, 3),
            "compute_overrun_pct": round(self.compute_overrun_pct, 4),
            "memory_overrun_samples": self.memory_overrun_samples,
            "memory_overrun_pct": round(self.memory_overrun_pct, 4),
            "resizes": self.resizes,
            "resizes_per_workload_day": round(self.resizes_per_workload_day, 3),
            "longest_overrun_s": round(self.longest_overrun_s, 1),
            "allocated_cost_usd": round(self.allocated_cost_usd, 2),
            "whole_cost_usd": round(self.whole_cost_usd, 2),
            "cost_saved_usd": round(self.cost_saved_usd, 2),
        }


@dataclass
class WorkloadReplay:
    workload: WorkloadRef
    metrics: Metrics
    final_fraction: float
    # (unix time, compute, memory share, allocation in force) for plots
    timeline: list[tuple[float, float, float, float]] = field(default_factory=list)


@dataclass
class ReplayReport:
    totals: Metrics
    workloads: list[WorkloadReplay]

    def top(self, n: int) -> list[WorkloadReplay]:
        """The n workloads with the most GPU-hours allocated (ties by workload key)."""
        ranked = sorted(self.workloads, key=lambda w: (-w.metrics.fraction_hours, w.workload.key))
        return ranked[:n]

    def as_dict(self) -> dict[str, Any]:
        return {
            "totals": self.totals.as_dict(),
            "workloads": [
                {
                    **w.metrics.as_dict(),
                    "namespace": w.workload.namespace,
                    "workload": w.workload.owner_name,
                    "final_fraction": w.final_fraction,
                }
                for w in self.workloads
            ],
        }


class Progress(Protocol):
    def __call__(self, advance: int) -> None: ...


def group_by_workload(points: Iterable[TracePoint]) -> dict[str, list[TracePoint]]:
    groups: dict[str, list[TracePoint]] = defaultdict(list)
    for p in points:
        groups[p.sample.workload.key].append(p)
    for series in groups.values():
        series.sort(key=lambda p: p.sample.timestamp)
    return dict(groups)


def _intervals(times: list[float]) -> list[float]:
    """Seconds each sample stands for: until the next one, gaps capped at 5 median steps."""
    if len(times) < 2:
        return [60.0] * len(times)
    steps = [b - a for a, b in pairwise(times)]
    median = sorted(steps)[len(steps) // 2] or 60.0
    cap = 5 * median
    return [min(s, cap) for s in steps] + [median]


def replay_workload(
    series: list[TracePoint],
    sizer: Sizer,
    keep_timeline: bool = False,
    usd_per_gpu_hour: float = 0.0,
) -> WorkloadReplay:
    times = [p.sample.timestamp.timestamp() for p in series]
    intervals = _intervals(times)
    alloc = sizer.initial(series[0].requested_fraction)
    state = sizer.start()
    m = Metrics(workloads=1)
    run_s = 0.0
    timeline: list[tuple[float, float, float, float]] = []
    for point, at, dt in zip(series, times, intervals, strict=True):
        s = point.sample
        share = s.memory_share
        m.samples += 1
        m.fraction_hours += alloc * dt / 3600
        m.whole_gpu_hours += dt / 3600
        compute_over = s.compute > alloc + _EPS
        memory_over = share > alloc + _EPS
        m.compute_overrun_samples += compute_over
        m.memory_overrun_samples += memory_over
        run_s = run_s + dt if (compute_over or memory_over) else 0.0
        m.longest_overrun_s = max(m.longest_overrun_s, run_s)
        if keep_timeline:
            timeline.append((at, s.compute, share, alloc))
        state, new = sizer.step(state, s.model_copy(update={"allocated_fraction": alloc}))
        if new is not None and not math.isclose(new, alloc):
            alloc = new
            m.resizes += 1
    m.allocated_cost_usd = m.fraction_hours * usd_per_gpu_hour
    m.whole_cost_usd = m.whole_gpu_hours * usd_per_gpu_hour
    return WorkloadReplay(series[0].sample.workload, m, alloc, timeline)


def replay(
    groups: dict[str, list[TracePoint]],
    sizer_factory: Callable[[], Sizer],
    progress: Progress | None = None,
    keep_timeline: bool = False,
    prices: GpuPrices | None = None,
) -> ReplayReport:
    """Every workload replayed on its own; GPU-hours priced by each workload's GPU model."""
    prices = prices or GpuPrices()
    totals = Metrics()
    results = []
    for key in sorted(groups):
        hourly = prices.hourly(groups[key][0].sample.gpu_model)
        result = replay_workload(groups[key], sizer_factory(), keep_timeline, hourly)
        totals.add(result.metrics)
        results.append(result)
        if progress is not None:
            progress(len(groups[key]))
    return ReplayReport(totals, results)
