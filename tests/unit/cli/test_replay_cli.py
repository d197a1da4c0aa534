"""``fracpilot replay`` on small traces written by the tests: the JSON it prints, the baselines,
the errors it reports, and the plot it draws."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fracpilot_cli import replay as replay_cli
from fracpilot_cli.main import app
from support.usage_trace import timestamp, write_usage_trace

GIB = 1024**3
DEVICE = 80 * GIB
T0 = datetime(2026, 3, 2, tzinfo=UTC)
METRIC_KEYS = {
    "samples",
    "workloads",
    "fraction_hours",
    "whole_gpu_hours",
    "savings_pct",
    "compute_overrun_pct",
    "memory_overrun_samples",
    "memory_overrun_pct",
    "resizes",
    "resizes_per_workload_day",
    "longest_overrun_s",
    "allocated_cost_usd",
    "whole_cost_usd",
    "cost_saved_usd",
}
WORKLOAD_KEYS = METRIC_KEYS | {"namespace", "workload", "final_fraction"}

# (compute, memory share) of a workload at minute m
Usage = Callable[[int, random.Random], tuple[float, float]]


def _steady(m: int, rng: random.Random) -> tuple[float, float]:
    return min(1.0, 0.08 + 0.04 * rng.random()), 0.22


def _memory_grows(m: int, rng: random.Random) -> tuple[float, float]:
    return min(1.0, 0.1 + 0.05 * rng.random()), 0.2 if m < 240 else 0.45


def _bursty(m: int, rng: random.Random) -> tuple[float, float]:
    burst = rng.random() < 0.05
    return (0.9 if burst else 0.15 * rng.random()), 0.3


WORKLOADS: dict[str, Usage] = {"steady": _steady, "grows": _memory_grows, "bursty": _bursty}


def write_trace(
    path: Path,
    workloads: dict[str, Usage] | None = None,
    minutes: int = 360,
    requested: float | None = None,
    extra_rows: Iterable[list[str]] = (),
) -> Path:
    """A trace of one sample a minute per workload, rows interleaved in time order."""
    rng = random.Random(7)
    rows: list[Sequence[object]] = []
    for m in range(minutes):
        at = timestamp(T0 + timedelta(minutes=m))
        for name, usage in (workloads or WORKLOADS).items():
            compute, share = usage(m, rng)
            row: list[object] = [at, "inference", name, f"{name}-0", f"{compute:.4f}"]
            row += [str(int(share * DEVICE)), str(DEVICE)]
            if requested is not None:
                row.append(str(requested))
            rows.append(row)
    rows += extra_rows
    return write_usage_trace(path, rows, ["requested_fraction"] if requested is not None else [])


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.csv")


def run(*args: str | Path, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["replay", *map(str, args)], env=env)


def run_json(*args: str | Path) -> dict[str, Any]:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)  # the whole of stdout: one object
    return parsed


def test_json_has_exactly_the_documented_keys(trace: Path) -> None:
    out = run_json(trace)
    assert set(out) == {"totals", "workloads", "baseline"}
    assert set(out["totals"]) == METRIC_KEYS
    assert out["baseline"] is None
    assert len(out["workloads"]) == 3
    for w in out["workloads"]:
        assert set(w) == WORKLOAD_KEYS
        assert w["namespace"] == "inference"
    assert [w["workload"] for w in out["workloads"]] == ["bursty", "grows", "steady"]
    with_baseline = run_json(trace, "--baseline", "vpa")
    assert set(with_baseline["baseline"]) == METRIC_KEYS
    assert with_baseline["baseline"]["samples"] == with_baseline["totals"]["samples"] == 3 * 360


def test_totals_are_the_sum_over_workloads(trace: Path) -> None:
    out = run_json(trace)
    totals, workloads = out["totals"], out["workloads"]
    for key in ("samples", "workloads", "memory_overrun_samples", "resizes"):
        assert totals[key] == sum(w[key] for w in workloads), key
    for key in ("fraction_hours", "whole_gpu_hours"):  # rounded to 4 places each
        assert totals[key] == pytest.approx(sum(w[key] for w in workloads), abs=1e-3), key
    assert totals["longest_overrun_s"] == max(w["longest_overrun_s"] for w in workloads)
    assert totals["whole_gpu_hours"] == pytest.approx(3 * 6.0)
    # The engine does something on this trace: it saves, and it resizes.
    assert totals["savings_pct"] > 30
    assert totals["resizes"] >= 3
    grows = next(w for w in workloads if w["workload"] == "grows")
    assert grows["final_fraction"] >= 0.55  # memory 0.45 + 0.1 headroom, on the 0.01 grid


def test_money_saved_prices_gpu_hours_by_model(
    tmp_path: Path, trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = run_json(trace, "--gpu-model", "NVIDIA H100 80GB HBM3")
    totals = out["totals"]
    assert totals["whole_cost_usd"] == pytest.approx(totals["whole_gpu_hours"] * 4.50, abs=0.01)
    assert totals["cost_saved_usd"] == pytest.approx(
        (totals["whole_gpu_hours"] - totals["fraction_hours"]) * 4.50, abs=0.02
    )
    static = run_json(trace, "--baseline", "static:0.5", "--gpu-model", "T4")["baseline"]
    assert static["cost_saved_usd"] == pytest.approx(static["whole_gpu_hours"] * 0.55 / 2, abs=0.01)
    # A trace column names the model per row; the user's own price table wins.
    monkeypatch.setenv("FRACPILOT_GPU_PRICES", '{"B200": 8.0}')
    monkeypatch.setenv("FRACPILOT_GPU_DEFAULT_PRICE", "1.0")
    with_model = tmp_path / "with_model.csv"
    rows = trace.read_text().splitlines()
    models = ["gpu_model"] + ["NVIDIA B200" if "steady" in r else "" for r in rows[1:]]
    with_model.write_text("\n".join(f"{r},{m}" for r, m in zip(rows, models, strict=True)))
    out = run_json(with_model)
    by_name = {w["workload"]: w for w in out["workloads"]}
    assert by_name["steady"]["whole_cost_usd"] == pytest.approx(6.0 * 8.0)
    assert by_name["bursty"]["whole_cost_usd"] == pytest.approx(6.0 * 1.0)
    bad = run(trace, "--json", env={"FRACPILOT_GPU_PRICES": '{"B200": "lots"}'})
    assert bad.exit_code == 2
    assert "invalid price settings" in bad.stderr


def test_whole_gpu_baseline_saves_nothing_and_never_resizes(trace: Path) -> None:
    base = run_json(trace, "--baseline", "whole")["baseline"]
    assert base["savings_pct"] == 0
    assert base["resizes"] == 0
    assert base["compute_overrun_pct"] == 0
    assert base["memory_overrun_samples"] == 0


def test_static_half_baseline_saves_half(trace: Path) -> None:
    base = run_json(trace, "--baseline", "static:0.5")["baseline"]
    assert base["savings_pct"] == 50.0
    assert base["resizes"] == 0
    assert base["fraction_hours"] == pytest.approx(base["whole_gpu_hours"] / 2)
    off_grid = run_json(trace, "--baseline", "static:0.3")["baseline"]  # on no grid
    assert off_grid["savings_pct"] == 70.0


@pytest.mark.parametrize(
    "spec",
    ["static:0", "static:1.5", "static:-1", "static:x", "static:nan", "static", "whole:1", "hpa"],
)
def test_a_bad_baseline_is_refused(trace: Path, spec: str) -> None:
    result = run(trace, "--baseline", spec, "--json")
    assert result.exit_code == 2
    assert "--baseline" in result.stderr
    assert result.stdout == ""


def test_a_requested_fraction_column_is_the_starting_fraction(tmp_path: Path) -> None:
    def constant(m: int, rng: random.Random) -> tuple[float, float]:
        return 0.3, 0.3  # needs 0.4 (memory + 0.1 headroom), less than a downsize below 0.45

    requested = write_trace(tmp_path / "req.csv", {"flat": constant}, 180, requested=0.45)
    w = run_json(requested)["workloads"][0]
    assert (w["savings_pct"], w["resizes"], w["final_fraction"]) == (55.0, 0, 0.45)
    # Without the column the pod starts on a whole GPU and is downsized once.
    whole = write_trace(tmp_path / "whole.csv", {"flat": constant}, 180)
    w = run_json(whole)["workloads"][0]
    assert w["resizes"] == 1
    assert w["final_fraction"] == 0.4
    assert w["savings_pct"] < 60


def test_malformed_row_names_its_line_and_exits_2(tmp_path: Path) -> None:
    bad_row = [["2026-03-02T10:00:00Z", "inference", "steady", "steady-0", "lots", "1", "2"]]
    path = write_trace(tmp_path / "bad.csv", minutes=10, extra_rows=bad_row)
    result = run(path, "--json")
    assert result.exit_code == 2
    bad_line = 1 + 3 * 10 + 1  # header, 30 good rows, then the bad one
    assert f"bad.csv:{bad_line}:" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (["2026-03-02T10:00:00Z", "inference", "steady", "steady-0", "0.5"], "expected 7 fields"),
        (["yesterday", "inference", "steady", "steady-0", "0.5", "1", "2"], "yesterday"),
        (["2026-03-02T10:00:00Z", "inference", "steady", "steady-0", "1.5", "1", "2"], "compute"),
        (["2026-03-02T10:00:00Z", "inference", "steady", "steady-0", "0.5", "3", "2"], "exceeds"),
    ],
)
def test_each_kind_of_bad_row_is_a_clear_error(tmp_path: Path, row: list[str], says: str) -> None:
    path = write_trace(tmp_path / "bad.csv", minutes=2, extra_rows=[row])
    result = run(path)
    assert result.exit_code == 2
    assert "bad.csv:8:" in result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_requested_fraction_is_a_clear_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "req.csv", minutes=2, requested=1.5)
    result = run(path)
    assert result.exit_code == 2
    assert "req.csv:2:" in result.stderr
    assert "requested_fraction" in result.stderr


def test_missing_file_missing_column_and_empty_trace_exit_2(tmp_path: Path) -> None:
    missing = run(tmp_path / "nope.csv.gz")
    assert missing.exit_code == 2
    assert "not found" in missing.stderr
    no_column = tmp_path / "cols.csv"
    no_column.write_text("timestamp,namespace,workload\n")
    result = run(no_column)
    assert result.exit_code == 2
    assert "missing column(s) pod" in result.stderr
    empty = tmp_path / "empty.csv"
    write_usage_trace(empty, [])
    result = run(empty)
    assert result.exit_code == 2
    assert "no samples" in result.stderr
    not_gzip = tmp_path / "fake.csv.gz"
    not_gzip.write_text("hello")
    result = run(not_gzip)
    assert result.exit_code == 2
    assert "cannot read trace" in result.stderr
    for r in (missing, result):
        assert "Traceback" not in r.output


def test_policy_file_is_validated(tmp_path: Path, trace: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"grid_steps": 0, "target_utilization": 3}))
    result = run(trace, "--policy", bad)
    assert result.exit_code == 2
    assert "invalid policy" in result.stderr
    assert "grid_steps" in result.stderr
    assert "target_utilization" in result.stderr
    assert "Traceback" not in result.output
    not_json = tmp_path / "not.json"
    not_json.write_text("grid_steps: 4")
    assert run(trace, "--policy", not_json).exit_code == 2
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"grid_stepz": 4}))
    result = run(trace, "--policy", unknown)
    assert result.exit_code == 2
    assert "grid_stepz" in result.stderr
    result = run(trace, "--policy", tmp_path / "absent.json")
    assert result.exit_code == 2
    assert "cannot read policy" in result.stderr


def test_policy_file_drives_the_engine_and_the_vpa_grid(tmp_path: Path, trace: Path) -> None:
    quarters = tmp_path / "quarters.json"
    quarters.write_text(json.dumps({"grid_steps": 4, "min_fraction": 0.25}))
    out = run_json(trace, "--policy", quarters, "--baseline", "vpa")
    for w in out["workloads"]:
        assert math.isclose(w["final_fraction"] * 4, round(w["final_fraction"] * 4))
    assert out != run_json(trace, "--baseline", "vpa")


def test_output_is_deterministic(trace: Path) -> None:
    first = run(trace, "--json", "--baseline", "vpa")
    second = run(trace, "--json", "--baseline", "vpa")
    assert first.exit_code == second.exit_code == 0
    assert first.stdout == second.stdout


def test_progress_goes_to_stderr_and_never_into_the_json(
    trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_cli, "LONG_TRACE", 1)  # this trace counts as long
    result = run(trace, "--json", "--baseline", "whole")
    assert result.exit_code == 0
    assert "replay fracpilot" in result.stderr
    assert "replay whole" in result.stderr
    assert json.loads(result.stdout)["totals"]["samples"] == 3 * 360


def test_default_output_is_a_table_with_the_baseline_beside(trace: Path) -> None:
    result = run(trace, "--baseline", "static:0.5", "--top", "2")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "fracpilot" in out
    assert "baseline static:0.5" in out
    assert "savings" in out
    assert "50.0%" in out
    assert "top 2 of 3 workloads" in out
    assert sum(f"inference/{name}" in out for name in WORKLOADS) == 2


def test_plot_writes_a_png(tmp_path: Path, trace: Path) -> None:
    png = tmp_path / "replay.png"
    result = run(trace, "--baseline", "vpa", "--plot", png, "--json")
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)  # the plot's message went to stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_plot_into_a_missing_directory_fails_before_replaying(tmp_path: Path, trace: Path) -> None:
    result = run(trace, "--plot", tmp_path / "no" / "such" / "dir.png")
    assert result.exit_code == 2
    assert "--plot" in result.stderr
