"""Every command in README.md's shell blocks works as written: those that can run here do, the
others are printed with why not (never skipped silently).

Run as written with ``bash``, with this machine's stand-ins for the cluster's services and no
other change:
- ``fracpilot recommend``: against a Prometheus backfilled with a day of 3 GPU workloads (by
  promtool, as test_recommend_prometheus.py does), at the README's Prometheus address rewritten
  to the test server's (the one substitution);
- ``helm install`` (the pinned helm of the k8s testbin), ``kubectl label`` and ``kubectl get``
  (``/usr/bin/kubectl``): against a kube-apiserver of this test's own (the chart's cluster-wide
  objects would clash with other tests' on the session's), ``KUBECONFIG`` pointing at it; the
  namespace the README labels (``team-a``, a user's) is created first.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from k8s_control_plane import REPO_ROOT, ControlPlane
from support.genai_history import STEP_S, backfill, workloads
from support.kube import ensure_namespace
from support.prometheus_server import PrometheusServer

pytestmark = pytest.mark.integration

README = REPO_ROOT / "README.md"
README_PROMETHEUS = "http://prometheus.monitoring.svc:9090"
KUBECTL = "/usr/bin/kubectl"
# The commands of the README's "On your cluster" steps: each must be among those run.
QUICKSTART = (
    "fracpilot recommend --prometheus-url",
    "helm install fracpilot helm/fracpilot",
    "kubectl get fractionrecommendations -A",
    "kubectl label namespace team-a fracpilot.io/mode=auto",
)
# What cannot run here, by how the command starts, and why.
NOT_HERE: tuple[tuple[str, str], ...] = (
    ("make ", "the demo and the whole suite: run by people and CI, not from inside a test"),
    ("docker ", "no Docker engine on the test machine (tests/e2e/test_compose_env.py)"),
    ("helm test ", "its checks are pods: no kubelet on the test control plane"),
    (
        "kubectl fracpilot ",
        "the plugin port-forwards to the release's NATS pod: no kubelet here; the same path "
        "with the port-forward stream swapped for a local nats-server: "
        "tests/integration/k8s/test_kubectl_plugin.py",
    ),
    (
        "fracpilot status",
        "reads a running fracpilot's NATS (tests/integration/test_operator_cli.py)",
    ),
    ("fracpilot explain", "reads a running fracpilot's NATS (test_operator_cli.py)"),
    ("fracpilot report", "reads a running fracpilot's NATS (test_operator_cli.py)"),
    ("fracpilot -o ", "reads a running fracpilot's NATS (test_operator_cli.py)"),
    ("fracpilot policy", "talks to a running decision service (test_policy_cli.py)"),
    (
        "fracpilot replay",
        "minutes on the whole trace or a file of yours (TRACE); replay is tested on its own",
    ),
)


@dataclass(frozen=True)
class Command:
    line: str  # as the README writes it, continuation lines joined
    where: int  # the README line it starts on


def readme_commands(text: str) -> list[Command]:
    """Each command of each ```sh block: continuations joined, trailing comments dropped."""
    out: list[Command] = []
    inside, pending, start = False, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("```"):
            inside = line == "```sh" and not inside
            continue
        if not inside or not line:
            continue
        if not pending:
            start = number
        code = re.split(r"\s+#\s", line, maxsplit=1)[0].rstrip()
        if code.endswith("\\"):
            pending += code[:-1].rstrip() + " "
            continue
        out.append(Command(pending + code, start))
        pending = ""
    return out


def why_not(command: Command) -> str | None:
    for prefix, reason in NOT_HERE:
        if command.line.startswith(prefix):
            return reason
    return None


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("readme-prometheus")
    steps = int(86_400 / STEP_S)
    last = math.floor(time.time() / STEP_S) * STEP_S - STEP_S
    prom = PrometheusServer()
    backfill(workloads(3, steps), last - (steps - 1) * STEP_S, prom.data_dir, tmp)
    prom.start()
    try:
        yield prom
    finally:
        prom.cleanup()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def test_every_readme_command_runs_or_says_why_not(
    prometheus: PrometheusServer, cluster: ControlPlane, tmp_path: Path
) -> None:
    commands = readme_commands(README.read_text())
    kubeconfig = cluster.write_kubeconfig()
    with cluster.admin_client() as admin:
        ensure_namespace(client.CoreV1Api(admin), "team-a")  # a user's namespace
    assert os.access(KUBECTL, os.X_OK), f"{KUBECTL} is needed"
    path = os.pathsep.join(
        [str(cluster.helm.parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FRACPILOT_")},
        "PATH": path,
        "KUBECONFIG": str(kubeconfig),
    }
    assert shutil.which("helm", path=path) == str(cluster.helm)
    ran: list[str] = []
    not_run: list[tuple[Command, str]] = []
    first: dict[str, int] = {}
    for command in commands:
        reason = why_not(command)
        if command.line in first:  # one install: the same command again is not run twice
            reason = f"the same command as README.md:{first[command.line]}, run there"
        first.setdefault(command.line, command.where)
        if reason is not None:
            not_run.append((command, reason))
            continue
        line = command.line.replace(README_PROMETHEUS, prometheus.url)
        workdir = tmp_path if line.startswith("fracpilot ") else REPO_ROOT
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"README.md:{command.where}: `{command.line}` failed ({done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        ran.append(command.line)
        print(f"ran   README.md:{command.where}: {command.line}")
    for command, reason in not_run:
        print(f"not run README.md:{command.where}: {command.line}\n        why: {reason}")
    for wanted in QUICKSTART:
        assert any(line.startswith(wanted) for line in ran), f"not run: {wanted}"
    page = (tmp_path / "recommend.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    # The chart installed its CRD, so the README's `kubectl get` is answered by it.
    listed = subprocess.run(
        [KUBECTL, "get", "crd", "fractionrecommendations.fracpilot.io"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr


def test_the_command_reader_joins_continuations_and_drops_comments() -> None:
    text = "x\n```sh\na --b \\\n  --c   # why\nd # e\n```\n```yaml\nf: g\n```\n"
    assert [c.line for c in readme_commands(text)] == ["a --b --c", "d"]
