"""Small usage traces in the replay CSV format (../shared/data README columns) for CLI tests."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

COLUMNS = (
    "timestamp",
    "namespace",
    "workload",
    "pod",
    "gpu_util",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
)


def timestamp(at: datetime) -> str:
    """A UTC instant as the traces write it (``...Z``)."""
    return at.isoformat().replace("+00:00", "Z")


def write_usage_trace(
    path: Path, rows: Iterable[Sequence[object]], extra_columns: Sequence[str] = ()
) -> Path:
    """Write ``rows`` (one value per column of :data:`COLUMNS`, then ``extra_columns``)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*COLUMNS, *extra_columns])
        w.writerows(rows)
    return path
