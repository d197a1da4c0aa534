"""The pure lookups of ``kubectl fracpilot`` (fracpilot_cli.kube_access) and its forwarding
port (fracpilot_cli.forwarding) against a local TCP echo server. The API calls and a real
nats-server behind the port: tests/integration/k8s/test_kubectl_plugin.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from fracpilot_cli import kube_access, main
from fracpilot_cli.forwarding import Forwarder
from fracpilot_cli.kube_access import KubeAccessError, KubeTarget, SecretKey


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://fp-fracpilot-nats.tools.svc:4222", ("fp-fracpilot-nats", "tools", 4222)),
        ("nats://nats.tools.svc.cluster.local:4223", ("nats", "tools", 4223)),
        ("nats://nats.other", ("nats", "other", 4222)),
        ("nats://nats", ("nats", "here", 4222)),
        ("tls://nats.example.com:4222", None),
        ("nats://10.0.0.7:4222", None),
        ("nats://a.b.svc:4222,nats://c.b.svc:4222", ("a", "b", 4222)),
    ],
)
def test_service_of_url(url: str, expected: tuple[str, str, int] | None) -> None:
    assert kube_access.service_of_url(url, "here") == expected


def test_release_namespaces_asked_else_context_then_fracpilot() -> None:
    assert kube_access.release_namespaces(KubeTarget(namespace="a"), "b") == ["a"]
    assert kube_access.release_namespaces(KubeTarget(), "b") == ["b", "fracpilot"]
    assert kube_access.release_namespaces(KubeTarget(), None) == ["fracpilot"]
    assert kube_access.release_namespaces(KubeTarget(), "fracpilot") == ["fracpilot"]


def test_nats_access_reads_env_secret_refs_and_mounted_files() -> None:
    spec = {
        "containers": [
            {"name": "sidecar", "env": [{"name": "OTHER", "value": "x"}]},
            {
                "name": "decision",
                "env": [
                    {"name": "FRACPILOT_NATS_URL", "value": "tls://nats.example.com:4222"},
                    {
                        "name": "FRACPILOT_NATS_NKEY_SEED_FILE",
                        "value": "/etc/fracpilot/nats/auth/nkey.seed",
                    },
                    {"name": "FRACPILOT_NATS_TLS_CA_FILE", "value": "/etc/fracpilot/tls/ca.crt"},
                    {"name": "FRACPILOT_NATS_USER", "value": "plain"},
                    {
                        "name": "FRACPILOT_NATS_PASSWORD",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pw"}},
                    },
                ],
                "volumeMounts": [
                    {"name": "nats-auth", "mountPath": "/etc/fracpilot/nats/auth"},
                    {"name": "nats-tls", "mountPath": "/etc/fracpilot/tls"},
                ],
            },
        ],
        "volumes": [
            {
                "name": "nats-auth",
                "secret": {
                    "secretName": "mine",
                    "items": [{"key": "seed", "path": "nkey.seed"}],
                },
            },
            {"name": "nats-tls", "secret": {"secretName": "tls"}},
        ],
    }
    access = kube_access.nats_access_from_pod_spec(spec)
    assert access.url == "tls://nats.example.com:4222"
    assert access.values == {"user": "plain"}
    assert access.secrets == {
        "password": SecretKey("creds", "pw"),
        "nkey_seed_file": SecretKey("mine", "seed"),
        "tls_ca_file": SecretKey("tls", "ca.crt"),
    }


def test_a_file_not_from_a_secret_is_an_error() -> None:
    spec = {
        "containers": [
            {
                "env": [
                    {"name": "FRACPILOT_NATS_URL", "value": "nats://n:4222"},
                    {"name": "FRACPILOT_NATS_CREDS_FILE", "value": "/creds/nats.creds"},
                ],
                "volumeMounts": [{"name": "c", "mountPath": "/creds"}],
            }
        ],
        "volumes": [{"name": "c", "configMap": {"name": "x"}}],
    }
    with pytest.raises(KubeAccessError, match="not mounted from a Secret"):
        kube_access.nats_access_from_pod_spec(spec)
    with pytest.raises(KubeAccessError, match="no container sets FRACPILOT_NATS_URL"):
        kube_access.nats_access_from_pod_spec({"containers": [{"env": []}]})


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP server that sends back what it reads, upper-cased."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_the_forwarder_copies_both_ways_per_connection(echo: int) -> None:
    opened: list[int] = []

    def connect() -> socket.socket:
        opened.append(1)
        return socket.create_connection(("127.0.0.1", echo))

    with Forwarder(connect) as forwarder:
        assert forwarder.url == f"nats://127.0.0.1:{forwarder.port}"
        for word in (b"ping", b"pong"):  # a connection each: a stream each
            with socket.create_connection(("127.0.0.1", forwarder.port), timeout=5) as c:
                c.sendall(word * 10_000)
                got = b""
                while len(got) < len(word) * 10_000:
                    got += c.recv(65536)
                assert got == word.upper() * 10_000
    assert len(opened) == 2


def test_a_failing_connector_closes_the_connection_and_keeps_the_reason() -> None:
    def connect() -> socket.socket:
        raise OSError("pods/portforward refused")

    with Forwarder(connect) as forwarder:
        with socket.create_connection(("127.0.0.1", forwarder.port), timeout=5) as c:
            assert c.recv(10) == b""  # closed
        assert forwarder.errors == ["pods/portforward refused"]


def test_command_name_skips_global_options() -> None:
    assert main.command_name(["-o", "json", "status"]) == "status"
    assert main.command_name(["--nats-url", "nats://x", "--json", "explain", "a/b"]) == "explain"
    assert main.command_name(["-n", "status", "report"]) == "report"  # -n took "status"
    assert main.command_name(["--version"]) is None


def test_with_identity_takes_the_named_secret_and_keeps_the_tls_files() -> None:
    service = kube_access.NatsAccess(
        url="nats://fp-fracpilot-nats.gpu.svc:4222",
        values={"user": "ignored"},
        secrets={
            "user": SecretKey("fp-fracpilot-nats-decision", "user"),
            "password": SecretKey("fp-fracpilot-nats-decision", "password"),
            "tls_ca_file": SecretKey("fp-fracpilot-nats-ca", "ca.crt"),
        },
    )
    clients = {
        "operator.secret": "fp-fracpilot-nats-operator",
        "policy-admin.secret": "fp-fracpilot-nats-policy-admin",
        "userKey": "u",
        "passwordKey": "p",
    }
    operator = kube_access.with_identity(service, clients, kube_access.OPERATOR)
    assert operator.url == service.url
    assert operator.values == {}
    assert operator.secrets == {
        "user": SecretKey("fp-fracpilot-nats-operator", "u"),
        "password": SecretKey("fp-fracpilot-nats-operator", "p"),
        "tls_ca_file": SecretKey("fp-fracpilot-nats-ca", "ca.crt"),
    }
    admin = kube_access.with_identity(service, clients, kube_access.POLICY_ADMIN)
    assert admin.secrets["password"] == SecretKey("fp-fracpilot-nats-policy-admin", "p")
    # A release with one shared identity has no nats-clients ConfigMap: the service's.
    assert kube_access.with_identity(service, None, kube_access.OPERATOR) == service
    with pytest.raises(KubeAccessError, match="no policy-admin identity"):
        kube_access.with_identity(service, {"operator.secret": "x"}, kube_access.POLICY_ADMIN)
