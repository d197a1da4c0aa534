"""The built-in NATS's certificate from cert-manager, and its reload without a restart (issue 29).

Rendered with the real helm: by default no cert-manager object and no reloader (the install as
before); with ``nats.tls.certManager.enabled`` and cert-manager's API announced, the chart's CA
chain (or your issuer) and a Certificate for the names the chart-made certificate covers, for
server and client auth (the routes are mutual TLS), written into the Secret the servers and
the services mount; the config reloader sidecar beside the server. (The apiserver accepts these
objects: test_helm_chart.py, with cert-manager's CRDs.)

Run for real: three nats-servers started from the rendered ConfigMap with a certificate as
cert-manager writes it; the files are replaced by a certificate of a new CA, the servers get
SIGHUP (what the reloader sends: nats-server reloads its configuration, TLS included:
nats-io/nats-server server/signal.go, ``case syscall.SIGHUP: s.Reload()``; server/reload.go,
``tlsOption`` for clients and ``clusterOption`` for routes, whose handshakes read the reloaded
options' ``Cluster.TLSConfig`` in server/route.go; commit 1787eee0), and without a restart a
client trusting only the new CA gets in while one trusting only the old CA is refused; a server
restarted on the new files routes to the reloaded ones again.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.connect import open_connection
from k8s_control_plane import REPO_ROOT, ensure_testbin, wait_for
from support.nats_auth import TlsFiles, chart_tls_files
from support.nats_config_cluster import ConfigFileCluster

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
NS = "gpu"
PREFIX = "fp-fracpilot"  # release "fp"
CERT_MANAGER = (
    "--api-versions=cert-manager.io/v1/Certificate",
    "--api-versions=cert-manager.io/v1/Issuer",
)
ON = ("--set", "nats.tls.certManager.enabled=true", *CERT_MANAGER)
TLS_FILES = ["tls.crt", "tls.key", "ca.crt"]


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure_testbin() / "helm"), "template", "fp", str(CHART), "--namespace", NS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(*args: str) -> list[dict[str, Any]]:
    proc = helm_template(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def named(docs: list[dict[str, Any]], *kinds: str) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in kinds}


def nats_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "StatefulSet", f"{PREFIX}-nats")["spec"]["template"]["spec"]
    return spec


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod["containers"] if c["name"] == name]
    (only,) = found
    return only


# --- rendered ----------------------------------------------------------------------------------


def test_by_default_no_cert_manager_object_and_no_reloader() -> None:
    """The default install as before, even where cert-manager is served: the chart-made CA
    (its Secrets), no NATS Certificate or Issuer, no reloader, no shared process namespace."""
    for args in ((), CERT_MANAGER):
        docs = render(*args)
        assert not {n for _, n in named(docs, "Certificate", "Issuer") if "nats" in n}
        assert {f"{PREFIX}-nats-tls", f"{PREFIX}-nats-ca"} <= {n for _, n in named(docs, "Secret")}
        pod = nats_pod(docs)
        assert [c["name"] for c in pod["containers"]] == ["nats", "metrics"]
        assert "shareProcessNamespace" not in pod


def test_cert_manager_issues_the_servers_certificate_from_the_charts_ca() -> None:
    docs = render(*ON)
    nats_objects = {(k, n) for k, n in named(docs, "Certificate", "Issuer") if "nats" in n}
    assert nats_objects == {
        ("Issuer", f"{PREFIX}-nats-selfsigned"),
        ("Certificate", f"{PREFIX}-nats-ca"),
        ("Issuer", f"{PREFIX}-nats-ca"),
        ("Certificate", f"{PREFIX}-nats"),
    }
    ca = find(docs, "Certificate", f"{PREFIX}-nats-ca")["spec"]
    assert ca["isCA"] is True
    assert ca["issuerRef"]["name"] == f"{PREFIX}-nats-selfsigned"
    assert find(docs, "Issuer", f"{PREFIX}-nats-ca")["spec"] == {
        "ca": {"secretName": ca["secretName"]}
    }
    cert = find(docs, "Certificate", f"{PREFIX}-nats")["spec"]
    assert cert["issuerRef"] == {
        "name": f"{PREFIX}-nats-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    # The names of the chart-made certificate: the Service, every pod (routes), loopback.
    headless = f"{PREFIX}-nats-headless"
    assert cert["dnsNames"] == [
        f"{PREFIX}-nats.{NS}.svc",
        f"{PREFIX}-nats.{NS}.svc.cluster.local",
        f"{PREFIX}-nats.{NS}",
        f"{PREFIX}-nats",
        f"*.{headless}.{NS}.svc",
        f"*.{headless}.{NS}.svc.cluster.local",
        "localhost",
    ]
    assert cert["ipAddresses"] == ["127.0.0.1"]
    assert {"server auth", "client auth"} <= set(cert["usages"])
    # Into the Secret the servers mount; the services mount its ca.crt alone.
    assert cert["secretName"] == f"{PREFIX}-nats-tls"
    pod = nats_pod(docs)
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]
    assert tls["secretName"] == f"{PREFIX}-nats-tls"
    assert [i["key"] for i in tls["items"]] == TLS_FILES
    for service in ("ingest", "decision", "actuator"):
        spec = find(docs, "Deployment", f"{PREFIX}-{service}")["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == "nats-tls")["secret"]
        assert volume["secretName"] == f"{PREFIX}-nats-tls"
        assert volume["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # No certificate material rendered, none made by the hook.
    secrets = {n for _, n in named(docs, "Secret")}
    assert not secrets & {f"{PREFIX}-nats-tls", f"{PREFIX}-nats-ca"}
    hooked = render(*ON, "--set", "secretGeneration=job")
    job = find(hooked, "Job", f"{PREFIX}-release-secrets-create")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--nats-tls-secret", "--nats-ca-secret"))]


def test_the_reloader_signals_the_server_on_a_changed_certificate() -> None:
    pod = nats_pod(render(*ON, "--set", "global.imageRegistry=mirror.corp:5000"))
    assert pod["shareProcessNamespace"] is True
    reloader = container(pod, "reloader")
    assert reloader["image"].startswith("mirror.corp:5000/natsio/nats-server-config-reloader:")
    args = reloader["args"]
    server = container(pod, "nats")
    assert args[:2] == ["-pid", "/var/run/nats/nats.pid"]
    assert "/var/run/nats/nats.pid" in server["lifecycle"]["preStop"]["exec"]["command"][-1]
    watched = [args[i + 1] for i, a in enumerate(args) if a == "-config"]
    assert watched == ["/etc/nats/nats.conf", *(f"/etc/nats-tls/{f}" for f in TLS_FILES)]
    mounts = {m["name"]: m["mountPath"] for m in reloader["volumeMounts"]}
    assert mounts == {
        m["name"]: m["mountPath"] for m in server["volumeMounts"] if m["name"] in mounts
    }
    assert set(mounts) == {"config", "run", "tls"}


def test_your_issuer_and_the_fallbacks() -> None:
    issuer = (
        "--set",
        "nats.tls.certManager.issuerRef.name=corp-ca",
        "--set",
        "nats.tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    docs = render(*ON, *issuer)
    assert {(k, n) for k, n in named(docs, "Certificate", "Issuer") if "nats" in n} == {
        ("Certificate", f"{PREFIX}-nats")
    }
    assert find(docs, "Certificate", f"{PREFIX}-nats")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    # cert-manager's API absent: the chart-made CA, as webhook.certManager does; no reloader.
    docs = render("--set", "nats.tls.certManager.enabled=true")
    assert "Certificate" not in {k for k, _ in named(docs, "Certificate")}
    assert f"{PREFIX}-nats-ca" in {n for _, n in named(docs, "Secret")}
    assert "reloader" not in [c["name"] for c in nats_pod(docs)["containers"]]
    # A Secret of yours can rotate too: the reloader runs (auto); false turns it off.
    yours = ("--set", "nats.tls.existingSecret=my-nats-cert")
    assert "reloader" in [c["name"] for c in nats_pod(render(*yours))["containers"]]
    off = render(*ON, "--set", "nats.reloader.enabled=false")
    assert [c["name"] for c in nats_pod(off)["containers"]] == ["nats", "metrics"]
    # Both at once is refused: cert-manager would overwrite your Secret.
    both = helm_template(*ON, *yours)
    assert both.returncode != 0
    assert "nats.tls.certManager.enabled and nats.tls.existingSecret" in both.stderr
    wrong = helm_template("--set", "nats.reloader.enabled=sometimes")
    assert wrong.returncode != 0
    assert "/nats/reloader/enabled" in wrong.stderr


# --- run for real: a renewed certificate reloaded without a restart ----------------------------


def identity_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The server container's identities from the rendered Secrets (the kubelet's part)."""
    secrets = {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }
    env = {}
    for e in container(nats_pod(docs), "nats")["env"]:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def write_secret(files: TlsFiles, directory: Path) -> None:
    """The certificate as cert-manager writes it and the kubelet projects it: the volume's
    three files replaced (each file atomically, as the kubelet swaps its data directory)."""
    for name, source in (
        ("tls.crt", files.server_cert),
        ("tls.key", files.server_key),
        ("ca.crt", files.ca),
    ):
        staged = directory / f".{name}.new"
        staged.write_bytes(source.read_bytes())
        os.replace(staged, directory / name)


