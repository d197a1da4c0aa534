"""Usage traces: the CSV that ``fracpilot replay`` and the engine bench read.

A trace is a CSV (or CSV.gz) with ``timestamp,namespace,workload,pod,gpu_util,
gpu_mem_used_bytes,gpu_mem_total_bytes`` and optional ``requested_fraction`` (the starting
fraction; default 1.0; a static baseline holds its own fraction from the start) and
``gpu_model`` (prices the GPU-hours; the caller's default model otherwise), and the application
signals ``waiting_requests`` and ``kv_cache_usage`` (vLLM's queue and KV-cache use, 0..1: the
engine sizes compute by them as it does in the service), ``kv_pool_bytes`` and ``llm_server``
(a server that preallocates its KV cache, ``vllm``, ``sglang`` or ``tgi``, and its KV pool in
bytes: with ``kv_cache_usage`` the engine sizes its memory from the fixed part plus the KV cache
used, :mod:`fracpilot_libs.sizing.kv_memory`; ``kv_pool_tokens`` and
``kv_max_sequence_tokens``: the pool in tokens, from which the engine learns its bytes across
two pool sizes, and the longest sequence, the pool's minimum), and ``isolation`` (``shared`` or
``enforced``: how the pod's GPU holds it to its memory, for ``replay --pack``; empty: the mode
given on the command line). Rows are read as
validated samples, grouped by workload in time order (:mod:`fracpilot_libs.analysis.replay`
replays them).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fracpilot_libs.contracts import AppSignals, UsageSample, WorkloadRef
from fracpilot_libs.placement.card_budget import Isolation

REQUIRED_COLUMNS = (
    "timestamp",
    "namespace",
    "workload",
    "pod",
    "gpu_util",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
)


class TraceError(ValueError):
    """The trace cannot be read: a missing column, or a row that does not parse."""


@dataclass(frozen=True, slots=True)
class TracePoint:
    sample: UsageSample
    requested_fraction: float | None
    isolation: Isolation | None = None  # the trace's isolation column; None: not given


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
    ("waiting_requests", int, "a whole number"),
    ("kv_cache_usage", float, "a number"),
    ("kv_pool_bytes", int, "a whole number of bytes"),
    ("kv_pool_tokens", int, "a whole number of tokens"),
    ("kv_max_sequence_tokens", int, "a whole number of tokens"),
)
_SIGNAL_COLUMNS = frozenset(
    {
        "waiting_requests",
        "kv_cache_usage",
        "kv_pool_bytes",
        "llm_server",
        "kv_pool_tokens",
        "kv_max_sequence_tokens",
    }
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


def _signals(row: dict[str | Any, str | Any]) -> AppSignals | None:
    """The row's application signals (empty cells: not reported)."""
    waiting, kv = row.get("waiting_requests"), row.get("kv_cache_usage")
    pool, server = row.get("kv_pool_bytes"), row.get("llm_server")
    tokens, longest = row.get("kv_pool_tokens"), row.get("kv_max_sequence_tokens")
    if not waiting and not kv and not pool and not server and not tokens and not longest:
        return None
    return AppSignals(
        waiting_requests=int(waiting) if waiting else None,
        kv_cache_usage=float(kv) if kv else None,
        kv_pool_bytes=int(pool) if pool else None,
        llm_server=server or None,
        kv_pool_tokens=int(tokens) if tokens else None,
        kv_max_sequence_tokens=int(longest) if longest else None,
    )


def _isolation(text: str) -> Isolation | None:
    if not text:
        return None
    try:
        return Isolation(text.strip().lower())
    except ValueError:
        raise ValueError(f"isolation {text!r} is not shared or enforced") from None


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
        has_signals = bool(_SIGNAL_COLUMNS & set(reader.fieldnames or []))
        has_isolation = "isolation" in (reader.fieldnames or [])
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
                    signals=_signals(row) if has_signals else None,
                )
                requested = (
                    float(row["requested_fraction"])
                    if has_requested and row["requested_fraction"]
                    else None
                )
                if requested is not None and not 0.0 < requested <= 1.0:
                    raise ValueError(f"requested_fraction {requested} is not in (0, 1]")
                isolation = _isolation(row["isolation"]) if has_isolation else None
            except ValidationError as exc:
                raise TraceError(f"{path}:{line}: {_describe(exc)}") from exc
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {_which_field(row, exc)}") from exc
            yield TracePoint(sample, requested, isolation)


def group_by_workload(points: Iterable[TracePoint]) -> dict[str, list[TracePoint]]:
    groups: dict[str, list[TracePoint]] = defaultdict(list)
    for p in points:
        groups[p.sample.workload.key].append(p)
    for series in groups.values():
        series.sort(key=lambda p: p.sample.timestamp)
    return dict(groups)
