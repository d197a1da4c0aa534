"""The chart as a release: helm test hooks, secrets made by hook Jobs, digests, a chart alone.

No kubelet runs here, so no pod of the chart runs. What runs instead is what those pods run,
with the arguments the chart renders for them: the hook Jobs' ``release_secrets`` calls with
the Jobs' own ServiceAccount token (so the hooks' RBAC is proven sufficient) against the real
apiserver, and the ``helm test`` pods' ``release_checks`` against a real nats-server, the real
decision service and the actuator's real webhook server serving the Secret the Job made.
"""

from __future__ import annotations

import base64
import datetime as dt
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes import client, utils
from prometheus_client import CollectorRegistry

from fracpilot_actuator.admission.certificates import issue_serving_bundle, renewal_reason
from fracpilot_actuator.hooks import release_secrets
from fracpilot_actuator.hooks.release_checks import run_check
from fracpilot_actuator.settings import WebhookSettings
from fracpilot_actuator.webhook import WebhookServer, start_webhook
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.bus import Bus
from helpers import reset_nats, running
from k8s_control_plane import ControlPlane
from support.chart_render import SHARED_CLUSTER_VALUES

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "helm" / "fracpilot"
GITOPS = CHART / "ci" / "gitops-values.yaml"


def helm(
    kube: ControlPlane, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(kube.helm), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
    return proc


def render(kube: ControlPlane, release: str, namespace: str, *extra: str) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, "--values", str(GITOPS)]
    return helm(kube, *args, *extra).stdout


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def hook_of(doc: dict[str, Any]) -> str:
    return str(doc["metadata"].get("annotations", {}).get("helm.sh/hook", ""))


def args_of(doc: dict[str, Any]) -> list[str]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
    return [str(a) for a in spec["containers"][0]["args"]]


# --- renders -----------------------------------------------------------------------------------


def test_gitops_renders_are_the_same_and_hold_no_secret_material(kube: ControlPlane) -> None:
    """secretGeneration: job: two renders are byte-identical (Argo CD sees no diff), no Secret
    and no caBundle is rendered, and every image is pinned by digest beside its tag."""
    first = render(kube, "fracpilot", "fracpilot")
    assert render(kube, "fracpilot", "fracpilot") == first
    docs = docs_of(first)
    assert "Secret" not in {d["kind"] for d in docs}
    webhook = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]
    jobs = {d["metadata"]["name"]: hook_of(d) for d in docs if d["kind"] == "Job"}
    assert jobs == {
        "fracpilot-release-secrets-create": "pre-install,pre-upgrade",
        "fracpilot-release-secrets-inject-ca": "post-install,post-upgrade",
    }
    images = [
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet", "Job", "Pod"}
        for c in (d["spec"].get("template", {}).get("spec") or d["spec"])["containers"]
    ]
    assert len(images) >= 6
    assert all("@sha256:" in i and ":" in i.split("@")[0] for i in images), images

    # By default (secretGeneration: helm, no cert-manager API) helm makes a new CA per render.
    plain = ["template", "fracpilot", str(CHART), "--set", "webhook.certManager.enabled=false"]
    assert helm(kube, *plain).stdout != helm(kube, *plain).stdout


def test_a_chart_copied_alone_renders_and_lints(kube: ControlPlane, tmp_path: Path) -> None:
    """No link leads out of the chart: a copy of the folder alone renders the same RBAC."""
    assert not [p for p in CHART.rglob("*") if p.is_symlink()]
    copy = tmp_path / "fracpilot"
    shutil.copytree(CHART, copy, symlinks=True)
    lint = helm(kube, "lint", "--strict", str(copy))
    assert "0 chart(s) failed" in lint.stdout
    alone = helm(kube, "template", "fracpilot", str(copy), cwd=tmp_path)
    assert "symbolic link" not in alone.stderr
    here = helm(kube, "template", "fracpilot", str(CHART))
    roles = [d for d in docs_of(alone.stdout) if d["kind"] in {"ClusterRole", "Role"}]
    assert roles == [d for d in docs_of(here.stdout) if d["kind"] in {"ClusterRole", "Role"}]


# --- the hook Jobs, run with their own ServiceAccount -------------------------------------------


