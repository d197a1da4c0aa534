"""``fracpilot replay --pack-bound``: the bounds in the JSON's totals and as a table."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fracpilot_cli.main import app

DEVICE = 80 * 1024**3
T0 = datetime(2026, 3, 2, tzinfo=UTC)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four workloads for two hours, each using 0.2 of the device's memory and little compute:
    repacked from scratch, the four share one card."""
    path = tmp_path / "trace.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "timestamp",
                "namespace",
                "workload",
                "pod",
                "gpu_util",
                "gpu_mem_used_bytes",
                "gpu_mem_total_bytes",
            ]
        )
        for m in range(120):
            at = (T0 + timedelta(minutes=m)).isoformat().replace("+00:00", "Z")
            for i in range(4):
                w.writerow([at, "inference", f"w{i}", f"w{i}-0", 0.05, int(0.2 * DEVICE), DEVICE])
    return path


def test_the_json_carries_the_bounds(trace: Path) -> None:
    result = CliRunner().invoke(app, ["replay", str(trace), "--pack-bound", "--json"])
    assert result.exit_code == 0, result.output
    bound = json.loads(result.output)["totals"]["pack_bound"]
    # one card for four: 75% saved, and no packing does better
    assert bound["actual_saved_pct"] == pytest.approx(75.0)
    assert bound["actual_saved_pct_at_most"] == pytest.approx(75.0)
    peaks = {s["headroom"]: s["saved_pct"] for s in bound["static_peak"]}
    assert peaks[0.0] == pytest.approx(75.0)
    # 0.3 each: three to a card, so two cards for four
    assert peaks[0.1] == pytest.approx(50.0)
    # the policy's fractions start at whole GPUs and come down: fewer cards saved than the bound
    assert 0.0 <= bound["fractions_saved_pct"] < 75.0


def test_the_table_lists_the_bounds(trace: Path) -> None:
    result = CliRunner().invoke(app, ["replay", str(trace), "--pack-bound"])
    assert result.exit_code == 0, result.output
    assert "repacked from scratch" in result.output
    assert "whole-trace memory peak + 0.1" in result.output
