"""Each data command in each ``-o`` format against a real nats-server holding a recorded fleet
(tests/support/operator_scenario.py) and a running decision service (policies): JSON is the
reference; YAML reads back to it, CSV holds its items' values, table and wide show its rows;
and the option works before the command as after it.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from fracpilot_cli.main import app
from fracpilot_cli.output import csv_cell
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyScope
from helpers import reset_nats, running
from support.operator_scenario import Recording, namespace_policy, operator_fleet, publish, record

pytestmark = pytest.mark.integration


@pytest.fixture
async def recording(nats_url: str) -> Recording:
    await reset_nats(nats_url)
    rec = record(operator_fleet(), namespace_policy("inference", 3))
    await publish(nats_url, rec)
    return rec


async def fracpilot(url: str, *args: str) -> Result:
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke, app, list(args), env={"FRACPILOT_NATS_URL": url, "COLUMNS": "250"}
    )
    assert result.exit_code == 0, (args, result.output)
    return result


async def each_format(url: str, command: list[str]) -> dict[str, str]:
    """stdout of ``command`` in each format, with -o after the command and (checked to be the
    same but for generation times) before it."""
    out: dict[str, str] = {}
    for fmt in ("json", "yaml", "csv", "table", "wide"):
        after = await fracpilot(url, *command, "-o", fmt)
        before = await fracpilot(url, "-o", fmt, *command)
        assert strip_times(before.stdout) == strip_times(after.stdout), fmt
        out[fmt] = after.stdout
    return out


TIMES = ("generated_at", "since", "until")  # the time of the run, not of the data


def strip_times(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not any(t in line for t in TIMES))


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def check_csv(rows: list[dict[str, str]], items: list[dict[str, Any]]) -> None:
    assert len(rows) == len(items)
    for row, item in zip(rows, items, strict=True):
        assert row == {k: csv_cell(v) for k, v in item.items()}


def check_yaml(text: str, document: Any) -> None:
    loaded = yaml.safe_load(text)
    if isinstance(document, dict):
        loaded = {k: v for k, v in loaded.items() if k not in TIMES}
        document = {k: v for k, v in document.items() if k not in TIMES}
    assert loaded == document


async def test_status_in_each_format(nats_url: str, recording: Recording) -> None:
    out = await each_format(nats_url, ["status"])
    document = json.loads(out["json"])
    items = document["items"]
    assert len(items) == 5
    check_yaml(out["yaml"], document)
    check_csv(csv_rows(out["csv"]), items)
    table = out["table"].splitlines()
    assert table[0].split()[:3] == ["NAMESPACE", "WORKLOAD", "FRACTION"]
    assert [line.split()[1] for line in table[1:6]] == [i["workload"] for i in items]
    # the totals line follows the rows (consolidation's footer, when reported, comes after it)
    assert "5 workloads" in next(line for line in table[6:] if line.strip())
    wide = out["wide"].splitlines()
    assert "NODE" in wide[0]
    assert "NODE" not in table[0]
    for line, item in zip(wide[1:6], items, strict=True):
        assert (item["node"] or "-") in line.split()


async def test_status_namespace_in_each_position(nats_url: str, recording: Recording) -> None:
    for args in (["-n", "inference", "status"], ["status", "-n", "inference"]):
        result = await fracpilot(nats_url, *args, "-o", "csv")
        rows = csv_rows(result.stdout)
        assert rows
        assert {r["namespace"] for r in rows} == {"inference"}


async def test_explain_in_each_format(nats_url: str, recording: Recording) -> None:
    out = await each_format(nats_url, ["explain", "inference/translate"])
    document = json.loads(out["json"])
    entries = document["entries"]
    assert entries
    check_yaml(out["yaml"], document)
    rows = csv_rows(out["csv"])
    assert [r["decision_id"] for r in rows] == [e["decision_id"] for e in entries]
    for row, entry in zip(rows, entries, strict=True):
        assert row["recorded_at"] == entry["recorded_at"]
        if entry["decision"] is not None:
            assert float(row["new_fraction"]) == entry["decision"]["new_fraction"]
            assert row["reason"] == entry["decision"]["reason"]
        assert int(row["actions"]) == len(entry["actions"])
        if entry["actions"]:
            assert row["outcome"] == entry["actions"][-1]["outcome"]
    table = out["table"].splitlines()
    assert table[0].startswith("inference/translate")
    assert table[1].split()[:3] == ["RECORDED", "DECISION", "FROM"]
    # RECORDED is "YYYY-MM-DD HH:MM:SS UTC": the decision id is the fourth word
    assert [line.split()[3] for line in table[2:]] == [e["decision_id"] for e in entries]
    assert "WHY" in out["wide"].splitlines()[1]
    # the default stays the prose timeline
    text = await fracpilot(nats_url, "explain", "inference/translate")
    assert "newest first" in text.stdout.splitlines()[0]
    # a bare workload name takes its namespace from -n
    bare = await fracpilot(nats_url, "-n", "inference", "explain", "translate", "-o", "json")
    assert json.loads(bare.stdout)["entries"] == entries


async def test_report_in_each_format(nats_url: str, recording: Recording, tmp_path: Path) -> None:
    out = await each_format(nats_url, ["report", "--since", "1h", "--out", str(tmp_path)])
    document = json.loads(out["json"])
    written = json.loads((tmp_path / "report.json").read_text())
    assert strip_times(json.dumps(document, indent=1)) == strip_times(json.dumps(written, indent=1))
    check_yaml(out["yaml"], document)
    check_csv(csv_rows(out["csv"]), document["workloads"])
    table = out["table"].splitlines()
    assert table[0].split()[:2] == ["NAMESPACE", "WORKLOAD"]
    names = [w["workload"] for w in document["workloads"]]
    assert [line.split()[1] for line in table[1 : 1 + len(names)]] == names
    assert "GPU-MODEL" in out["wide"].splitlines()[0]


@pytest.fixture
async def service(nats_url: str) -> AsyncIterator[DecisionService]:
    await reset_nats(nats_url)
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as svc:
        yield svc


async def test_policy_list_and_get_in_each_format(
    nats_url: str, service: DecisionService, tmp_path: Path
) -> None:
    path = tmp_path / "p.json"
    for policy in (
        Policy(max_fraction=0.75),
        Policy(
            scope=PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference"),
            max_fraction=0.5,
        ),
    ):
        path.write_bytes(policy.to_json())
        await fracpilot(nats_url, "policy", "set", str(path))
    out = await each_format(nats_url, ["policy", "list"])
    document = json.loads(out["json"])
    assert [p["scope"]["level"] for p in document] == ["cluster", "namespace"]
    check_yaml(out["yaml"], document)
    check_csv(csv_rows(out["csv"]), document)
    table = out["table"].splitlines()
    assert table[0].split()[:4] == ["SCOPE", "MODE", "MIN", "MAX"]
    assert [line.split()[3] for line in table[1:]] == ["0.75", "0.5"]
    assert "PERCENTILE" in out["wide"].splitlines()[0]
    # between the group and its subcommand too
    middle = await fracpilot(nats_url, "policy", "-o", "csv", "list")
    assert middle.stdout == out["csv"]

    got = await each_format(nats_url, ["policy", "get", "-n", "inference"])
    one = json.loads(got["json"])
    assert one["max_fraction"] == 0.5
    check_yaml(got["yaml"], one)
    check_csv(csv_rows(got["csv"]), [one])
    only = await fracpilot(nats_url, "-n", "inference", "policy", "list", "-o", "json")
    assert [p["scope"]["level"] for p in json.loads(only.stdout)] == ["namespace"]