@dataclass
class Release:
    name: str
    namespace: str
    docs: list[dict[str, Any]]
    kubeconfig: Path  # the release-secrets hooks' ServiceAccount

    def one(self, kind: str, suffix: str = "") -> dict[str, Any]:
        found = [
            d for d in self.docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)
        ]
        assert len(found) == 1, (kind, suffix, [d["metadata"]["name"] for d in found])
        return found[0]

    @property
    def configuration(self) -> str:
        return str(self.one("MutatingWebhookConfiguration")["metadata"]["name"])


def _apply(api: client.ApiClient, doc: dict[str, Any], namespace: str) -> None:
    utils.create_from_dict(api, doc, namespace=namespace)


@pytest.fixture
def release(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str
) -> Iterator[Release]:
    """The gitops render of a unique release: its hook RBAC and webhook configuration applied."""
    name = f"r{uuid.uuid4().hex[:6]}"
    docs = docs_of(render(kube, name, kube_namespace))
    for doc in docs:
        hook = hook_of(doc)
        is_rbac = doc["kind"] in {
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
        }
        if "release-secrets" in doc["metadata"]["name"] and is_rbac and hook:
            _apply(kube_admin, doc, kube_namespace)
    configuration = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    _apply(kube_admin, configuration, kube_namespace)
    sa = next(
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount" and "release-secrets" in d["metadata"]["name"]
    )
    token = kube.service_account_token(kube_namespace, sa)
    kubeconfig = kube.write_kubeconfig(kube.workdir / f"kubeconfig-{name}", token=token)
    try:
        yield Release(name, kube_namespace, docs, kubeconfig)
    finally:
        admission = client.AdmissionregistrationV1Api(kube_admin)
        admission.delete_mutating_webhook_configuration(configuration["metadata"]["name"])


def run_job(release: Release, suffix: str) -> int:
    """The Job's container arguments, with its ServiceAccount's kubeconfig."""
    job = release.one("Job", suffix)
    return release_secrets.run([f"--kubeconfig={release.kubeconfig}", *args_of(job)])


def secret(api: client.ApiClient, namespace: str, name: str) -> dict[str, bytes]:
    data = client.CoreV1Api(api).read_namespaced_secret(name, namespace).data
    return {k: base64.b64decode(v) for k, v in data.items()}


def test_the_hook_jobs_make_the_secrets_and_inject_the_ca(
    kube_admin: client.ApiClient, release: Release
) -> None:
    ns = release.namespace
    assert run_job(release, "-create") == 0
    tls_name = f"{release.name}-fracpilot-webhook-tls"
    tls = secret(kube_admin, ns, tls_name)
    service = f"{release.name}-fracpilot-webhook"
    dns = [f"{service}.{ns}.svc", f"{service}.{ns}.svc.cluster.local"]
    now = dt.datetime.now(dt.UTC)
    assert renewal_reason(tls, dns, now, dt.timedelta(days=30)) is None
    cert = x509.load_pem_x509_certificate(tls["tls.crt"])
    assert cert.not_valid_after_utc - now > dt.timedelta(days=3000)  # selfSignedValidityDays
    # One password Secret per NATS identity, the built-in NATS's certificate and its CA alone.
    nats = {
        identity: secret(kube_admin, ns, f"{release.name}-fracpilot-nats-{identity}")
        for identity in ("ingest", "decision", "actuator", "operator", "policy-admin")
    }
    for identity, data in nats.items():
        assert data["user"] == identity.encode()
        assert len(data["password"]) == 32
        assert data["password"][:1].isalpha()  # never parsed as a number by nats-server
    assert len({d["password"] for d in nats.values()}) == len(nats)
    nats_tls = secret(kube_admin, ns, f"{release.name}-fracpilot-nats-tls")
    nats_dns = [f"*.{release.name}-fracpilot-nats-headless.{ns}.svc"]
    assert renewal_reason(nats_tls, nats_dns, now, dt.timedelta(days=30)) is None
    nats_ca = secret(kube_admin, ns, f"{release.name}-fracpilot-nats-ca")
    assert nats_ca == {"ca.crt": nats_tls["ca.crt"]}

    # Before inject-ca the webhook has no CA; after, the Secret's.
    admission = client.AdmissionregistrationV1Api(kube_admin)
    hooks = admission.read_mutating_webhook_configuration(release.configuration).webhooks
    assert not hooks[0].client_config.ca_bundle
    assert run_job(release, "-inject-ca") == 0
    hooks = admission.read_mutating_webhook_configuration(release.configuration).webhooks
    assert base64.b64decode(hooks[0].client_config.ca_bundle) == tls["ca.crt"]

    # An upgrade runs them again: nothing that is still good changes.
    assert run_job(release, "-create") == 0
    assert run_job(release, "-inject-ca") == 0
    assert secret(kube_admin, ns, tls_name) == tls
    for identity, data in nats.items():
        assert secret(kube_admin, ns, f"{release.name}-fracpilot-nats-{identity}") == data
    assert secret(kube_admin, ns, f"{release.name}-fracpilot-nats-tls") == nats_tls

    # A certificate that no longer covers the Service is made again, and re-injected.
    release_secrets.ensure_webhook_secret(
        client.CoreV1Api(kube_admin),
        ns,
        tls_name,
        ["elsewhere.example"],
        now,
        dt.timedelta(days=1),
        dt.timedelta(0),
    )
    assert run_job(release, "-create") == 0
    renewed = secret(kube_admin, ns, tls_name)
    assert renewed["ca.crt"] != tls["ca.crt"]
    assert renewal_reason(renewed, dns, now, dt.timedelta(days=30)) is None
    assert run_job(release, "-inject-ca") == 0
    hooks = admission.read_mutating_webhook_configuration(release.configuration).webhooks
    assert base64.b64decode(hooks[0].client_config.ca_bundle) == renewed["ca.crt"]


