"""Run fracpilot's services as separate OS processes (the demo and the end-to-end tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fracpilot_libs.server_process import ServerProcess

SERVICE_MODULES = {
    "ingest": "fracpilot_ingest",
    "decision": "fracpilot_decision",
    "actuator": "fracpilot_actuator",
}


class ServiceProcess:
    """One service as a child process, its JSON logs written to ``log_dir/<name>.log`` (a
    :class:`~fracpilot_libs.server_process.ServerProcess` started with the service's module)."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log_dir = log_dir
        self._server = ServerProcess(name, log_dir / f"{name}.log")

    @property
    def log_path(self) -> Path:
        return self._server.log_path

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self._server.proc

    def start(self) -> ServiceProcess:
        argv = [sys.executable, "-m", SERVICE_MODULES[self.name]]
        self._server.start(argv, env={**os.environ, **self.env})
        return self

    @property
    def running(self) -> bool:
        return self._server.running

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL after the timeout; returns the exit code."""
        return self._server.stop(timeout_s)

    def kill(self) -> None:
        self._server.stop(kill=True)

    def log_contains(self, text: str) -> bool:
        return text in self._server.log_text()

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> None:
        """Wait until the service has logged ``text`` since it was started; raises when it
        exits first (with the log's end) or after ``timeout_s``."""
        self._server.wait_for_log(text, timeout=timeout_s)
