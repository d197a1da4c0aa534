"""``kubectl fracpilot``: the CLI reaching the release's NATS through the kubeconfig.

Covered here, against the real kube-apiserver with a real ``helm install`` of the chart
(``nats.auth.type=userPassword``: the chart's generated Secret):
- kubectl finds the plugin on PATH (``kubectl plugin list``, ``kubectl fracpilot --version``);
- the release is found by its labels, in ``--release-namespace`` or the context's namespace;
  the NATS URL and the Secret references are read from its Deployment, the password from the
  Secret; the Service's named target port is resolved on a ready pod behind it;
- a command run with ``--kubeconfig`` connects, through the local forwarding port, to a real
  nats-server that requires that user and password (and fails without a ready pod).
Not covered: the kubernetes client's port-forward stream itself. It needs a kubelet, which
this control plane has not (no kwok either), so the stream opener is swapped for one to the
local nats-server (``kube_access.pod_connector``, the one seam); run by kubectl as a process,
the real opener is used and its failure (no kubelet) is reported, which is checked.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from fracpilot_cli import kube_access
from fracpilot_cli.forwarding import Stream
from fracpilot_cli.kube_access import KubeTarget
from fracpilot_cli.main import app, version
from fracpilot_libs.nats.embedded import EmbeddedNats
from k8s_control_plane import ControlPlane
from support.kube import MERGE_PATCH, RUNNING_AND_READY

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "helm" / "fracpilot"
BIN = Path(sys.executable).parent
KUBECTL = "/usr/bin/kubectl"


def plugin_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRACPILOT_NATS_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_kubectl_finds_the_plugin_on_path() -> None:
    listed = subprocess.run(
        [KUBECTL, "plugin", "list", "--name-only"],
        env=plugin_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "kubectl-fracpilot" in listed.stdout.split(), listed.stderr
    shown = subprocess.run(
        [KUBECTL, "fracpilot", "--version"],
        env=plugin_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"fracpilot {version()}"


@pytest.fixture(scope="module")
def kubeconfig(kube: ControlPlane) -> Path:
    return kube.write_kubeconfig()


@pytest.fixture(scope="module")
def kube_namespace(kube_admin: client.ApiClient) -> str:
    """One namespace for this module's release (the tests share the install)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(kube_admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name


@pytest.fixture(scope="module")
def release(kube: ControlPlane, kubeconfig: Path, kube_namespace: str) -> Iterator[str]:
    """The chart installed with the chart-made NATS password (one shared identity, without
    TLS: the local nats-server below has neither; the default's identities and TLS, as the
    plugin derives them: test_helm_nats_auth.py); uninstalled afterwards. Its cluster-wide
    objects (CRDs, aggregated roles) are left out: other tests install them."""
    name = f"fp-{uuid.uuid4().hex[:6]}"
    args = [
        "--set=webhook.certManager.enabled=false",
        "--set=priorityClass.create=false",
        "--set=nats.auth.type=userPassword",
        "--set=nats.tls.enabled=false",
        "--set=fractionPolicies.crds.install=false",
        "--set=fractionPolicies.roles=false",
    ]
    helm = [str(kube.helm), "--kubeconfig", str(kubeconfig), "--namespace", kube_namespace]
    done = subprocess.run(
        [*helm, "install", name, str(CHART), *args], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    yield name
    subprocess.run([*helm, "uninstall", name], capture_output=True, timeout=180)


def nats_pod(core: client.CoreV1Api, namespace: str, release: str) -> str:
    """A pod behind the release's NATS Service, Running and Ready as a kubelet would say."""
    service = core.read_namespaced_service(f"{release}-fracpilot-nats", namespace)
    name = f"{release}-fracpilot-nats-0"
    if any(p.metadata.name == name for p in core.list_namespaced_pod(namespace).items):
        return name
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels=service.spec.selector),
            spec=client.V1PodSpec(
                node_name="node-a",
                containers=[
                    client.V1Container(
                        name="nats",
                        image="nats:2.11-alpine",
                        ports=[
                            client.V1ContainerPort(name="client", container_port=4222),
                            client.V1ContainerPort(name="monitor", container_port=8222),
                        ],
                    )
                ],
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": RUNNING_AND_READY}, _content_type=MERGE_PATCH
    )
    return name


def test_without_a_ready_nats_pod_the_command_says_so(
    kubeconfig: Path, kube_namespace: str, release: str
) -> None:
    """(First in this module: the other tests add the pod.)"""
    env = {k: None for k in os.environ if k.startswith("FRACPILOT_NATS_")}
    kube = ["--kubeconfig", str(kubeconfig), "--release-namespace", kube_namespace]
    result = CliRunner().invoke(app, [*kube, "status", "-o", "json"], env=env)
    assert result.exit_code == 1
    service = f"{kube_namespace}/{release}-fracpilot-nats"
    assert f"no ready pod behind Service {service}" in result.stderr


