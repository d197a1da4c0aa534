"""``fracpilot replay --pack`` and ``--gpus N``: the packed objects in the JSON beside today's
keys, the packed table, and the cards panel of the plot."""

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
PACKED_KEYS = {
    "card_hours",
    "whole_card_hours",
    "card_hours_saved_pct",
    "contention_pct",
    "memory_collision_samples",
    "moves_per_workload_day",
}


MEMORY = int(0.1 * DEVICE)


def util(minute: int, i: int) -> float:
    return 0.05 + 0.01 * ((minute * (i + 3)) % 5)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Four small steady workloads over six hours: they fit four to a card once sized."""
    rows = (
        (
            timestamp(T0 + timedelta(minutes=m)),
            "inference",
            f"w{i}",
            f"w{i}-0",
            util(m, i),
            MEMORY,
            DEVICE,
        )
        for m in range(360)
        for i in range(4)
    )
    return write_usage_trace(tmp_path / "trace.csv", rows)


def run(*args: str | Path) -> Any:
    return CliRunner().invoke(app, ["replay", *map(str, args)])


def run_json(*args: str | Path) -> dict[str, Any]:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_pack_adds_a_packed_object_to_totals_and_baseline_and_keeps_todays_keys(
    trace: Path,
) -> None:
    plain = run_json(trace, "--baseline", "vpa")
    packed = run_json(trace, "--baseline", "vpa", "--pack")
    for part in ("totals", "baseline"):
        assert packed[part]["packed"].keys() >= PACKED_KEYS
        assert {k: v for k, v in packed[part].items() if k != "packed"} == plain[part]
    assert packed["workloads"] == plain["workloads"]
    assert "packed" not in plain["totals"]
    ours = packed["totals"]["packed"]
    # Unpinned, every sample is placed: the whole-card figure is today's whole GPU-hours.
    assert ours["whole_card_hours"] == pytest.approx(plain["totals"]["whole_gpu_hours"], abs=1e-3)
    assert 0 < ours["card_hours"] <= ours["whole_card_hours"]
    assert ours["card_hours"] >= plain["totals"]["fraction_hours"] - 1e-3
    assert ours["memory_collision_samples"] == 0
    assert ours["card_hours_saved_pct"] > 0  # four small workloads end up sharing cards


def test_gpus_implies_pack_and_reports_what_did_not_fit(trace: Path) -> None:
    out = run_json(trace, "--gpus", "1", "--baseline", "whole")
    ours, whole = out["totals"]["packed"], out["baseline"]["packed"]
    assert ours["gpus"] == whole["gpus"] == 1
    # Whole GPUs: one card holds one workload; the three others never fit.
    assert whole["unplaced_workloads"] == 3
    assert whole["peak_cards"] == 1
    # fracpilot starts at whole GPUs too, so the same three wait for a card.
    assert ours["unplaced_workloads"] >= 1
    assert ours["peak_cards"] <= 1


def test_table_shows_the_packed_table_beside_todays(trace: Path) -> None:
    result = CliRunner().invoke(
        app, ["replay", str(trace), "--pack", "--baseline", "vpa"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "replay of trace.csv" in result.stdout
    assert "packed on GPUs" in result.stdout
    for label in ("card-hours saved", "compute contention", "memory collisions", "moves per"):
        assert label in result.stdout
    assert "baseline vpa" in result.stdout


def test_gpus_must_be_positive(trace: Path) -> None:
    assert run(trace, "--gpus", "0").exit_code == 2


def test_plot_with_pack_draws_the_cards_panel(tmp_path: Path, trace: Path) -> None:
    png = tmp_path / "replay.png"
    result = run(trace, "--pack", "--plot", png, "--json")
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = tmp_path / "plain.png"
    assert run(trace, "--plot", plain, "--json").exit_code == 0
    # The cards panel makes the figure taller: a larger picture than without --pack.
    assert _png_height(png) > _png_height(plain)


def _png_height(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")


@pytest.mark.parametrize("isolation", ["enforced", "shared"])
def test_gpus_per_node_reports_nodes_and_the_cards_freed_as_whole_nodes(
    trace: Path, isolation: str
) -> None:
    single = run_json(trace, "--pack", "--isolation", isolation)["totals"]["packed"]
    nodes = run_json(trace, "--pack", "--isolation", isolation, "--gpus-per-node", "4")
    packed = nodes["totals"]["packed"]
    n = packed["nodes"]
    # One card a node: every card freed is a node freed.
    assert single["nodes"]["freed_on_whole_nodes_pct"] == pytest.approx(100.0)
    assert single["nodes"]["node_hours"] == pytest.approx(single["card_hours"], abs=1e-3)
    # Four workloads on nodes of four: the baseline needs one node all along, so no node is
    # given back, however many cards are: the freed cards idle on the node that stays.
    assert n["gpus_per_node"] == 4
    assert n["whole_node_hours"] == pytest.approx(6.0, abs=0.05)
    assert n["node_hours"] == pytest.approx(n["whole_node_hours"], abs=1e-3)
    assert n["freed_on_whole_nodes_card_hours"] == pytest.approx(0.0, abs=1e-3)
    assert packed["card_hours_saved_pct"] > 0


def test_pinned_gpus_must_fill_whole_nodes(trace: Path) -> None:
    result = run(trace, "--gpus", "3", "--gpus-per-node", "2")
    assert result.exit_code == 2  # a usage error, as the CLI's others
    assert "whole number of nodes" in result.output
