"""fracpilot's admission webhook runs before KAI-Scheduler's, whatever the release is called.

The apiserver calls mutating webhooks one configuration after another, sorted by the
configurations' names (k8s.io/apiserver ``pkg/admission/configuration/
mutating_webhook_manager.go``: ``sort.SliceStable(configurations, ...ByName)``, a byte-wise
string comparison). KAI's is ``mutating-kai-admission`` (NVIDIA/KAI-scheduler v0.12.0
``pkg/apis/kai/v1/admission/admission.go``); it adds env vars from a ConfigMap to fraction
pods, so a pod fracpilot turns into a whole-GPU pod after KAI saw it would fail to start
(CreateContainerConfigError). The chart's configuration name therefore starts with
"fracpilot" (helm/fracpilot/templates/_helpers.tpl ``fracpilot.webhookConfigurationName``),
and ``reinvocationPolicy: IfNeeded`` runs it again should a later webhook change the pod.
Checked on the chart's renders, and on a real kube-apiserver with recording webhooks named as
the chart's and KAI's (KAI's real admission webhook runs in the real-stack tests).
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from kubernetes import client

from k8s_control_plane import (
    REPO_ROOT,
    _issue,
    _write_cert,
    _write_key,
    ensure_testbin,
    wait_for,
)

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
KAI_MUTATING_WEBHOOK = "mutating-kai-admission"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_testbin() / "helm"


def configuration(helm: Path, release: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", "gpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    return config


@pytest.mark.parametrize(
    ("release", "args"),
    [
        ("fracpilot", ()),
        ("zeta", ()),  # "zeta-fracpilot-targets" would have run after KAI's
        ("web", ()),
        ("mutating-kai", ()),
        ("a", ("--set=fullnameOverride=zz-top",)),
        ("prod", ("--set=nameOverride=sizer",)),
    ],
)
def test_the_configuration_sorts_before_kais_whatever_the_release(
    helm: Path, release: str, args: tuple[str, ...]
) -> None:
    config = configuration(helm, release, *args)
    name = config["metadata"]["name"]
    assert name.startswith("fracpilot")
    # Go's string order is byte order; so is Python's for these ASCII names.
    assert sorted([KAI_MUTATING_WEBHOOK, name]) == [name, KAI_MUTATING_WEBHOOK]
    assert len(name) <= 253  # a DNS subdomain
    for webhook in config["webhooks"]:
        assert webhook["reinvocationPolicy"] == "IfNeeded"


def test_the_default_release_keeps_its_name(helm: Path) -> None:
    # A release whose full name starts with "fracpilot" keeps the name it had before.
    assert configuration(helm, "fracpilot")["metadata"]["name"] == "fracpilot-targets"
    assert configuration(helm, "zeta")["metadata"]["name"] == "fracpilot-zeta-fracpilot-targets"


# --- the apiserver's own order, with the chart's name -------------------------------------------

SEEN = "order.test.fracpilot.io/seen"


class _Recorder(BaseHTTPRequestHandler):
    """A mutating webhook that appends its path's name to the pod's annotation SEEN: the
    stored value lists the webhooks in the order the apiserver called them."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        annotations = dict(request["object"]["metadata"].get("annotations") or {})
        annotations[SEEN] = annotations.get(SEEN, "") + self.path.split("?")[0].strip("/") + ","
        patch = [{"op": "add", "path": "/metadata/annotations", "value": annotations}]
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextlib.contextmanager
def recording_server(directory: Path) -> Iterator[tuple[int, bytes]]:
    """The recorder on a loopback port with a certificate for 127.0.0.1: (port, CA PEM)."""
    ca = _issue("fracpilot-test-order-ca")
    serving = _issue("order-webhook", issuer=ca, server=True, sans=("127.0.0.1",))
    cert, key = directory / "order.crt", directory / "order.key"
    _write_cert(cert, serving.cert)
    _write_key(key, serving.key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca.cert.public_bytes(serialization.Encoding.PEM)
    finally:
        server.shutdown()
        server.server_close()


def recording_configuration(
    name: str, path: str, port: int, ca_pem: bytes, namespace: str
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{path}.order.test.fracpilot.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/{path}",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "Never",
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }
        ],
    }


def test_the_apiserver_calls_the_charts_configuration_before_kais(
    helm: Path,
    kube_admin: client.ApiClient,
    kube_namespace: str,
    tmp_path: Path,
) -> None:
    """A real kube-apiserver with three recording webhooks: one named as the chart names
    fracpilot's, one named as KAI's, one with the release-dependent name the chart used to
    give (``<release>-fracpilot-targets``), which ran after KAI's."""
    ns = kube_namespace
    release = f"zeta-{ns}"
    ours = configuration(helm, release)["metadata"]["name"]
    assert ours == f"fracpilot-{release}-fracpilot-targets"
    admission = client.AdmissionregistrationV1Api(kube_admin)
    core = client.CoreV1Api(kube_admin)
    names = {
        "fracpilot": ours,
        "kai": KAI_MUTATING_WEBHOOK,
        "old": f"{release}-fracpilot-targets",
    }
    with recording_server(tmp_path) as (port, ca_pem):
        try:
            for path, name in names.items():
                admission.create_mutating_webhook_configuration(
                    recording_configuration(name, path, port, ca_pem, ns)
                )
            probe = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "probe-"},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/x"}]},
            }

            def order() -> str | None:  # the apiserver picks configurations up from an informer
                pod = core.create_namespaced_pod(ns, probe, dry_run="All")
                seen = (pod.metadata.annotations or {}).get(SEEN, "")
                return seen if seen.count(",") == len(names) else None

            assert wait_for(order, timeout=30, what="all three webhooks") == "fracpilot,kai,old,"
        finally:
            for name in names.values():
                with contextlib.suppress(client.ApiException):
                    admission.delete_mutating_webhook_configuration(name)
