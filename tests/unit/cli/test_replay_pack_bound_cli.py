"""``fracpilot replay --pack-bound``: the bounds in the JSON's totals and as a table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fracpilot_cli.main import app
from support.usage_trace import timestamp, write_usage_trace

DEVICE = 80 * 1024**3
T0 = datetime(2026, 3, 2, tzinfo=UTC)
MEMORY = int(0.2 * DEVICE)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four workloads for two hours, each using 0.2 of the device's memory and little compute:
    repacked from scratch, the four share one card."""
    rows = (
        (
            timestamp(T0 + timedelta(minutes=m)),
            "inference",
            f"w{i}",
            f"w{i}-0",
            0.05,
            MEMORY,
            DEVICE,
        )
        for m in range(120)
        for i in range(4)
    )
    return write_usage_trace(tmp_path / "trace.csv", rows)


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
    # memory sizes these pods: as two parts the memory is the same and the cores fewer
    assert bound["fractions_saved_pct"] <= bound["fractions_two_part_saved_pct"] < 75.0


def test_the_table_lists_the_bounds(trace: Path) -> None:
    result = CliRunner().invoke(app, ["replay", str(trace), "--pack-bound"])
    assert result.exit_code == 0, result.output
    assert "repacked from scratch" in result.output
    assert "whole-trace memory peak + 0.1" in result.output
    assert "as two parts on HAMi" in result.output
