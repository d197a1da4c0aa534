"""The chart's default bus, run for real (issue 29): ``helm template`` with the default values,
then three real nats-servers with the rendered ConfigMap (nats.conf and permissions.conf), the
environment the StatefulSet gives them (each identity's user and password from its Secret) and
the certificate the chart made. Twice: with the Secrets helm renders (``secretGeneration:
helm``), and with the ones the release-secrets hook makes from the Job's rendered arguments
(``secretGeneration: job``, the hook's own functions).

Clients connect as the chart's pods do: the services with the identity and CA their
Deployment names, the operator and policy-admin from the Secrets the ``nats-clients`` ConfigMap
names (what the CLI reads). It shows: without credentials, or in plain text, a connection is
refused; each identity publishes only its own subjects (a forged decision from ingest, a
policy write from the operator: refused); the decision service runs under its identity and
policy-admin alone changes a policy. Adapted for loopback only: ports, routes, paths
(tests/support/nats_config_cluster.py) and the certificate files' directory.

The other choices, rendered: your NATS (``nats.deploy=false``) takes the same identities from
Secrets (yours, or the chart's run by a server with deploy/nats's configuration), and a
certificate of yours (``nats.tls.existingSecret``, e.g. cert-manager's) serves the built-in one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from factories import decision, sample
from fracpilot_actuator.hooks import release_secrets
from fracpilot_cli import kube_access
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy, PolicyReply
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import NatsSecurityError, open_connection
from helpers import running, wait_for
from k8s_control_plane import REPO_ROOT, ControlPlane, ensure_testbin
from support.chart_render import SHARED_CLUSTER_VALUES
from support.nats_auth import SecuredNats, chart_tls_files
from support.nats_config_cluster import ConfigFileCluster

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
NS = "gpu"
PREFIX = "fp-fracpilot"  # release "fp"
IDENTITIES = ("ingest", "decision", "actuator", "operator", "policy-admin")


def render(*args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(ensure_testbin() / "helm"), "template", "fp", str(CHART), "--namespace", NS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def secrets_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {
        d["metadata"]["name"]: {k: base64.b64decode(v) for k, v in (d.get("data") or {}).items()}
        for d in docs
        if d["kind"] == "Secret"
    }


def hook_secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    """What the release-secrets hook makes for the rendered ``create`` Job's arguments, with
    the hook's own functions (the apiserver round trip is test_helm_release_tooling's)."""
    job = find(docs, "Job", f"{PREFIX}-release-secrets-create")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed: argparse.Namespace = release_secrets._parser().parse_args(args)
    made: dict[str, dict[str, bytes]] = {}
    for identity, _, name in (i.partition("=") for i in parsed.nats_identities):
        made[name] = release_secrets.password_secret_data(
            identity, parsed.nats_user_key, parsed.nats_password_key
        )
    assert parsed.nats_tls_secret, "the hook makes no NATS certificate"
    made[parsed.nats_tls_secret] = release_secrets.nats_tls_secret_data(
        f"{parsed.nats_tls_secret}-ca",
        parsed.nats_dns_names,
        dt.datetime.now(dt.UTC),
        dt.timedelta(days=parsed.nats_validity_days),
    )
    made[parsed.nats_ca_secret] = {"ca.crt": made[parsed.nats_tls_secret]["ca.crt"]}
    return made


def resolve_env(env: list[dict[str, Any]], secrets: dict[str, dict[str, bytes]]) -> dict[str, str]:
    """A container's environment as the kubelet fills it (secretKeyRef from the Secrets)."""
    out: dict[str, str] = {}
    for e in env:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            out[e["name"]] = secrets[ref["name"]][ref["key"]].decode()
        elif "value" in e:
            out[e["name"]] = e["value"]
    return out


@dataclass
class Bus:
    """The rendered NATS running, and how each identity connects to it."""

    cluster: ConfigFileCluster
    ca: Path
    credentials: dict[str, tuple[str, str]]  # identity -> (user, password)
    docs: list[dict[str, Any]]
    secrets: dict[str, dict[str, bytes]]

    @property
    def url(self) -> str:
        return self.cluster.url

    def settings(self, identity: str | None, **extra: Any) -> dict[str, Any]:
        nats_fields: dict[str, Any] = {"url": self.url, "tls_ca_file": str(self.ca)}
        if identity is not None:
            user, password = self.credentials[identity]
            nats_fields |= {"user": user, "password": password}
        return {"nats": nats_fields | extra}


