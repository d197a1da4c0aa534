"""fracpilot_libs.server_process on real child processes (small Python programs): a server
that dies or never gets ready is reported with its log's end, and stop() escalates to SIGKILL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fracpilot_libs.server_process import (
    ServerExitedError,
    ServerNotReadyError,
    ServerProcess,
    free_port,
    port_open,
)


def python(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", code]


def test_a_server_is_ready_once_it_listens_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    listen = (
        "import socket, time\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "print('listening', flush=True)\n"
        "time.sleep(60)\n"
    )
    server = ServerProcess("listener", tmp_path / "listener.log")
    server.start(python(listen), ready=lambda: port_open(port), timeout=15)
    assert server.running
    server.wait_for_log("listening", timeout=5)
    assert server.stop() == -15  # SIGTERM
    assert server.proc is None
    assert port_open(port) is None


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    server = ServerProcess("crasher", tmp_path / "crasher.log")
    with pytest.raises(ServerExitedError, match=r"(?s)crasher exited with code 3.*bad flag"):
        server.start(python("print('bad flag'); raise SystemExit(3)"), ready=lambda: None)
    assert server.proc is None  # stopped again (reaped)


def test_a_server_never_ready_is_stopped_and_reported_with_its_log(tmp_path: Path) -> None:
    server = ServerProcess("sleeper", tmp_path / "sleeper.log")
    code = "import time; print('waiting for nothing', flush=True); time.sleep(60)"
    with pytest.raises(ServerNotReadyError, match=r"(?s)sleeper ready.*waiting for nothing"):
        server.start(python(code), ready=lambda: None, timeout=1.0)
    assert server.proc is None


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring', flush=True)\n"
        "time.sleep(60)\n"
    )
    server = ServerProcess("stubborn", tmp_path / "stubborn.log").start(python(stubborn))
    server.wait_for_log("ignoring", timeout=10)
    assert server.stop(timeout=0.5) == -9  # SIGKILL after the timeout


def test_restarting_appends_to_the_same_log(tmp_path: Path) -> None:
    server = ServerProcess("twice", tmp_path / "twice.log")
    for word in ("first", "second"):
        server.start(python(f"print({word!r})"))
        assert server.proc is not None
        server.proc.wait(10)
        server.stop()
    assert [line for line in server.log_text().splitlines() if not line.startswith("---")] == [
        "first",
        "second",
    ]
