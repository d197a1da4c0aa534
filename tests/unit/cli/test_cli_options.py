"""Global options in every position: before the command, after it, and (policy) between the
group and its subcommand; -o on ``replay`` in each format, read back. The NATS commands are
run against a closed port here: the error names the URL and format they took, so each shows
the option reached it (their output in each format: tests/integration/test_cli_formats.py)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fracpilot_cli import options
from fracpilot_cli.main import app
from fracpilot_libs.server_process import free_port

runner = CliRunner()
CLOSED = f"nats://127.0.0.1:{free_port()}"  # nothing listens there

# command -> its arguments after the command name (policy: the group, then the subcommand)
NATS_COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "explain": ["explain", "inference/chat"],
    "report": ["report", "--since", "1h"],
    "policy get": ["policy", "get"],
    "policy list": ["policy", "list"],
}


def positions(command: list[str], option: list[str]) -> list[list[str]]:
    """``option`` before the command, after it, and after the group of a subcommand."""
    placed = [option + command, command + option]
    if command[0] == "policy":
        placed.append(command[:1] + option + command[1:])
    return placed


def run(args: list[str], tmp_path: Path | None = None) -> Any:
    env = {"FRACPILOT_NATS_URL": "nats://127.0.0.1:1", "COLUMNS": "200"}
    if tmp_path is not None:  # report writes its files here
        args = [*args, "--out", str(tmp_path)] if "report" in args else args
    return runner.invoke(app, args, env=env)


@pytest.mark.parametrize("name", sorted(NATS_COMMANDS))
def test_nats_url_is_taken_in_every_position(name: str, tmp_path: Path) -> None:
    for args in positions(NATS_COMMANDS[name], ["--nats-url", CLOSED]):
        result = run(args, tmp_path)
        assert result.exit_code == 1, (args, result.output)
        assert CLOSED.removeprefix("nats://") in result.stderr, (args, result.stderr)


@pytest.mark.parametrize("name", sorted(NATS_COMMANDS))
def test_output_is_taken_in_every_position(name: str, tmp_path: Path) -> None:
    for args in positions(NATS_COMMANDS[name], ["-o", "xml"]):
        result = run(args, tmp_path)
        assert result.exit_code == 2, (args, result.output)
        assert "-o xml: choose one of" in result.stderr, (args, result.stderr)
    for args in positions(NATS_COMMANDS[name], ["--json"]):
        result = run([*args, "-o", "yaml"], tmp_path)
        assert result.exit_code == 2, (args, result.output)
        assert "--json is -o json" in result.stderr


@pytest.mark.parametrize("name", sorted(NATS_COMMANDS))
def test_kubeconfig_is_taken_in_every_position(name: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    for args in positions(NATS_COMMANDS[name], ["--kubeconfig", str(missing)]):
        result = run(args, tmp_path)
        assert result.exit_code == 1, (args, result.output)
        assert f"kubeconfig {missing}" in result.stderr, (args, result.stderr)
    for args in positions(NATS_COMMANDS[name], ["--context", "prod"]):
        result = run([*args, "--nats-url", CLOSED], tmp_path)
        assert result.exit_code == 2, (args, result.output)
        assert "give one or the other" in result.stderr


def test_namespace_is_taken_in_every_position() -> None:
    bare = ["explain", "chat"]  # a workload without its namespace needs -n
    assert run(bare).exit_code == 2
    for args in positions(bare, ["-n", "inference"]):
        result = run(args)
        assert result.exit_code == 1, (args, result.output)  # NATS, not usage
        assert "cannot connect to NATS" in result.stderr
    for args in positions(["policy", "get"], ["--workload", "chat"])[1:]:
        assert run(args).exit_code == 2  # --workload needs a namespace
    for args in positions(["policy", "get", "--workload", "chat"], ["--namespace", "inference"]):
        result = run(args)
        assert result.exit_code == 1, (args, result.output)
        assert "cannot connect to NATS" in result.stderr


@pytest.mark.parametrize("name", ["status", "report", "policy list"])
def test_all_namespaces_is_taken_in_every_position_and_not_with_n(
    name: str, tmp_path: Path
) -> None:
    """-A/--all-namespaces as kubectl spells it (what these list without -n too); with -n it is
    a usage error before anything is read."""
    for flag in ("-A", "--all-namespaces"):
        for args in positions(NATS_COMMANDS[name], [flag]):
            result = run([*args, "--nats-url", CLOSED], tmp_path)
            assert result.exit_code == 1, (args, result.output)  # NATS, not usage
            assert CLOSED.removeprefix("nats://") in result.stderr, (args, result.stderr)
        for args in positions(NATS_COMMANDS[name], [flag, "-n", "inference"]):
            result = run(args, tmp_path)
            assert result.exit_code == 2, (args, result.output)
            assert "-n and -A: give one or the other" in result.stderr, (args, result.stderr)


def test_explain_names_one_workload_so_refuses_all_namespaces() -> None:
    for args in positions(["explain", "inference/chat"], ["-A"]):
        result = run(args)
        assert result.exit_code == 2, (args, result.output)
        assert "-A: explain names one workload" in result.stderr


def test_recommend_takes_all_namespaces_before_the_command_too() -> None:
    for args in (["-A", "recommend", "-n", "x"], ["recommend", "-A", "-n", "x"]):
        result = run([*args, "--prometheus-url", "http://127.0.0.1:1"])
        assert result.exit_code != 0, (args, result.output)
        assert "-n and -A: give one or the other" in result.stderr, (args, result.stderr)


@pytest.mark.parametrize("name", ["status", "explain", "report", "replay", "policy"])
def test_each_data_command_lists_the_global_options(name: str) -> None:
    result = runner.invoke(app, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Global options" in result.output
    assert "--output" in result.output
    assert "--json" in result.output


# --- replay: every format, in both positions -------------------------------------------------


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Three workloads, a sample a minute for two hours."""
    path = tmp_path / "trace.csv"
    lines = ["timestamp,namespace,workload,pod,gpu_util,gpu_mem_used_bytes,gpu_mem_total_bytes"]
    for m in range(120):
        for i, name in enumerate(("chat", "batch", "embed")):
            util = 0.1 + 0.1 * i + (0.3 if m % 17 == i else 0.0)
            lines.append(
                f"2026-03-02T{m // 60:02d}:{m % 60:02d}:00Z,ml,{name},{name}-0,{util:.2f},"
                f"{(10 + 5 * i) * 1024**3},{80 * 1024**3}"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def replay(trace: Path, option: list[str], first: bool) -> Any:
    args = [*option, "replay", str(trace)] if first else ["replay", str(trace), *option]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("first", [True, False], ids=["before", "after"])
def test_replay_prints_each_format_with_the_same_data(trace: Path, first: bool) -> None:
    document = json.loads(replay(trace, ["-o", "json"], first).stdout)
    assert json.loads(replay(trace, ["--json"], first).stdout) == document
    assert yaml.safe_load(replay(trace, ["-o", "yaml"], first).stdout) == document
    by_name = {w["workload"]: w for w in document["workloads"]}
    rows = list(csv.DictReader(io.StringIO(replay(trace, ["-o", "csv"], first).stdout)))
    assert {r["workload"] for r in rows} == set(by_name) == {"chat", "batch", "embed"}
    for row in rows:
        want = by_name[row["workload"]]
        assert set(row) == set(want)
        for key, value in want.items():
            assert row[key] == str(value), key
    wide = replay(trace, ["-o", "wide"], first).stdout.splitlines()
    assert wide[0].split()[:3] == ["NAMESPACE", "WORKLOAD", "GPU-H"]
    assert "LONGEST-OVERRUN" in wide[0]
    assert {line.split()[1] for line in wide[1:4]} == set(by_name)
    assert f"{document['totals']['workloads']} workloads" in wide[-1]
    table = replay(trace, ["-o", "table"], first).stdout
    assert "replay of trace.csv" in table  # the totals table as before


def test_through_the_kubeconfig_a_listing_keeps_to_the_contexts_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubectl's rule for ``kubectl fracpilot`` (or a kubeconfig option): -n, -A, else the
    context's namespace; straight to NATS there is no context: every namespace."""
    config = tmp_path / "config"
    config.write_text(
        "current-context: a\ncontexts:\n"
        "- name: a\n  context: {namespace: team-a}\n- name: b\n  context: {}\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert options.GlobalOptions(nats_url=CLOSED).namespaces() is None
    assert options.GlobalOptions(kubeconfig=str(config)).namespaces() == "team-a"
    assert options.GlobalOptions(context="b").namespaces() == "default"
    assert options.GlobalOptions(context="a", all_namespaces=True).namespaces() is None
    assert options.GlobalOptions(context="a", namespace="x").namespaces() == "x"
    monkeypatch.setattr(options, "_via_kubeconfig", True)
    assert options.GlobalOptions().namespaces() == "team-a"
    assert options.GlobalOptions(nats_url=CLOSED).namespaces() is None