def handshake(port: int, ca: Path) -> None:
    """A TLS handshake with the server at ``port``, trusting ``ca`` alone (raises when the
    server's certificate does not verify)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.recv(65536)  # INFO, then TLS
        context = ssl.create_default_context(cafile=str(ca))
        with context.wrap_socket(raw, server_hostname="127.0.0.1"):
            pass


def trusted_by(port: int, ca: Path) -> bool:
    try:
        handshake(port, ca)
    except ssl.SSLCertVerificationError:
        return False
    return True


def route_peers(monitor_port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/routez", timeout=5) as r:
        routez = json.load(r)
    return {route["remote_name"] for route in routez.get("routes") or []}


async def test_a_renewed_certificate_is_reloaded_without_a_restart(tmp_path: Path) -> None:
    docs = render(*ON)
    config = find(docs, "ConfigMap", f"{PREFIX}-nats")["data"]
    tls_dir = tmp_path / "nats-tls"
    tls_dir.mkdir()
    old = chart_tls_files(tmp_path / "old")  # a CA and a certificate for server + client auth
    new = chart_tls_files(tmp_path / "new")  # renewed from another CA
    write_secret(old, tls_dir)
    mount = next(m for m in container(nats_pod(docs), "nats")["volumeMounts"] if m["name"] == "tls")
    cluster = ConfigFileCluster(
        config["nats.conf"].replace(f"{mount['mountPath']}/", f"{tls_dir}/"),
        env=identity_env(docs),
        files={"permissions.conf": config["permissions.conf"]},
        prefix=f"{PREFIX}-nats",
    )
    cluster.start()
    try:
        pids = {n.name: int((n.store_dir / "nats.pid").read_text()) for n in cluster.nodes}
        peers = {n.name: route_peers(n.monitor_port) for n in cluster.nodes}
        for n in cluster.nodes:  # a full mesh over the mutual-TLS routes
            assert peers[n.name] == {m.name for m in cluster.nodes} - {n.name}
        for n in cluster.nodes:
            assert trusted_by(n.port, old.ca)
            assert not trusted_by(n.port, new.ca)

        write_secret(new, tls_dir)
        for n in cluster.nodes:  # not before the signal: the server holds the old one
            assert trusted_by(n.port, old.ca)
        for n in cluster.nodes:  # what the reloader does
            os.kill(pids[n.name], signal.SIGHUP)
        for n in cluster.nodes:
            wait_for(
                lambda n=n: True if trusted_by(n.port, new.ca) else None,
                timeout=15,
                what=f"{n.name} serving the new certificate",
            )
            assert not trusted_by(n.port, old.ca)

        # The same processes, still one cluster, and a service's client trusting only the new
        # CA does its work (the operator's identity: a read).
        for n in cluster.nodes:
            assert n.proc is not None
            assert n.proc.poll() is None
            assert int((n.store_dir / "nats.pid").read_text()) == pids[n.name]
            assert route_peers(n.monitor_port) == peers[n.name]
        # The routes' mutual TLS took the new CA too: a server started afresh on the new files
        # joins the two reloaded ones again (new route handshakes, both ways).
        restarted = cluster.nodes[0]
        restarted.kill()
        cluster.restart(restarted)
        for n in cluster.nodes:
            wait_for(
                lambda n=n: True if route_peers(n.monitor_port) == peers[n.name] else None,
                timeout=30,
                what=f"{n.name} routed to the others over the new certificate",
            )
        credentials = identity_env(docs)
        settings = ServiceSettings(
            nats={
                "url": cluster.url,
                "tls_ca_file": str(new.ca),
                "user": credentials["FRACPILOT_NATS_OPERATOR_USER"],
                "password": credentials["FRACPILOT_NATS_OPERATOR_PASSWORD"],
            }
        )
        nc = await open_connection(settings, servers=cluster.url.split(","))
        try:
            assert await nc.jetstream().account_info() is not None
        finally:
            await nc.close()
    finally:
        cluster.cleanup()
