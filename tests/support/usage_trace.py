"""Small usage traces in the replay CSV format (the columns ``fracpilot_libs.analysis.trace``
reads) for CLI tests."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

from fracpilot_libs.analysis.trace import REQUIRED_COLUMNS


def timestamp(at: datetime) -> str:
    """A UTC instant as the traces write it (``...Z``)."""
    return at.isoformat().replace("+00:00", "Z")


def write_usage_trace(
    path: Path, rows: Iterable[Sequence[object]], extra_columns: Sequence[str] = ()
) -> Path:
    """Write ``rows`` (one value per required trace column, then one per ``extra_columns``)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*REQUIRED_COLUMNS, *extra_columns])
        w.writerows(rows)
    return path