def test_the_job_account_may_not_touch_other_secrets(
    kube: ControlPlane, kube_admin: client.ApiClient, release: Release
) -> None:
    """The hooks' Role names its Secrets: another Secret in the namespace stays unreadable."""
    core = client.CoreV1Api(kube_admin)
    core.create_namespaced_secret(
        release.namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="other"), string_data={"k": "v"}),
    )
    token = kube.service_account_token(
        release.namespace, f"{release.name}-fracpilot-release-secrets"
    )
    with (
        kube.token_client(token) as as_job,
        pytest.raises(client.exceptions.ApiException) as refused,
    ):
        client.CoreV1Api(as_job).read_namespaced_secret("other", release.namespace)
    assert refused.value.status == 403


# --- helm test: the checks the test pods run -----------------------------------------------------


@dataclass
class Pieces:
    webhook: WebhookServer
    ca: bytes


@pytest.fixture
async def pieces(
    kube_admin: client.ApiClient, release: Release, nats_url: str, tmp_path: Path
) -> AsyncIterator[Pieces]:
    """The release's Secret made by its Job, served by the actuator's webhook server; the
    decision service on the test NATS."""
    assert run_job(release, "-create") == 0
    assert run_job(release, "-inject-ca") == 0
    tls = secret(kube_admin, release.namespace, f"{release.name}-fracpilot-webhook-tls")
    (tmp_path / "tls.crt").write_bytes(tls["tls.crt"])
    (tmp_path / "tls.key").write_bytes(tls["tls.key"])
    await reset_nats(nats_url)
    bus = Bus("actuator", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=10)
    settings = WebhookSettings(
        enabled=True,
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        host="127.0.0.1",
        port=0,
    )
    server, _ = await start_webhook(bus, CollectorRegistry(), settings, cluster="test")
    decision = DecisionService(DecisionSettings(nats={"url": nats_url}))
    try:
        async with running(decision):
            yield Pieces(server, tls["ca.crt"])
    finally:
        await server.stop()
        await bus.close()


def pod_args(release: Release, check: str) -> list[str]:
    return args_of(release.one("Pod", f"-test-{check}"))


