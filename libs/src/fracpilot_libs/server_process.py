"""A server program run as a child process, for the tests and the demo: start it with its output
in a log file, wait until it is ready, stop it (SIGTERM, then SIGKILL).

Every failure names the program and ends with the last lines of its log, so a test that could
not start a server says why.

    server = ServerProcess("nats-server", tmp / "nats.log")
    server.start([binary, "-p", str(port)], ready=lambda: port_open(port), timeout=15)
    ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "ServerExitedError",
    "ServerNotReadyError",
    "ServerProcess",
    "free_port",
    "port_open",
    "wait_for",
    "wait_until_ready",
]


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool | None:
    """True when something accepts a TCP connection on ``host:port`` (None: not yet)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return None


class ServerExitedError(RuntimeError):
    """The server process exited while it was expected to run."""


class ServerNotReadyError(TimeoutError):
    """The server did not become ready in time."""


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something other than None (or raise TimeoutError).

    Exceptions from ``probe`` count as "not yet"; the last one is chained to the timeout.
    """
    return wait_until_ready(probe, (), timeout=timeout, interval=interval, what=what)


def wait_until_ready(
    probe: Callable[[], T | None],
    servers: Sequence[ServerProcess],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "ready",
) -> T:
    """:func:`wait_for`, failing at once (with its log) when one of ``servers`` has exited, and
    with all their logs on timeout (:class:`ServerNotReadyError`)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        for server in servers:
            server.check_alive()
        try:
            result = probe()
        except Exception as exc:
            last_error = exc
        else:
            if result is not None:
                return result
        if time.monotonic() >= deadline:
            logs = "".join(f"\n{s.log_report()}" for s in servers)
            raise ServerNotReadyError(
                f"timed out after {timeout:.0f}s waiting for {what}{logs}"
            ) from last_error
        time.sleep(interval)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM the child when the process that started it dies, so no server outlives a
    killed test run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One server program as a child process, its stdout and stderr appended to ``log_path``.

    :meth:`start` may be called again after :meth:`stop` (same log file, a header per start).
    With ``process_group`` the program runs in a process group of its own and the signals
    reach its children too.
    """

    def __init__(self, name: str, log_path: Path, *, process_group: bool = False) -> None:
        self.name = name
        self.log_path = log_path
        self.process_group = process_group
        self.proc: subprocess.Popen[bytes] | None = None
        self._output_from = 0  # where the last start's output begins in the log, after its header

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        ready: Callable[[], object | None] | None = None,
        timeout: float = 30.0,
    ) -> ServerProcess:
        """Start the program (``env``: the whole environment; default this process's) and, given
        a ``ready`` probe, wait until it returns something other than None (:meth:`wait_until`):
        a program that does not get ready is stopped again."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The parent-death signal is tied to the starting thread: set it only from the main one,
        # where a thread ending early cannot take the server with it.
        in_main = threading.current_thread() is threading.main_thread()
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start: {list(argv)}\n".encode())
            log.flush()
            self._output_from = log.tell()
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=self.process_group,
                preexec_fn=_die_with_parent if in_main and sys.platform == "linux" else None,
            )
        if ready is not None:
            try:
                self.wait_until(ready, timeout=timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def check_alive(self) -> None:
        """Raise :class:`ServerExitedError` (with the log's end) when the program has exited."""
        if self.proc is None:
            raise ServerExitedError(f"{self.name} is not started")
        if (code := self.proc.poll()) is not None:
            raise ServerExitedError(f"{self.name} exited with code {code}; {self.log_report()}")

    def wait_until(
        self,
        probe: Callable[[], T | None],
        *,
        timeout: float,
        interval: float = 0.1,
        what: str = "ready",
    ) -> T:
        """Poll ``probe`` until it returns something other than None: see
        :func:`wait_until_ready`."""
        return wait_until_ready(
            probe, (self,), timeout=timeout, interval=interval, what=f"{self.name} {what}"
        )

    def wait_for_log(self, text: str, *, timeout: float) -> None:
        """Wait until the program has written ``text`` since it was last started."""
        self.wait_until(
            lambda: True if text in self.output() else None,
            timeout=timeout,
            what=f"to log {text!r}",
        )

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the program (its process group with ``process_group``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.process_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0, *, kill: bool = False) -> int | None:
        """SIGTERM (SIGKILL with ``kill``), then SIGKILL after ``timeout``; the exit code (None
        when it was not started)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.send_signal(signal.SIGCONT)  # a stopped (frozen) process acts on no SIGTERM
            self.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                proc.wait()
        self.proc = None
        return proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def output(self) -> str:
        """What the program wrote since it was last started (not the header naming its
        command line, nor an earlier run's)."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self._output_from)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_report(self, lines: int = 30) -> str:
        """The log's last lines under a line naming the program and its log file."""
        return f"last {self.name} log lines ({self.log_path}):\n{self.log_tail(lines)}"