def test_the_release_and_its_credentials_are_found(
    kube_admin: client.ApiClient, kubeconfig: Path, kube_namespace: str, release: str
) -> None:
    api, _ = kube_access.api_client(KubeTarget(kubeconfig=str(kubeconfig)))
    target = KubeTarget(str(kubeconfig), namespace=kube_namespace)
    found = kube_access.find_release(api, target, None)
    assert (found.namespace, found.name) == (kube_namespace, release)
    nats_service = f"{release}-fracpilot-nats"
    assert found.access.url == f"nats://{nats_service}.{kube_namespace}.svc:4222"
    secret = f"{release}-fracpilot-nats-auth"
    assert found.access.secrets == {
        "user": kube_access.SecretKey(secret, "user"),
        "password": kube_access.SecretKey(secret, "password"),
    }
    values = kube_access.read_secrets(api, kube_namespace, found.access)
    stored = client.CoreV1Api(kube_admin).read_namespaced_secret(secret, kube_namespace).data
    assert values == {
        "user": b"fracpilot",
        "password": base64.b64decode(stored["password"]),
    }
    assert kube_access.service_of_url(found.access.url, "elsewhere") == (
        nats_service,
        kube_namespace,
        4222,
    )
    # Elsewhere (the default namespace, then fracpilot) there is no release.
    with pytest.raises(kube_access.KubeAccessError, match="no fracpilot release in namespace"):
        kube_access.find_release(api, KubeTarget(str(kubeconfig)), "default")
    pod = nats_pod(client.CoreV1Api(kube_admin), kube_namespace, release)
    # The Service's targetPort "client" is the pod's port of that name.
    assert kube_access.ready_pod(api, nats_service, kube_namespace, 4222) == (pod, 4222)
    api.close()


@pytest.fixture
def password_nats(
    kube_admin: client.ApiClient, kube_namespace: str, release: str, tmp_path: Path
) -> Iterator[EmbeddedNats]:
    """A nats-server that requires the release's user and password (from its Secret)."""
    data = (
        client.CoreV1Api(kube_admin)
        .read_namespaced_secret(f"{release}-fracpilot-nats-auth", kube_namespace)
        .data
    )
    password = base64.b64decode(data["password"]).decode()
    conf = tmp_path / "nats.conf"
    conf.write_text(f'authorization {{\n  user: fracpilot\n  password: "{password}"\n}}\n')
    server = EmbeddedNats(store_dir=str(tmp_path / "store"), extra_args=("-c", str(conf)))
    server.start()
    yield server
    server.cleanup()


def to_local(server: EmbeddedNats, calls: list[tuple[str, str, int]]) -> Any:
    """``pod_connector`` for the tests: records where it would go, connects to ``server``."""
    import socket

    def connector_for(api: Any, namespace: str, pod: str, port: int) -> Any:
        def connect() -> Stream:
            calls.append((namespace, pod, port))
            return socket.create_connection(("127.0.0.1", server.port), timeout=5)

        return connect

    return connector_for


def context_kubeconfig(kubeconfig: Path, namespace: str, out: Path) -> Path:
    """The same kubeconfig with a second context whose namespace is ``namespace``."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = dict(config["contexts"][0])
    context["name"] = "team"
    context["context"] = {**context["context"], "namespace": namespace}
    config["contexts"].append(context)
    out.write_text(yaml.safe_dump(config))
    return out


def test_a_command_reaches_nats_through_the_kubeconfig(
    kube_admin: client.ApiClient,
    kubeconfig: Path,
    kube_namespace: str,
    release: str,
    password_nats: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    env = {k: None for k in os.environ if k.startswith("FRACPILOT_NATS_")}
    kube = ["--kubeconfig", str(kubeconfig), "--release-namespace", kube_namespace]

    pod = nats_pod(client.CoreV1Api(kube_admin), kube_namespace, release)
    calls: list[tuple[str, str, int]] = []
    monkeypatch.setattr(kube_access, "pod_connector", to_local(password_nats, calls))
    for args in ([*kube, "status", "-o", "json"], ["status", *kube, "-o", "json"]):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("{")
        assert calls
        assert set(calls) == {(kube_namespace, pod, 4222)}
        calls.clear()

    # The context's namespace is where the release is looked for by default.
    team = context_kubeconfig(kubeconfig, kube_namespace, tmp_path / "kubeconfig")
    result = runner.invoke(
        app, ["status", "--kubeconfig", str(team), "--context", "team", "-o", "csv"], env=env
    )
    assert result.exit_code == 0, result.output
    assert calls

    # Without the Secret's password the server refuses: the credentials did the work.
    core = client.CoreV1Api(kube_admin)
    secret = f"{release}-fracpilot-nats-auth"
    kept = core.read_namespaced_secret(secret, kube_namespace).data["password"]
    core.patch_namespaced_secret(
        secret, kube_namespace, {"data": {"password": base64.b64encode(b"wrong").decode()}}
    )
    try:
        refused = runner.invoke(app, [*kube, "status"], env=env)
    finally:
        core.patch_namespaced_secret(secret, kube_namespace, {"data": {"password": kept}})
    assert refused.exit_code == 1
    assert "authorization violation" in refused.stderr


def test_kubectl_fracpilot_uses_the_real_port_forward(
    kube_admin: client.ApiClient, kubeconfig: Path, kube_namespace: str, release: str
) -> None:
    """Run by kubectl, the plugin opens the kubernetes client's port forward to the pod; with
    no kubelet behind the API server it fails, and the command says where and why."""
    pod = nats_pod(client.CoreV1Api(kube_admin), kube_namespace, release)
    done = subprocess.run(
        [
            KUBECTL,
            "fracpilot",
            "status",
            "--kubeconfig",
            str(kubeconfig),
            "--release-namespace",
            kube_namespace,
        ],
        env=plugin_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout
    assert f"port forward to {kube_namespace}/{pod}:4222 failed" in done.stderr, done.stderr
