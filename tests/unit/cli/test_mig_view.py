"""MIG recommendations in the CLI: ``fracpilot replay --mig`` on a small trace (text, JSON and
the mig-parted config it writes), the engine-need adapter, and the status column."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from factories import v1_policy
from fracpilot_cli.main import app
from fracpilot_cli.mig_view import choose_card, series_need, status_profile, with_report_section
from fracpilot_libs.contracts import Policy, UsageSample, WorkloadRef
from fracpilot_libs.mig.mig_parted import spec_problems
from fracpilot_libs.mig.profiles import A100_80GB, H100_80GB
from fracpilot_libs.sizing.engine import memory_need_of
from support.usage_trace import timestamp, write_usage_trace

GIB = 1024**3
DEVICE = 80 * GIB
T0 = datetime(2026, 3, 2, tzinfo=UTC)

# name: (compute, memory GiB, first minute, last minute)
WORKLOADS = {
    "tiny": (0.05, 2.0, 0, 180),  # 2 GiB + 8 GiB headroom = 10 GiB > 9.625: 1g.20gb
    "small": (0.05, 1.0, 0, 180),  # 9 GiB: 1g.10gb
    "busy": (0.45, 2.0, 0, 180),  # compute 0.45 / 0.85 = 0.53: 4g.40gb
    "mid": (0.2, 20.0, 60, 180),  # 28 GiB (20 + 8), compute 0.24: 3g.40gb
    "late": (0.05, 1.0, 200, 300),  # after "small" has gone: reuses its 1g.10gb
    "huge": (0.3, 72.0, 0, 100),  # 82.8 GiB: no profile, a whole GPU
}
EXPECTED = {
    "tiny": "1g.20gb",
    "small": "1g.10gb",
    "busy": "4g.40gb",
    "mid": "3g.40gb",
    "late": "1g.10gb",
    "huge": None,
}


def write_trace(path: Path, model: str = "") -> Path:
    gpu_model = [model] if model else []
    rows = [
        [
            timestamp(T0 + timedelta(minutes=m)),
            "ml",
            name,
            f"{name}-0",
            compute,
            int(memory * GIB),
            DEVICE,
            *gpu_model,
        ]
        for name, (compute, memory, first, last) in WORKLOADS.items()
        for m in range(first, last + 1)
    ]
    return write_usage_trace(path, rows, ["gpu_model"] if model else [])


def test_replay_mig_json_recommends_a_profile_per_workload_and_the_gpus(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv")
    config = tmp_path / "mig.yaml"
    result = CliRunner().invoke(
        app, ["replay", str(trace), "--json", "--mig", "--mig-config", str(config)]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {"totals", "workloads", "baseline"} <= set(document)  # today's keys kept
    mig = document["mig"]
    assert mig["card"] == "a100-80gb"
    assert mig["card_source"].startswith("assumed")
    got = {w["workload"]: w["profile"] for w in mig["workloads"]}
    assert got == EXPECTED
    # present at once: tiny, small, busy, mid, huge (late comes after small has gone)
    assert mig["peak_workloads"] == 5
    assert mig["instances"] == {"4g.40gb": 1, "3g.40gb": 1, "1g.20gb": 1, "1g.10gb": 1}
    # 4g+3g fill one card; 1g.20gb + 1g.10gb a second; the huge one a third without MIG
    assert mig["gpus"] == 3
    assert mig["whole_gpus_mig_disabled"] == 1
    written = yaml.safe_load(config.read_text())
    assert written == mig["mig_parted"]
    assert spec_problems(written) == []
    entries = written["mig-configs"]["fracpilot-node-1"]
    asked = {tuple(e["devices"]): (e["mig-enabled"], e.get("mig-devices")) for e in entries}
    assert asked == {
        (0,): (True, {"4g.40gb": 1, "3g.40gb": 1}),
        (1,): (True, {"1g.20gb": 1, "1g.10gb": 1}),
        (2,): (False, None),
    }


def test_replay_mig_text_and_the_card_from_the_trace(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", model="NVIDIA H100 80GB HBM3")
    result = CliRunner().invoke(app, ["replay", str(trace), "--mig"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "MIG profiles on H100 80GB (GPU model NVIDIA H100 80GB HBM3)" in out
    assert "ml/busy" in out
    assert "4g.40gb" in out
    assert "whole GPU (no MIG)" in out
    assert "MIG GPUs needed: 3 on 1 node(s), against 5 whole GPUs" in out
    assert "node-1 gpu 0: 4g.40gb@0  3g.40gb@4" in out


def test_replay_mig_refuses_a_card_it_does_not_model(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", model="Tesla T4")
    result = CliRunner().invoke(app, ["replay", str(trace), "--mig"])
    assert result.exit_code == 2
    assert "no MIG profile table" in result.output
    result = CliRunner().invoke(app, ["replay", str(trace), "--mig-gpu", "rtx-pro-5000"])
    assert result.exit_code == 2
    assert "not a MIG card modelled here" in result.output


def sample(minute: int, compute: float, memory_gib: float) -> UsageSample:
    return UsageSample(
        sample_id=str(minute),
        workload=WorkloadRef(cluster="c", namespace="ml", owner_name="w"),
        pod="w-0",
        timestamp=T0 + timedelta(minutes=minute),
        compute=compute,
        memory_used_bytes=int(memory_gib * GIB),
        memory_total_bytes=DEVICE,
        source="test",
    )


def test_the_need_is_the_engine_s_largest_over_the_series() -> None:
    policy = v1_policy()  # p95 / target utilization, 1 h of history (the defaults before v2)
    # memory peaks early and falls: the need keeps the peak (a partition is static)
    samples = [sample(m, 0.1, 30.0 if m < 10 else 5.0) for m in range(120)]
    need = series_need("w", samples, policy)
    assert need.memory_bytes == pytest.approx(memory_need_of(30 / 80, policy) * DEVICE, abs=1)
    assert need.compute_share == pytest.approx(0.1 / policy.target_utilization)
    # a burst in the first minutes, the p95 of a short history, does not size compute: it is
    # trusted from min_history_s on, when the burst is under 5% of the samples
    early = [sample(m, 0.9 if m < 2 else 0.1, 5.0) for m in range(120)]
    assert series_need("w", early, policy).compute_share == pytest.approx(0.1 / 0.85)
    short = early[:30]  # shorter than min_history_s: the need at its last sample
    assert series_need("w", short, policy).compute_share == pytest.approx(0.9 / 0.85)


def test_status_column() -> None:
    model = "NVIDIA A100-SXM4-80GB"
    assert status_profile(model, 0.1, 0.1, DEVICE) == "1g.10gb"  # 8 GiB
    assert status_profile(model, 0.3, 0.1, DEVICE) == "3g.40gb"  # 24 GiB
    assert status_profile(model, 1.05, 0.1, DEVICE) == "whole"
    assert status_profile("Tesla T4", 0.1, 0.1, DEVICE) == "-"
    assert status_profile(model, None, None, DEVICE) == "-"


def test_card_choice() -> None:
    assert choose_card("h100-80gb", ["NVIDIA A100-SXM4-80GB"])[0] is H100_80GB
    assert choose_card("", ["", "NVIDIA A100-SXM4-80GB"])[0] is A100_80GB
    card, source = choose_card("", [""])
    assert card is A100_80GB
    assert source.startswith("assumed")


def placed(s: UsageSample, node: str, model: str) -> UsageSample:
    return s.model_copy(update={"node": node, "gpu_model": model})


def test_the_report_gets_a_mig_section_for_mig_cards_or_when_asked() -> None:
    page = "<html><body><h2>Fleet</h2></body></html>"
    a100 = "NVIDIA A100-SXM4-80GB"
    samples = [placed(sample(m, 0.1, 20.0), "gpu-node-1", a100) for m in range(90)]
    document, html_page = with_report_section({"fleet": {}}, page, samples, None, False)
    mig = document["mig"]
    assert mig["card"] == "a100-80gb"
    assert [w["profile"] for w in mig["workloads"]] == ["3g.40gb"]  # 28 GiB
    assert list(mig["nodes"]) == ["gpu-node-1"]
    assert mig["nodes"]["gpu-node-1"]["config"] == "fracpilot-gpu-node-1"
    assert spec_problems(mig["mig_parted"]) == []
    assert html_page.index("MIG profiles (A100 80GB)") < html_page.index("</body>")
    assert "fracpilot-gpu-node-1" in html_page

    t4 = [placed(s, "n", "Tesla T4") for s in samples]
    assert with_report_section({"fleet": {}}, page, t4, None, False) == ({"fleet": {}}, page)
    document, _ = with_report_section({}, page, t4, None, True)  # asked: says why not
    assert "no MIG profile table" in document["mig"]["error"]
    unknown = [placed(s, "n", "") for s in samples]
    document, _ = with_report_section({}, page, unknown, None, True)
    assert document["mig"]["card_source"].startswith("assumed")
    assert with_report_section({}, page, [], None, True) == ({}, page)


def test_status_wide_shows_the_recommended_profile() -> None:
    from fracpilot_cli import render
    from fracpilot_cli.status import FleetSnapshot, build_status_rows
    from fracpilot_libs.nats import subjects
    from fracpilot_libs.pricing import GpuPrices
    from fracpilot_libs.sizing.observation import observe
    from fracpilot_libs.sizing.state import WorkloadState

    policy = Policy()
    series = [placed(sample(m, 0.3, 20.0), "n1", "NVIDIA H100 80GB HBM3") for m in range(30)]
    state = WorkloadState()
    for s in series:
        state = observe(state, s, policy, s.timestamp.timestamp())
    snapshot = FleetSnapshot()
    key = subjects.kv_key(series[0].workload)
    snapshot.states[key] = state
    snapshot.samples[key] = series[-1]
    rows = build_status_rows(snapshot, lambda _: policy, GpuPrices(), series[-1].timestamp)
    assert rows[0].mig_profile == "3g.40gb"  # 28 GiB, compute 0.3 / 0.85 = 0.35
    assert "MIG-PROFILE" in render.WIDE_COLUMNS
    assert "MIG-PROFILE" not in render.COLUMNS
    cells = render.status_cells(rows[0], wide=True)
    assert cells[render.WIDE_COLUMNS.index("MIG-PROFILE")] == "3g.40gb"
    assert rows[0].as_dict()["mig_profile"] == "3g.40gb"
