"""The ``fracpilot`` entry point: every command is listed and runs, while a command imports only
what it needs (``fracpilot status`` on a large fleet has a two-second budget)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fracpilot_cli import main

runner = CliRunner()

ALL_COMMANDS = {"asyncapi", "demo", "explain", "policy", "replay", "report", "status"}


def test_help_lists_every_command_with_its_summary() -> None:
    result = runner.invoke(main.app, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    listed = {name for name in ALL_COMMANDS if f" {name} " in result.output}
    assert listed == ALL_COMMANDS
    # the summary is the docstring's first paragraph on one line, not its raw line breaks
    assert "savings and overruns." in result.output


@pytest.mark.parametrize("name", sorted(main.LAZY_COMMANDS))
def test_each_lazy_command_loads_and_shows_its_help(name: str) -> None:
    result = runner.invoke(main.app, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f" {name} [OPTIONS]" in result.output


def test_policy_keeps_its_subcommands() -> None:
    result = runner.invoke(main.app, ["policy", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for sub in ("get", "set", "list"):
        assert f" {sub} " in result.output


def test_an_unknown_command_is_a_usage_error() -> None:
    result = runner.invoke(main.app, ["statuz"])
    assert result.exit_code == 2


def test_first_paragraph_joins_its_lines() -> None:
    doc = """One row per workload:
    the fraction.

    More detail."""
    assert main.first_paragraph(doc) == "One row per workload: the fraction."


def test_a_websocket_url_keeps_the_websocket_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "aiohttp", raising=False)
    assert not main.without_websocket_client(["status", "--nats-url", "ws://nats:8080"], {})
    assert not main.without_websocket_client([], {"FRACPILOT_NATS_URL": "wss://nats:443"})
    assert "aiohttp" not in sys.modules  # untouched: nats-py imports it when it needs it


def _modules_after(*argv: str) -> set[str]:
    """The modules a fresh ``fracpilot <argv>`` process has imported when it exits."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['fracpilot', *{list(argv)!r}]\n"
        "from fracpilot_cli.main import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write(json.dumps([m for m, v in sys.modules.items() if v is not None]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def test_status_imports_neither_the_other_commands_nor_the_websocket_client() -> None:
    loaded = _modules_after("status", "--help")
    assert "fracpilot_cli.operator_cli" in loaded
    for heavy in ("fracpilot_cli.demo", "fracpilot_cli.asyncapi", "fracpilot_cli.replay"):
        assert heavy not in loaded
    assert "aiohttp" not in loaded


def test_replay_loads_its_own_module_only() -> None:
    loaded = _modules_after("replay", "--help")
    assert "fracpilot_cli.replay" in loaded
    assert "fracpilot_cli.demo" not in loaded
    assert "fracpilot_cli.operator_cli" not in loaded


def test_an_interrupt_while_watching_is_remembered_even_if_swallowed() -> None:
    """Python 3.11's ``wait_for`` (and a NATS client) can lose a cancellation; the watch loop
    asks the flag, so a Ctrl-C swallowed on the way still ends it."""
    import os
    import signal

    from fracpilot_cli.operator_cli import interrupt_flag

    before = signal.getsignal(signal.SIGINT)
    with interrupt_flag() as pressed:
        assert not pressed()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes of this thread
                pass
        except KeyboardInterrupt:
            pass  # swallowed, as a library might
        assert pressed()
    assert signal.getsignal(signal.SIGINT) is before