async def test_helm_test_checks_pass_on_a_working_release(
    kube: ControlPlane,
    release: Release,
    pieces: Pieces,
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = {d["metadata"]["name"] for d in release.docs if d["kind"] == "Pod"}
    assert pods == {f"{release.name}-fracpilot-test-{c}" for c in ("nats", "policy", "webhook")}
    assert all(hook_of(d) == "test" for d in release.docs if d["kind"] == "Pod")
    # The test NATS has no users: the pods' in-cluster URL and password are replaced by it.
    monkeypatch.setenv("FRACPILOT_NATS_URL", nats_url)
    assert await run_check(pod_args(release, "nats")) is None
    assert await run_check(pod_args(release, "policy")) is None
    # The webhook check reads the caBundle with the test pods' own ServiceAccount.
    test_sa = f"{release.name}-fracpilot-test"
    for doc in release.docs:
        if hook_of(doc) == "test" and doc["kind"] != "Pod":
            with kube.admin_client() as admin:
                _apply(admin, doc, release.namespace)
    token = kube.service_account_token(release.namespace, test_sa)
    kubeconfig = kube.write_kubeconfig(kube.workdir / f"kubeconfig-{test_sa}", token=token)
    webhook_args = [
        *pod_args(release, "webhook"),
        f"--connect-to=127.0.0.1:{pieces.webhook.port}",
        f"--kubeconfig={kubeconfig}",
    ]
    assert await run_check(webhook_args) is None


async def test_helm_test_checks_fail_when_the_release_is_broken(
    kube_admin: client.ApiClient,
    kube: ControlPlane,
    release: Release,
    pieces: Pieces,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each check can fail: NATS unreachable, a caBundle the server's certificate does not
    verify against (a certificate changed without its CA)."""
    monkeypatch.setenv("FRACPILOT_NATS_URL", "nats://127.0.0.1:9")  # discard port: refused
    assert "cannot connect to NATS" in (await run_check(pod_args(release, "nats")) or "")
    assert "cannot connect to NATS" in (await run_check(pod_args(release, "policy")) or "")

    other = issue_serving_bundle(
        "other-ca", ["x.example"], dt.datetime.now(dt.UTC), dt.timedelta(days=1)
    )
    admission = client.AdmissionregistrationV1Api(kube_admin)
    admission.patch_mutating_webhook_configuration(
        release.configuration,
        [
            {
                "op": "replace",
                "path": "/webhooks/0/clientConfig/caBundle",
                "value": base64.b64encode(other.ca_crt).decode(),
            }
        ],
    )
    kubeconfig = kube.write_kubeconfig(kube.workdir / f"kubeconfig-admin-{release.name}")
    problem = await run_check(
        [
            *pod_args(release, "webhook"),
            f"--connect-to=127.0.0.1:{pieces.webhook.port}",
            f"--kubeconfig={kubeconfig}",
        ]
    )
    assert problem is not None
    assert "does not verify against the current caBundle" in problem


def test_the_notes_name_helm_test_and_where_the_certificate_comes_from(
    kube: ControlPlane,
) -> None:
    def notes(*values: str) -> str:
        proc = helm(
            kube,
            "install",
            "fp",
            str(CHART),
            "--namespace",
            "fracpilot",
            "--dry-run=client",
            *SHARED_CLUSTER_VALUES,
            "--kubeconfig",
            str(kube.write_kubeconfig()),
            *values,
        )
        return proc.stdout.split("NOTES:", 1)[1]

    gitops = notes("--values", str(GITOPS))
    assert "made in the cluster by the release-secrets hook Job" in gitops
    assert "helm test fp -n fracpilot" in gitops
    assert "kubectl fracpilot status --release-namespace fracpilot" in gitops
    plain = notes("--set", "webhook.certManager.enabled=false", "--set", "tests.enabled=false")
    assert "generated by helm" in plain
    assert "helm test" not in plain
    # The default bus is authenticated: no warning, and the CLI's identity is the operator's.
    assert "WARNING" not in plain
    assert "as the read-only operator identity" in plain
    assert "get secret fp-fracpilot-nats-operator" in plain
    assert "get secret fp-fracpilot-nats-ca" in plain
    # Turning authentication or TLS off is explicit, and warned about.
    open_bus = notes("--set", "nats.auth.type=none", "--set", "nats.tls.enabled=false")
    assert "WARNING: NATS authentication is OFF (nats.auth.type: none)" in open_bus
    assert "WARNING: TLS to NATS is OFF (nats.tls.enabled: false)" in open_bus