def start_bus(
    docs: list[dict[str, Any]], secrets: dict[str, Any], workdir: Path, ca_only: bool = True
) -> Bus:
    """``ca_only``: the services' CA volume is the chart's CA-only Secret (not so with
    ``nats.tls.existingSecret``, whose Secret holds the server's key beside the CA)."""
    config = find(docs, "ConfigMap", f"{PREFIX}-nats")["data"]
    server = find(docs, "StatefulSet", f"{PREFIX}-nats")["spec"]["template"]["spec"]
    container = next(c for c in server["containers"] if c["name"] == "nats")
    env = resolve_env(container["env"], secrets)
    env.pop("POD_NAME", None)  # each node sets its own
    # The server's certificate volume, written where the configuration reads it.
    tls_volume = next(v for v in server["volumes"] if v["name"] == "tls")["secret"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")["mountPath"]
    tls_dir = workdir / "nats-tls"
    tls_dir.mkdir(parents=True)
    for item in tls_volume["items"]:
        (tls_dir / item["path"]).write_bytes(secrets[tls_volume["secretName"]][item["key"]])
    conf = config["nats.conf"].replace(f"{mount}/", f"{tls_dir}/")

    # The clients: each service's identity from its Deployment, the CA from its volume.
    credentials: dict[str, tuple[str, str]] = {}
    ca = workdir / "ca.crt"
    for service in ("ingest", "decision", "actuator"):
        pod = find(docs, "Deployment", f"{PREFIX}-{service}")["spec"]["template"]["spec"]
        service_env = resolve_env(pod["containers"][0]["env"], secrets)
        credentials[service] = (
            service_env["FRACPILOT_NATS_USER"],
            service_env["FRACPILOT_NATS_PASSWORD"],
        )
        assert service_env["FRACPILOT_NATS_TLS_CA_FILE"] == "/etc/fracpilot/nats/tls/ca.crt"
        ca_volume = next(v for v in pod["volumes"] if v["name"] == "nats-tls")["secret"]
        ca.write_bytes(secrets[ca_volume["secretName"]]["ca.crt"])
        if ca_only:
            assert "tls.key" not in secrets[ca_volume["secretName"]]  # the CA only
    clients = find(docs, "ConfigMap", f"{PREFIX}-nats-clients")["data"]
    for who in ("operator", "policy-admin"):
        data = secrets[clients[f"{who}.secret"]]
        credentials[who] = (
            data[clients["userKey"]].decode(),
            data[clients["passwordKey"]].decode(),
        )
    cluster = ConfigFileCluster(
        conf,
        env=env,
        files={"permissions.conf": config["permissions.conf"]},
        prefix=f"{PREFIX}-nats",
    )
    cluster.start()
    return Bus(cluster, ca, credentials, docs, secrets)


@pytest.fixture(scope="module", params=["helm", "job"])
def bus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    """The default values' NATS, its Secrets made by helm or by the hook."""
    if request.param == "helm":
        docs = render()
        secrets = secrets_of(docs)
    else:
        docs = render("--set", "secretGeneration=job")
        assert not [d for d in docs if d["kind"] == "Secret"]  # no secret material rendered
        secrets = hook_secrets(docs)
    started = start_bus(docs, secrets, tmp_path_factory.mktemp(f"nats-{request.param}"))
    try:
        yield started
    finally:
        started.cluster.cleanup()


class Connection:
    """A client connected as one identity, remembering the errors the server sent it."""

    def __init__(self, nc: Any, errors: list[Exception]) -> None:
        self.nc = nc
        self.errors = errors

    def denied(self, subject: str) -> bool:
        return any(
            "permissions violation" in str(e).lower() and f'"{subject.lower()}"' in str(e).lower()
            for e in self.errors
        )


async def connect_with(settings: ServiceSettings) -> Connection:
    errors: list[Exception] = []

    async def remember(exc: Exception) -> None:
        errors.append(exc)

    nc = await open_connection(settings, servers=settings.nats.url.split(","), error_cb=remember)
    return Connection(nc, errors)


async def connect_as(bus: Bus, identity: str) -> Connection:
    return await connect_with(ServiceSettings(**bus.settings(identity)))


# --- who may connect ---------------------------------------------------------------------------


def test_the_default_render_turns_auth_and_tls_on() -> None:
    data = find(render(), "ConfigMap", f"{PREFIX}-nats")["data"]
    conf = data["nats.conf"]
    # One source: the rendered permissions are deploy/nats/permissions.conf as it is.
    source = (REPO_ROOT / "deploy" / "nats" / "permissions.conf").read_text()
    assert data["permissions.conf"].strip() == source.strip()
    assert "include permissions.conf" in conf
    assert "verify: true" in conf  # routes: mutual TLS
    assert "\ntls {" in conf


async def test_a_connection_without_credentials_is_refused(bus: Bus) -> None:
    with pytest.raises(NatsSecurityError, match="refused this identity"):
        await open_connection(ServiceSettings(**bus.settings(None)), servers=bus.url.split(","))
    wrong = bus.settings("decision", password="not-the-password")
    with pytest.raises(NatsSecurityError, match="refused this identity"):
        await open_connection(ServiceSettings(**wrong), servers=bus.url.split(","))


def test_tls_is_required(bus: Bus) -> None:
    """A client speaking plain text gets the server's refusal, even with a valid identity."""
    port = bus.cluster.nodes[0].port
    user, password = bus.credentials["operator"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        info = json.loads(plain.recv(65536).decode().removeprefix("INFO ").strip())
        assert info["tls_required"] is True
        assert info["auth_required"] is True
        connect = {"user": user, "pass": password, "verbose": False, "tls_required": False}
        plain.sendall(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        answer = b""
        try:
            while chunk := plain.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert b"PONG" not in answer
    # And a TLS client that does not trust the chart's CA does not get in either.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.recv(65536)  # INFO, then the TLS handshake
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")


# --- each identity, its own subjects -----------------------------------------------------------

USAGE = subjects.usage_subject(sample().workload)
DECISION = subjects.decision_subject(decision().workload)
ACTUATION = f"{subjects.ACTUATION_PREFIX}.inference.chat"
POLICY_KV = "$KV.fracpilot_policies.cluster"
ALLOWED = {
    "ingest": {USAGE},
    "decision": {DECISION, POLICY_KV},
    "actuator": {ACTUATION},
    "operator": set(),
    "policy-admin": {subjects.POLICY_SET},
}


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_each_identity_publishes_only_its_own_subjects(bus: Bus, identity: str) -> None:
    conn = await connect_as(bus, identity)
    try:
        for subject in (USAGE, DECISION, ACTUATION, POLICY_KV, subjects.POLICY_SET):
            await conn.nc.publish(subject, b"{}")
            await conn.nc.flush()  # the server answers a refusal before this PING's PONG
            if subject in ALLOWED[identity]:
                await asyncio.sleep(0.1)
                assert not conn.denied(subject), (identity, subject)
            else:
                await wait_for(lambda s=subject: conn.denied(s), timeout=5)
    finally:
        await conn.nc.close()


async def test_a_forged_decision_and_an_operator_policy_write_are_refused(bus: Bus) -> None:
    """The decision service runs under its rendered identity; ingest cannot put a decision in
    its stream, the operator cannot change a policy, policy-admin can."""
    settings = DecisionSettings(**bus.settings("decision", replicas=3), decision_partitions=2)
    async with running(DecisionService(settings)):
        ingest = await connect_as(bus, "ingest")
        forged = decision(decision_id="forged-by-ingest").to_json()
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await ingest.nc.jetstream().publish(DECISION, forged, timeout=1)
        assert ingest.denied(DECISION)
        await ingest.nc.close()

        wanted = Policy(max_fraction=0.5, min_history_s=60.0).to_json()
        operator = await connect_as(bus, "operator")
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await operator.nc.request(subjects.POLICY_SET, wanted, timeout=1.5)
        await wait_for(lambda: operator.denied(subjects.POLICY_SET), timeout=5)
        before = PolicyReply.model_validate_json(
            (await operator.nc.request(subjects.POLICY_GET, b"", timeout=5)).data
        )
        assert before.ok
        assert before.policy is not None
        assert before.policy.max_fraction != 0.5

        admin = await connect_as(bus, "policy-admin")
        reply = PolicyReply.model_validate_json(
            (await admin.nc.request(subjects.POLICY_SET, wanted, timeout=5)).data
        )
        await admin.nc.close()
        assert reply.ok, reply.error
        after = PolicyReply.model_validate_json(
            (await operator.nc.request(subjects.POLICY_GET, b"", timeout=5)).data
        )
        assert after.policy is not None
        assert after.policy.max_fraction == 0.5
        # The operator reads the decisions stream, where no forged decision landed.
        js = operator.nc.jetstream()
        info = await js.stream_info(subjects.DECISION_STREAM)
        assert info.state.messages == 0
        await operator.nc.close()


# --- the CLI's identities ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identity", "may_set"), [(kube_access.OPERATOR, False), (kube_access.POLICY_ADMIN, True)]
)
async def test_the_kubectl_plugin_reads_as_operator_and_sets_as_policy_admin(
    bus: Bus, identity: str, may_set: bool, tmp_path: Path
) -> None:
    """What ``kubectl fracpilot`` derives from the rendered release (kube_access's lookups on
    the decision Deployment and the nats-clients ConfigMap), filled from the Secrets, against
    the running bus: the operator reads and may not set, policy-admin sets."""
    pod = find(bus.docs, "Deployment", f"{PREFIX}-decision")["spec"]["template"]["spec"]
    clients = find(bus.docs, "ConfigMap", f"{PREFIX}-nats-clients")["data"]
    access = kube_access.with_identity(
        kube_access.nats_access_from_pod_spec(pod), clients, identity
    )
    assert access.secrets["user"].secret == f"{PREFIX}-nats-{identity}"
    filled = {k: bus.secrets[ref.secret][ref.key] for k, ref in access.secrets.items()}
    (tmp_path / "ca.crt").write_bytes(filled["tls_ca_file"])
    settings = {
        "url": bus.url,
        "user": filled["user"].decode(),
        "password": filled["password"].decode(),
        "tls_ca_file": str(tmp_path / "ca.crt"),
    }
    errors: list[Exception] = []

    async def remember(exc: Exception) -> None:
        errors.append(exc)

    nc = await open_connection(
        ServiceSettings(nats=settings), servers=bus.url.split(","), error_cb=remember
    )
    conn = Connection(nc, errors)
    try:
        await nc.publish(subjects.POLICY_SET, b"{}")
        await nc.publish(subjects.POLICY_GET, b"{}")
        await nc.flush()
        if may_set:
            await asyncio.sleep(0.1)
            assert not conn.denied(subjects.POLICY_SET)
        else:
            await wait_for(lambda: conn.denied(subjects.POLICY_SET), timeout=5)
        assert not conn.denied(subjects.POLICY_GET)
    finally:
        await nc.close()


# --- your NATS (nats.deploy=false): the same identities, from Secrets ---------------------------

EXTERNAL = ("--set", "nats.deploy=false", "--set", "nats.url=tls://nats.example:4222")
SERVICES = ("ingest", "decision", "actuator")


def service_pod(docs: list[dict[str, Any]], service: str) -> dict[str, Any]:
    pod: dict[str, Any] = find(docs, "Deployment", f"{PREFIX}-{service}")["spec"]["template"]
    return pod["spec"]


def your_identity_secrets() -> list[str]:
    """--set values naming a Secret of yours, my-nats-<identity>, for every identity."""
    out: list[str] = []
    for identity in IDENTITIES:
        out += [
            "--set",
            f"nats.auth.identities.{identity.replace('-admin', 'Admin')}=my-nats-{identity}",
        ]
    return out


def test_your_nats_takes_each_identity_from_your_secrets() -> None:
    args = (*EXTERNAL, *your_identity_secrets(), "--set", "nats.tls.existingSecret=my-nats-ca")
    docs = render(*args)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("StatefulSet", f"{PREFIX}-nats") not in kinds
    assert not [n for k, n in kinds if k == "Secret" and n.startswith(f"{PREFIX}-nats")]
    for service in SERVICES:
        pod = service_pod(docs, service)
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["FRACPILOT_NATS_URL"]["value"] == "tls://nats.example:4222"
        for variable in ("FRACPILOT_NATS_USER", "FRACPILOT_NATS_PASSWORD"):
            assert env[variable]["valueFrom"]["secretKeyRef"]["name"] == f"my-nats-{service}"
        others = [f"my-nats-{i}" for i in IDENTITIES if i != service]
        assert not [o for o in others if o in json.dumps(pod)], f"{service}: another identity"
        ca = next(v for v in pod["volumes"] if v["name"] == "nats-tls")["secret"]
        assert (ca["secretName"], ca["items"]) == (
            "my-nats-ca",
            [{"key": "ca.crt", "path": "ca.crt"}],
        )
        assert env["FRACPILOT_NATS_TLS_CA_FILE"]["value"] == "/etc/fracpilot/nats/tls/ca.crt"
    clients = find(docs, "ConfigMap", f"{PREFIX}-nats-clients")["data"]
    assert clients["operator.secret"] == "my-nats-operator"  # the CLI's default
    assert clients["policy-admin.secret"] == "my-nats-policy-admin"  # policy set
    # With the hook making the release's Secrets, it makes none of these either.
    hooked = render(*args, "--set", "secretGeneration=job")
    job = find(hooked, "Job", f"{PREFIX}-release-secrets-create")
    parsed = release_secrets._parser().parse_args(
        job["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert (parsed.nats_identities, parsed.nats_tls_secret) == ([], "")


async def test_your_nats_run_with_the_chart_made_identities(tmp_path: Path) -> None:
    """No Secrets given: the chart makes one per identity, and your server, run with
    deploy/nats's configuration and those passwords, lets each service in as its Deployment
    says, each only on its own subjects; the CLI's operator may not set a policy."""
    tls = chart_tls_files(tmp_path / "tls")  # stands in for your server's certificate
    docs = render(*EXTERNAL, "--set", "nats.tls.existingSecret=my-nats-ca")
    secrets = secrets_of(docs) | {"my-nats-ca": {"ca.crt": tls.ca.read_bytes()}}
    made = {i: secrets[f"{PREFIX}-nats-{i}"] for i in IDENTITIES}
    assert {i: made[i]["user"].decode() for i in IDENTITIES} == {i: i for i in IDENTITIES}
    passwords = {i: made[i]["password"].decode() for i in IDENTITIES}
    assert len(set(passwords.values())) == len(IDENTITIES)
    server = SecuredNats(tmp_path / "nats", tls=tls, passwords=passwords).start()
    try:
        ca = tmp_path / "ca.crt"
        connections: dict[str, Connection] = {}
        for service in SERVICES:
            pod = service_pod(docs, service)
            env = resolve_env(pod["containers"][0]["env"], secrets)
            volume = next(v for v in pod["volumes"] if v["name"] == "nats-tls")["secret"]
            ca.write_bytes(secrets[volume["secretName"]]["ca.crt"])
            settings = {
                "url": server.url,
                "user": env["FRACPILOT_NATS_USER"],
                "password": env["FRACPILOT_NATS_PASSWORD"],
                "tls_ca_file": str(ca),
            }
            connections[service] = await connect_with(ServiceSettings(nats=settings))
        clients = find(docs, "ConfigMap", f"{PREFIX}-nats-clients")["data"]
        operator = secrets[clients["operator.secret"]]
        connections["operator"] = await connect_with(
            ServiceSettings(
                nats={
                    "url": server.url,
                    "user": operator[clients["userKey"]].decode(),
                    "password": operator[clients["passwordKey"]].decode(),
                    "tls_ca_file": str(ca),
                }
            )
        )
        forbidden = {
            "ingest": DECISION,
            "decision": ACTUATION,
            "actuator": USAGE,
            "operator": subjects.POLICY_SET,
        }
        for who, subject in forbidden.items():
            conn = connections[who]
            await conn.nc.publish(subject, b"{}")
            await conn.nc.flush()
            await wait_for(lambda c=conn, s=subject: c.denied(s), timeout=5)
        allowed = {"ingest": USAGE, "decision": DECISION, "actuator": ACTUATION}
        for who, subject in allowed.items():
            conn = connections[who]
            await conn.nc.publish(subject, b"{}")
            await conn.nc.flush()
        await asyncio.sleep(0.2)
        assert not [who for who, s in allowed.items() if connections[who].denied(s)]
        for conn in connections.values():
            await conn.nc.close()
    finally:
        server.cleanup()


def install_notes(kube: ControlPlane, *args: str) -> str:
    """NOTES.txt as ``helm install --dry-run`` prints it (``helm template`` does not)."""
    proc = subprocess.run(
        [
            *(str(kube.helm), "install", "fp", str(CHART), "--namespace", NS, "--dry-run=client"),
            *SHARED_CLUSTER_VALUES,
            *("--kubeconfig", str(kube.write_kubeconfig()), *args),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout.split("NOTES:", 1)[1]


def test_the_notes_name_the_identities_secrets_of_your_nats(kube: ControlPlane) -> None:
    text = " ".join(install_notes(kube, *EXTERNAL, *your_identity_secrets()).split())
    assert "WARNING" not in text
    assert (
        "The services connect to your NATS at tls://nats.example:4222, one identity per "
        "component, each from its own Secret: my-nats-ingest, my-nats-decision, "
        "my-nats-actuator, my-nats-operator, my-nats-policy-admin." in text
    )
    # Without auth, explicitly: the warning names your server.
    open_bus = " ".join(install_notes(kube, *EXTERNAL, "--set", "nats.auth.type=none").split())
    assert (
        "WARNING: NATS authentication is OFF (nats.auth.type: none). Anyone who reaches "
        "tls://nats.example:4222 can publish decisions" in open_bus
    )


# --- a certificate of yours (cert-manager's) for the built-in NATS ------------------------------


async def test_a_certificate_of_yours_serves_the_builtin_nats(tmp_path: Path) -> None:
    """``nats.tls.existingSecret`` (docs/nats.md: a cert-manager Certificate's Secret, tls.crt,
    tls.key, ca.crt): the chart makes no certificate, the servers and their routes use that
    one, the services trust its ca.crt (only that key is mounted), and TLS is still required."""
    args = ("--set", "nats.tls.existingSecret=fracpilot-nats-cert")
    docs = render(*args)
    made = secrets_of(docs)
    assert f"{PREFIX}-nats-tls" not in made
    assert f"{PREFIX}-nats-ca" not in made
    server = find(docs, "StatefulSet", f"{PREFIX}-nats")["spec"]["template"]["spec"]
    assert next(v for v in server["volumes"] if v["name"] == "tls")["secret"]["secretName"] == (
        "fracpilot-nats-cert"
    )
    for service in SERVICES:
        volume = next(v for v in service_pod(docs, service)["volumes"] if v["name"] == "nats-tls")
        assert volume["secret"]["secretName"] == "fracpilot-nats-cert"
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    hooked = find(
        render(*args, "--set", "secretGeneration=job"), "Job", f"{PREFIX}-release-secrets-create"
    )
    parsed = release_secrets._parser().parse_args(
        hooked["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert parsed.nats_tls_secret == ""

    # cert-manager's CA issuer writes the same three keys as the chart's hook.
    tls = chart_tls_files(tmp_path / "tls")
    yours = {
        "ca.crt": tls.ca.read_bytes(),
        "tls.crt": tls.server_cert.read_bytes(),
        "tls.key": tls.server_key.read_bytes(),
    }
    bus = start_bus(docs, made | {"fracpilot-nats-cert": yours}, tmp_path / "run", ca_only=False)
    try:
        operator = await connect_as(bus, "operator")
        info = await operator.nc.jetstream().account_info()
        assert info is not None
        await operator.nc.close()
        port = bus.cluster.nodes[0].port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
            hello = json.loads(plain.recv(65536).decode().removeprefix("INFO ").strip())
        assert hello["tls_required"] is True
    finally:
        bus.cluster.cleanup()
