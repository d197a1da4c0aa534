"""``fracpilot replay --pack --isolation shared|enforced``: the isolation mode and its figures in
the packed JSON (issue 25's keys), today's output when no mode is given."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fracpilot_cli.main import app
from support.usage_trace import timestamp, write_usage_trace

DEVICE = 80 * 1024**3
T0 = datetime(2026, 3, 2, tzinfo=UTC)
TOTALS_KEYS = {
    "savings_pct",
    "memory_overrun_pct",
    "compute_overrun_pct",
    "resizes_per_workload_day",
}
PACKED_KEYS = {
    "isolation",
    "card_hours_saved_pct",
    "memory_collision_samples",
    "memory_collision_pct",
    "contention_pct",
    "moves_per_workload_day",
}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four small steady workloads over six hours."""
    rows = (
        (
            timestamp(T0 + timedelta(minutes=m)),
            "inference",
            f"w{i}",
            f"w{i}-0",
            0.05 + 0.01 * i,
            int((0.1 + 0.02 * i) * DEVICE),
            DEVICE,
        )
        for m in range(360)
        for i in range(4)
    )
    return write_usage_trace(tmp_path / "trace.csv", rows)


def run_json(*args: str | Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["replay", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


@pytest.mark.parametrize("mode", ["shared", "enforced"])
def test_each_mode_reports_its_figures_beside_the_baseline(trace: Path, mode: str) -> None:
    out = run_json(trace, "--pack", "--isolation", mode, "--baseline", "vpa")
    assert out["totals"].keys() >= TOTALS_KEYS
    for part in ("totals", "baseline"):
        packed = out[part]["packed"]
        assert packed.keys() >= PACKED_KEYS
        assert packed["isolation"] == mode
        assert packed["memory_collision_pct"] == 0.0
    assert out["totals"]["packed"]["card_hours_saved_pct"] > 50


def test_no_mode_keeps_todays_figures(trace: Path) -> None:
    plain = run_json(trace, "--pack")
    assert plain["totals"]["packed"]["isolation"] is None
    enforced = run_json(trace, "--pack", "--isolation", "enforced")
    # same trace, no memory jumps: the modes differ in headroom, today's figures stay today's
    assert plain["totals"]["packed"]["card_samples"] > 0
    assert enforced["totals"]["samples"] == plain["totals"]["samples"]


def test_an_unknown_mode_is_refused(trace: Path) -> None:
    result = CliRunner().invoke(app, ["replay", str(trace), "--pack", "--isolation", "capped"])
    assert result.exit_code == 2
