"""``fracpilot replay`` as a separate process on the real GenAI serving trace (72 pods, 23 h).

The acceptance numbers for the default policy: at least 35% of GPU-hours saved, memory
overruns in at most 0.01% of samples and fewer than the VPA-style baseline's (or none),
compute overruns in at most 0.5% of samples, and at most 4 resizes per workload-day.
Run with ``pytest -s`` to see the totals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

TRACE = Path(
    os.environ.get(
        "FRACPILOT_GENAI_TRACE",
        Path(__file__).resolve().parents[2].parent / "shared/data/genai_public.csv.gz",
    )
)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    if not TRACE.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"the GenAI trace is missing at {TRACE}")
        pytest.skip(f"the GenAI trace is not at {TRACE} (set FRACPILOT_GENAI_TRACE)")
    png = tmp_path_factory.mktemp("replay") / "genai.png"
    cmd = [sys.executable, "-m", "fracpilot_cli.main", "replay", str(TRACE)]
    cmd += ["--baseline", "vpa", "--json", "--plot", str(png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)  # stdout holds the JSON object and nothing else
    return out, png, proc.stderr


def test_default_policy_meets_the_acceptance_numbers(
    replayed: tuple[dict[str, Any], Path, str],
) -> None:
    out, _, _ = replayed
    totals, vpa = out["totals"], out["baseline"]
    print()
    print("fracpilot:", json.dumps(totals))
    print("vpa:      ", json.dumps(vpa))
    assert totals["samples"] == vpa["samples"] > 80_000
    assert totals["workloads"] == len(out["workloads"]) == 72
    assert totals["savings_pct"] >= 35
    assert totals["memory_overrun_pct"] <= 0.01
    assert totals["compute_overrun_pct"] <= 0.5
    assert totals["resizes_per_workload_day"] <= 4
    assert (
        totals["memory_overrun_samples"] == 0
        or totals["memory_overrun_samples"] < vpa["memory_overrun_samples"]
    )


def test_the_real_trace_plots_and_shows_progress_on_stderr(
    replayed: tuple[dict[str, Any], Path, str],
) -> None:
    _, png, stderr = replayed
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    assert "replay fracpilot" in stderr  # a long trace shows its progress even off a terminal
    assert "replay vpa" in stderr
