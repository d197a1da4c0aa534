"""Run fracpilot's services as separate OS processes (the demo and the end-to-end tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SERVICE_MODULES = {
    "ingest": "fracpilot_ingest",
    "decision": "fracpilot_decision",
    "actuator": "fracpilot_actuator",
}


@dataclass
class ServiceProcess:
    """One service as a child process, its JSON logs written to ``log_dir/<name>.log``."""

    name: str
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> ServiceProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", SERVICE_MODULES[self.name]],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL after the timeout; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def log_contains(self, text: str) -> bool:
        return self.log_path.exists() and text in self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.log_contains(text):
            if not self.running:
                raise RuntimeError(f"{self.name} exited; see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not log {text!r}; see {self.log_path}")
            time.sleep(0.1)
