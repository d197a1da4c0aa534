"""``fracpilot recommend`` against a real Prometheus (Debian's), its history backfilled by
Prometheus' own tool (``promtool tsdb create-blocks-from openmetrics``) from the GenAI trace's
pods in dcgm-exporter's series shape (:mod:`support.genai_history`).

The must-show: 14 days of 100 workloads read and sized in under 120 s, and the recommendation
of every workload equal to ``fracpilot replay``'s on the same samples (the CSV of what
Prometheus gives back). Then the error cases, each with a clear message: a wrong URL, no GPU
series, a TLS failure, an empty namespace; and the access ingest has (CA, token, headers).
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fracpilot_libs.server_process import free_port
from support.genai_history import STEP_S, backfill, trace_rows, workloads
from support.prometheus_server import PrometheusServer
from support.tls_proxy import BearerTokenProxy, TlsFiles, make_tls_files

pytestmark = pytest.mark.integration

DAYS = 14
STEPS = int(DAYS * 86_400 / STEP_S)  # 4032 samples a series
WORKLOADS = 100
BUDGET_S = 120.0
TRACE_COLUMNS = [
    "timestamp",
    "namespace",
    "workload",
    "pod",
    "gpu_util",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
    "gpu_model",
]


def fracpilot(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own, as people run it."""
    return subprocess.run(
        [sys.executable, "-c", "from fracpilot_cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _first_instant(steps: int) -> float:
    """The instant that reads the first sample: the last one is read 5 minutes before now."""
    last = math.floor(time.time() / STEP_S) * STEP_S - STEP_S
    return last - (steps - 1) * STEP_S


def _backfilled(tmp: Path, count: int, steps: int, **kwargs: object) -> PrometheusServer:
    loads = workloads(count, steps)
    first = _first_instant(steps)
    prom = PrometheusServer(**kwargs)  # type: ignore[arg-type]
    backfill(loads, first, prom.data_dir, tmp)
    with (tmp / "trace.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(TRACE_COLUMNS)
        writer.writerows(trace_rows(loads, first))
    prom.start()
    return prom


@pytest.fixture(scope="module")
def fortnight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, Path]]:
    """14 days of 100 workloads; the replay's CSV of the same samples beside it."""
    tmp = tmp_path_factory.mktemp("fortnight")
    started = time.monotonic()
    prom = _backfilled(tmp, WORKLOADS, STEPS)
    print(f"\nbackfilled {WORKLOADS} workloads x {DAYS} days in {time.monotonic() - started:.0f} s")
    try:
        yield prom, tmp / "trace.csv"
    finally:
        prom.cleanup()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A day of 3 workloads, for the cases that are about messages, not volume."""
    tmp = tmp_path_factory.mktemp("small")
    prom = _backfilled(tmp, 3, int(86_400 / STEP_S))
    try:
        yield prom
    finally:
        prom.cleanup()


def test_fourteen_days_of_a_hundred_workloads_equal_replay_in_time(
    fortnight: tuple[PrometheusServer, Path],
) -> None:
    prom, trace = fortnight
    started = time.monotonic()
    run = fracpilot(
        "recommend",
        "--prometheus-url",
        prom.url,
        "--since",
        "15d",
        "--step",
        "5m",
        "-A",
        "-o",
        "json",
    )
    took = time.monotonic() - started
    print(f"fracpilot recommend: {WORKLOADS} workloads x {DAYS} days in {took:.1f} s")
    assert run.returncode == 0, run.stderr
    assert took < BUDGET_S, f"{took:.0f} s, budget {BUDGET_S:.0f} s"
    recommended = json.loads(run.stdout)
    assert recommended["totals"]["samples"] == WORKLOADS * STEPS

    replayed = fracpilot("replay", str(trace), "-o", "json")
    assert replayed.returncode == 0, replayed.stderr
    replay = json.loads(replayed.stdout)
    ours = {(w["namespace"], w["workload"]): w for w in recommended["workloads"]}
    theirs = {(w["namespace"], w["workload"]): w for w in replay["workloads"]}
    assert len(ours) == WORKLOADS
    assert ours.keys() == theirs.keys()
    for key, w in theirs.items():
        # same engine, same samples: the same fraction and the same figures
        assert ours[key]["recommended_fraction"] == w["final_fraction"], key
        assert ours[key]["samples"] == w["samples"], key
        assert ours[key]["saved_pct"] == pytest.approx(w["savings_pct"], abs=1e-3), key
    assert recommended["totals"]["saved_pct"] == pytest.approx(
        replay["totals"]["savings_pct"], abs=1e-3
    )
    # the GenAI pods use far less than a whole GPU: most are sized down, cards are freed
    down = [w for w in ours.values() if w["recommended_fraction"] < 1.0]
    assert len(down) > WORKLOADS // 2
    assert recommended["totals"]["cards_held"] == WORKLOADS
    assert 0 < recommended["totals"]["cards_freed"] < WORKLOADS
    for w in ours.values():
        assert 0 < w["memory_peak_share"] <= 1
        assert 0 <= w["compute_peak"] <= 1
        assert w["mode"] == "unknown"  # dcgm-exporter alone does not say


def test_the_table_names_each_workload_and_the_cards_freed(small: PrometheusServer) -> None:
    run = fracpilot("recommend", "--prometheus-url", small.url, "--since", "2d", "-n", "genai")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAMESPACE", "WORKLOAD", "HELD", "RECOMMENDED"]
    assert sum(1 for line in lines if line.startswith("genai ")) == 3
    assert any(line.startswith("cards: 3 held now") for line in lines)
    assert "no vLLM series" in run.stderr  # a note, not an error


def test_csv_and_yaml(small: PrometheusServer) -> None:
    as_csv = fracpilot(
        "recommend", "--prometheus-url", small.url, "--since", "2d", "-A", "-o", "csv"
    )
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(as_csv.stdout.splitlines()))
    assert len(rows) == 3
    assert {r["namespace"] for r in rows} == {"genai"}
    assert all(0 < float(r["recommended_fraction"]) <= 1 for r in rows)
    as_yaml = fracpilot(
        "recommend", "--prometheus-url", small.url, "--since", "2d", "-A", "-o", "yaml"
    )
    assert as_yaml.returncode == 0
    assert "recommended_fraction:" in as_yaml.stdout


def test_html_holds_the_numbers_json_holds(small: PrometheusServer) -> None:
    args = ("recommend", "--prometheus-url", small.url, "--since", "2d", "-A")
    as_json = fracpilot(*args, "-o", "json")
    as_html = fracpilot(*args, "-o", "html")
    assert as_html.returncode == 0, as_html.stderr
    page = as_html.stdout
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    doc = json.loads(as_json.stdout)
    for w in doc["workloads"]:
        assert f'<td class="l">{w["workload"]}</td>' in page
    assert f"<b>{doc['totals']['cards_freed']}</b>cards packing would free" in page


def test_a_wrong_url_is_an_error_that_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = fracpilot("recommend", "--prometheus-url", url, "-A")
    assert run.returncode == 1
    assert f"cannot reach Prometheus at {url}" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_url_that_is_not_prometheus_is_an_error(small: PrometheusServer) -> None:
    run = fracpilot("recommend", "--prometheus-url", f"{small.url}/not-here", "-A")
    assert run.returncode == 1
    assert "is it a Prometheus" in run.stderr or "not found (404)" in run.stderr


def test_no_gpu_series_names_the_missing_exporters() -> None:
    with PrometheusServer() as empty:  # nothing scraped, nothing backfilled
        run = fracpilot("recommend", "--prometheus-url", empty.url, "-A", "-o", "json")
    assert run.returncode == 0, run.stderr  # an answer, not an error
    assert "no GPU usage series" in run.stderr
    assert "dcgm-exporter (DCGM_FI_PROF_GR_ENGINE_ACTIVE" in run.stderr
    assert "HAMi's vGPUmonitor" in run.stderr
    assert json.loads(run.stdout)["workloads"] == []


def test_an_empty_namespace_says_where_workloads_are(small: PrometheusServer) -> None:
    run = fracpilot("recommend", "--prometheus-url", small.url, "--since", "2d", "-n", "nothere")
    assert run.returncode == 0, run.stderr
    assert "no GPU workloads in namespace nothere" in run.stderr
    assert "found in genai; -A shows them all" in run.stderr
    assert run.stdout == ""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("secure")
    prom = _backfilled(tmp, 2, 48, tls=tls)
    try:
        yield prom
    finally:
        prom.cleanup()


def test_a_certificate_not_trusted_is_a_tls_failure(secure: PrometheusServer) -> None:
    run = fracpilot("recommend", "--prometheus-url", secure.url, "-A")
    assert run.returncode == 1
    assert f"TLS failure with {secure.url}: the server's certificate is not trusted" in run.stderr
    assert "--ca-file" in run.stderr


def test_ca_file_token_and_headers_as_ingest_has_them(
    secure: PrometheusServer, tls: TlsFiles, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("token-1\n")
    with BearerTokenProxy(secure.url, tls, token="token-1") as proxy:
        run = fracpilot(
            "recommend",
            "--prometheus-url",
            proxy.url,
            "--since",
            "1d",
            "-A",
            "-o",
            "json",
            "--ca-file",
            str(tls.ca_file),
            "--bearer-token-file",
            str(token),
            "--header",
            "X-Scope-OrgID=team-a",
        )
        assert run.returncode == 0, run.stderr
        assert len(json.loads(run.stdout)["workloads"]) == 2
        assert proxy.refused == 0
        assert proxy.accepted >= 3
        # header names are case-insensitive (the standard library sends X-scope-orgid)
        received = {k.lower(): v for k, v in proxy.last_headers.items()}
        assert received["x-scope-orgid"] == "team-a"
        token.write_text("wrong\n")
        refused = fracpilot(
            "recommend",
            "--prometheus-url",
            proxy.url,
            "-A",
            "--ca-file",
            str(tls.ca_file),
            "--bearer-token-file",
            str(token),
        )
    assert refused.returncode == 1
    assert "refused the request (401)" in refused.stderr
    unverified = fracpilot(
        "recommend",
        "--prometheus-url",
        secure.url,
        "--since",
        "1d",
        "-A",
        "-o",
        "json",
        "--insecure-skip-verify",
    )
    assert unverified.returncode == 0, unverified.stderr
