"""helm/fracpilot with the real helm (the cached build) and the real kube-apiserver.

For the default values and each of helm/fracpilot/ci/*.yaml (all-on-values.yaml turns every
option on):

- ``helm lint --strict`` passes;
- ``helm template`` (with the Prometheus Operator and cert-manager APIs announced) renders, and
  every built-in kind validates offline against the Kubernetes OpenAPI schemas of this
  Kubernetes version (kubernetes-validate, strict: unknown fields fail); the custom resources
  (ServiceMonitor, PodMonitor, PrometheusRule, Certificate, Issuer) are validated by the
  apiserver instead,
  against their CRDs vendored in tests/integration/k8s/crds/;
- the apiserver accepts every object: a server-side apply with ``dryRun=All``.

Also: values.schema.json refuses wrong values with a message that names the value, the
chart's RBAC is deploy/rbac/*.yaml's rules (patching nodes only with consolidation auto,
writing FractionRecommendations only when their scope is not off),
every FRACPILOT_ variable the chart sets is a real setting of that service and parses, and a
real ``helm install`` + ``upgrade`` keeps the generated webhook certificate and NATS password
(``lookup``), with a caBundle that verifies the serving certificate for the webhook Service's
name.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from pydantic import BaseModel

from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_decision.service import DecisionSettings
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Policy
from fracpilot_libs.sizing.policies import cluster_default
from k8s_control_plane import REPO_ROOT, ControlPlane, k8s_version, wait_for
from support.chart_render import SHARED_CLUSTER_VALUES

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
RBAC_DIR = REPO_ROOT / "deploy" / "rbac"
CRD_DIR = Path(__file__).resolve().parent / "crds"
CASES: dict[str, Path | None] = {"default": None} | {
    p.stem: p for p in sorted((CHART / "ci").glob("*.yaml"))
}
CRD_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "cert-manager.io/v1/Certificate",
    "cert-manager.io/v1/Issuer",
)
CUSTOM_KINDS = {api.rsplit("/", 1)[1] for api in CRD_APIS}
SETTINGS: dict[str, type[ServiceSettings]] = {
    "ingest": IngestSettings,
    "decision": DecisionSettings,
    "actuator": ActuatorSettings,
}


def env_fields(settings_class: type[ServiceSettings]) -> set[str]:
    """The settings' names as the environment spells them (lowercase, without FRACPILOT_): a
    nested group ``kube`` with a field ``timeout_s`` is ``kube_timeout_s``."""
    names: set[str] = set()
    for name, info in settings_class.model_fields.items():
        group = info.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            names |= {f"{name}_{sub}" for sub in group.model_fields}
        else:
            names.add(name)
    return names


# --- helm --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helm:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args, "--kubeconfig", str(self.kubeconfig)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def template(self, case: str, namespace: str, *extra: str) -> list[dict[str, Any]]:
        values = CASES[case]
        args = ["template", "fracpilot", str(CHART), "--namespace", namespace]
        args += [f"--api-versions={api}" for api in CRD_APIS]
        if values is not None:
            args += ["--values", str(values)]
        proc = self.run(*args, *extra)
        return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def helm(kube: ControlPlane) -> Helm:
    return Helm(kube.helm, kube.write_kubeconfig())


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[str, list[dict[str, Any]]]:
    """Each case rendered once, in the namespace ``fracpilot`` (the apiserver test re-renders)."""
    return {case: helm.template(case, "fracpilot") for case in CASES}


def values_args(case: str) -> list[str]:
    path = CASES[case]
    return [] if path is None else ["--values", str(path)]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{len(matches)} {kind} {name}"
    return matches[0]


# --- lint and render ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_passes(helm: Helm, case: str) -> None:
    proc = helm.run("lint", "--strict", str(CHART), *values_args(case))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout


def test_the_renders_cover_every_option(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """What each values file is for is really in its render."""
    base = {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    base |= {"Role", "RoleBinding"}
    default = kinds(rendered["default"])
    assert default >= base | {"StatefulSet", "ConfigMap", "NetworkPolicy"}
    assert default >= {"MutatingWebhookConfiguration", "PodDisruptionBudget", "PriorityClass"}
    # cert-manager's API is announced: it issues the certificate, no Secret is generated.
    assert default >= {"Certificate", "Issuer", "ServiceMonitor"}
    assert "Secret" not in kinds(rendered["all-on-values"])
    all_on = kinds(rendered["all-on-values"])
    assert all_on >= base | {"PodMonitor", "ServiceMonitor", "Certificate", "Issuer"}
    assert all_on >= {"NetworkPolicy", "PodDisruptionBudget", "MutatingWebhookConfiguration"}
    assert "StatefulSet" not in all_on  # an external NATS
    pdbs = [d for d in rendered["all-on-values"] if d["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == 3
    minimal = kinds(rendered["minimal-values"])
    assert not minimal & {"MutatingWebhookConfiguration", "NetworkPolicy", "PriorityClass"}
    assert not minimal & {"Certificate", "ServiceMonitor", "PodDisruptionBudget"}


def test_custom_resources_only_when_their_apis_exist(helm: Helm) -> None:
    args = ["template", "fracpilot", str(CHART), "--values", str(CASES["all-on-values"])]
    docs = [d for d in yaml.safe_load_all(helm.run(*args).stdout) if d]
    assert not kinds(docs) & CUSTOM_KINDS
    # Without cert-manager helm generates the webhook's CA and certificate.
    secret = find(docs, "Secret", "fracpilot-webhook-tls")
    webhook = find(docs, "MutatingWebhookConfiguration", "fracpilot-targets")
    ca_bundle = webhook["webhooks"][0]["clientConfig"]["caBundle"]
    assert ca_bundle == secret["data"]["ca.crt"]
    assert "cert-manager.io/inject-ca-from" not in webhook["metadata"].get("annotations", {})
    assert validate_offline(docs) == len(docs)


@pytest.mark.parametrize("case", CASES)
def test_rendered_objects_validate_offline(
    rendered: dict[str, list[dict[str, Any]]], case: str
) -> None:
    assert validate_offline(rendered[case]) >= 15


def validate_offline(docs: list[dict[str, Any]]) -> int:
    """Validate the built-in kinds strictly against this Kubernetes version's OpenAPI schemas;
    how many were checked."""
    major, minor = k8s_version().lstrip("v").split(".")[:2]
    version = f"{major}.{minor}.0"
    checked = 0
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue  # no schema offline: the apiserver validates them against their CRDs
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {exc}") from exc
        checked += 1
    return checked


def test_the_prometheus_rule_is_the_alert_rules_file(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """The PrometheusRule holds deploy/prometheus/fracpilot-alerts.yml's groups as they are
    (its ``{{ $labels }}`` not templated by helm), with the values' labels; off when asked."""
    rules = yaml.safe_load(
        (REPO_ROOT / "deploy" / "prometheus" / "fracpilot-alerts.yml").read_text()
    )
    for case in ("default", "builtin-nats-values", "all-on-values"):
        rule = find(rendered[case], "PrometheusRule", "fracpilot")
        assert rule["metadata"]["namespace"] == "fracpilot"
        assert rule["spec"] == rules, case
        assert (
            "{{ $labels.consumer }}"
            in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
        )
    labels = find(rendered["all-on-values"], "PrometheusRule", "fracpilot")["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack"
    assert labels["app.kubernetes.io/component"] == "metrics"
    assert "PrometheusRule" not in kinds(rendered["minimal-values"])
    off = helm.template("default", "fracpilot", "--set", "metrics.prometheusRule.enabled=false")
    assert "PrometheusRule" not in kinds(off)
    assert kinds(off) == kinds(rendered["default"]) - {"PrometheusRule"}


# --- the apiserver accepts every object --------------------------------------------------------


@pytest.fixture(scope="module")
def crds_installed(kube_admin: client.ApiClient) -> None:
    """The Prometheus Operator's and cert-manager's CRDs the chart's custom resources need."""
    api = client.ApiextensionsV1Api(kube_admin)
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        names.append(crd["metadata"]["name"])
        try:
            api.create_custom_resource_definition(crd)
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool | None:
        for name in names:
            status = api.read_custom_resource_definition(name).status
            conditions = {c.type: c.status for c in (status.conditions or [])}
            if conditions.get("Established") != "True":
                return None
        return True

    wait_for(established, timeout=30, what="CRDs established")


@pytest.mark.usefixtures("crds_installed")
@pytest.mark.parametrize("case", CASES)
def test_the_apiserver_accepts_every_object(
    helm: Helm, kube_admin: client.ApiClient, kube_namespace: str, case: str
) -> None:
    dynamic = DynamicClient(kube_admin)
    docs = helm.template(case, kube_namespace)
    for doc in docs:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = doc["metadata"].get("namespace")
        assert (namespace is not None) == resource.namespaced, doc["metadata"]["name"]
        try:
            applied = dynamic.server_side_apply(
                resource,
                body=doc,
                name=doc["metadata"]["name"],
                namespace=namespace,
                field_manager="fracpilot-chart-test",
                force_conflicts=True,
                dry_run="All",
            )
        except client.ApiException as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {exc.body}") from exc
        assert applied.metadata.name == doc["metadata"]["name"]
    assert len(docs) >= 15


@pytest.mark.usefixtures("crds_installed")
def test_the_apiserver_accepts_the_nats_certificate_chain(
    helm: Helm, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    """nats.tls.certManager without an issuerRef (builtin-nats-values.yaml has one): the
    chart's self-signed Issuer, CA Certificate, CA Issuer, the servers' Certificate and the
    StatefulSet with its reloader, through cert-manager's CRDs and the apiserver."""
    dynamic = DynamicClient(kube_admin)
    docs = helm.template("default", kube_namespace, "--set", "nats.tls.certManager.enabled=true")
    chain = [
        d
        for d in docs
        if d["kind"] in {"Certificate", "Issuer", "StatefulSet"}
        and "-nats" in d["metadata"]["name"]
    ]
    assert len(chain) == 5
    for doc in chain:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            applied = dynamic.server_side_apply(
                resource,
                body=doc,
                name=doc["metadata"]["name"],
                namespace=doc["metadata"]["namespace"],
                field_manager="fracpilot-chart-test",
                force_conflicts=True,
                dry_run="All",
            )
        except client.ApiException as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {exc.body}") from exc
        assert applied.spec.to_dict()  # the object as the apiserver would keep it


# --- values.schema.json and the chart's own checks ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "actuator.replicas=two"], "at '/actuator/replicas': got string, want integer"),
        (
            ["--set", "policy.mode=sideways"],
            "at '/policy/mode': value must be one of 'recommend', 'auto'",
        ),
        (["--set", "actuator.replica=3"], "at '/actuator': additional properties 'replica'"),
        (["--set", "nats.deploy=false"], "at '/nats/url': minLength: got 0, want 1"),
        (
            ["--set", "nats.auth.type=nkey"],
            "at '/nats/auth/type': value must be one of 'identities', 'none', 'userPassword'",
        ),
        (["--set", "ingest.owners=guess"], "at '/ingest/owners': value must be one of"),
        (
            ["--set", "actuator.leaderElection.enabled=false"],
            "at '/actuator/replicas': maximum: got 2, want 1",
        ),
        (
            ["--set-json", 'policy={"min_fraction": 0.125}'],
            "policy.min_fraction 0.125 is not on the grid of 1/100 (policy.grid backend)",
        ),
        (
            ["--set-json", 'policy={"min_fraction": 0.5, "max_fraction": 0.25}'],
            "policy.min_fraction 0.5 is above policy.max_fraction 0.25",
        ),
        (
            ["--set", "actuator.leaderElection.renewDeadlineSeconds=20"],
            "renewDeadlineSeconds 20 must not exceed leaseDurationSeconds 15",
        ),
        (
            ["--set", "ingest.prometheus.verifyTls=maybe"],
            "at '/ingest/prometheus/verifyTls': got string, want boolean",
        ),
        (
            ["--set-json", 'ingest.prometheus.headers={"X-Scope-OrgID": 7}'],
            "at '/ingest/prometheus/headers/X-Scope-OrgID': got number, want string",
        ),
        (
            ["--set-json", 'ingest.prometheus.bearerToken={"secretName": "t", "file": "x"}'],
            "at '/ingest/prometheus/bearerToken': additional properties 'file'",
        ),
        (["--set", "ingest.hamiNodes=yes"], "at '/ingest/hamiNodes': got string, want boolean"),
        (
            ["--set", "ingest.prometheus.ca.secretName=a,ingest.prometheus.ca.configMapName=b"],
            "ingest.prometheus.ca names both a Secret (a) and a ConfigMap (b): name one",
        ),
        (
            ["--set", "ingest.hamiNodes=true,ingest.owners=pod-name"],
            "ingest.hamiNodes needs ingest.owners kubernetes (it is pod-name)",
        ),
        (
            ["--set", "ingest.replicas=2"],
            "ingest.replicas 2 needs ingest.shards (it is 0): unsharded replicas would publish",
        ),
        (
            [
                "--set",
                "ingest.shards=8,ingest.sources={prometheus,scrape},ingest.scrapeTargets={a:9400}",
            ],
            "ingest.shards needs ingest.sources [prometheus] alone (it is [prometheus scrape])",
        ),
        (
            ["--set-json", "ingest.shardLeaseSeconds=0.5"],
            "at '/ingest/shardLeaseSeconds': minimum: got 0.5, want 1",
        ),
        (
            ["--set", "actuator.consolidation.mode=bogus"],
            "at '/actuator/consolidation/mode': value must be one of 'off', 'recommend', 'auto'",
        ),
        (
            ["--set", "actuator.consolidation.quietHours=22-25"],
            "at '/actuator/consolidation/quietHours': '22-25' does not match pattern",
        ),
        (
            ["--set", "actuator.consolidation.intervalSeconds=0"],
            "at '/actuator/consolidation/intervalSeconds': exclusiveMinimum: got 0, want 0",
        ),
    ],
    ids=lambda v: v[1] if isinstance(v, list) else None,
)
def test_wrong_values_are_refused_with_a_clear_message(
    helm: Helm, args: list[str], message: str
) -> None:
    proc = helm.run("template", "fracpilot", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# --- what the objects say ----------------------------------------------------------------------


def rules_in(path: Path, kind: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    assert len(docs) == 1
    rules: list[dict[str, Any]] = docs[0]["rules"]
    return rules


def test_rbac_is_deploy_rbac_rules(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case in ("default", "all-on-values"):
        docs = rendered[case]
        actuator = RBAC_DIR / "actuator.yaml"
        assert find(docs, "ClusterRole", "fracpilot-actuator")["rules"] == rules_in(
            actuator, "ClusterRole"
        )
        assert find(docs, "Role", "fracpilot-actuator")["rules"] == rules_in(actuator, "Role")
        ingest = find(docs, "ClusterRole", "fracpilot-ingest")["rules"]
        assert ingest == rules_in(RBAC_DIR / "ingest.yaml", "ClusterRole")
        for kind in ("ClusterRoleBinding", "RoleBinding"):
            binding = find(docs, kind, "fracpilot-actuator")
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "fracpilot-actuator", "namespace": "fracpilot"}
            ]
        # The services' grants; hooks (helm test, secret Jobs) are checked where they are tested.
        roles = {
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if "rules" in d and "helm.sh/hook" not in d["metadata"].get("annotations", {})
        }
        hooks = {
            (d["kind"], d["metadata"]["name"], d["metadata"]["annotations"]["helm.sh/hook"])
            for d in docs
            if "rules" in d and "helm.sh/hook" in d["metadata"].get("annotations", {})
        }
        assert hooks == {("ClusterRole", "fracpilot-test", "test")}
        # Patching nodes: only with actuator.consolidation.mode auto (all-on sets it).
        consolidation = {("ClusterRole", "fracpilot-actuator-consolidation")}
        assert roles == {
            ("ClusterRole", "fracpilot-actuator"),
            ("ClusterRole", "fracpilot-actuator-recommendations"),  # scope opted-in
            ("Role", "fracpilot-actuator"),
            ("ClusterRole", "fracpilot-ingest"),
            ("ClusterRole", "fracpilot-policy-edit"),
            ("ClusterRole", "fracpilot-policy-view"),
        } | (consolidation if case == "all-on-values" else set())
        # Who may change a policy: deploy/rbac/policy-roles.yaml, with the aggregation labels.
        for role in yaml.safe_load_all((RBAC_DIR / "policy-roles.yaml").read_text()):
            rendered_role = find(docs, "ClusterRole", role["metadata"]["name"])
            assert rendered_role["rules"] == role["rules"]
            labels = rendered_role["metadata"]["labels"]
            for label, value in role["metadata"]["labels"].items():
                assert "aggregate-to" not in label or labels[label] == value
    # Ingest by pod names makes no API call: no grant, no token.
    docs = rendered["builtin-nats-values"]
    assert ("ClusterRole", "fracpilot-ingest") not in {
        (d["kind"], d["metadata"]["name"]) for d in docs
    }
    assert find(docs, "ServiceAccount", "fracpilot-ingest")["automountServiceAccountToken"] is False
    assert (
        find(docs, "ServiceAccount", "fracpilot-decision")["automountServiceAccountToken"] is False
    )


def test_nodes_are_patched_only_with_consolidation_auto(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Secure by default: no grant on nodes beyond reading them unless consolidation is auto;
    then deploy/rbac/actuator-consolidation.yaml's one rule, bound to the actuator's account."""

    def patches_nodes(docs: list[dict[str, Any]]) -> list[str]:
        return [
            d["metadata"]["name"]
            for d in docs
            for rule in d.get("rules") or ()
            if "nodes" in rule["resources"] and {"patch", "update", "*"} & set(rule["verbs"])
        ]

    def consolidation_grant(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if d["metadata"]["name"] == "fracpilot-actuator-consolidation"
        ]

    default = rendered["default"]
    assert container_env(default, "actuator")["FRACPILOT_CONSOLIDATION_MODE"] == "recommend"
    assert patches_nodes(default) == []
    assert consolidation_grant(default) == []
    auto = helm.template("default", "fracpilot", "--set", "actuator.consolidation.mode=auto")
    assert container_env(auto, "actuator")["FRACPILOT_CONSOLIDATION_MODE"] == "auto"
    assert patches_nodes(auto) == ["fracpilot-actuator-consolidation"]
    role = find(auto, "ClusterRole", "fracpilot-actuator-consolidation")
    assert role["rules"] == rules_in(RBAC_DIR / "actuator-consolidation.yaml", "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert role["metadata"]["labels"]["app.kubernetes.io/component"] == "actuator"
    binding = find(auto, "ClusterRoleBinding", "fracpilot-actuator-consolidation")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "fracpilot-actuator-consolidation",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fracpilot-actuator", "namespace": "fracpilot"}
    ]
    # Nothing else changes: the two objects and the variable.
    names = {(d["kind"], d["metadata"]["name"]) for d in auto}
    assert names - {(d["kind"], d["metadata"]["name"]) for d in default} == {
        ("ClusterRole", "fracpilot-actuator-consolidation"),
        ("ClusterRoleBinding", "fracpilot-actuator-consolidation"),
    }
    # An account of yours: the grant names it, as the actuator's other bindings do.
    yours = helm.template(
        "default",
        "fracpilot",
        "--set",
        "actuator.consolidation.mode=auto,actuator.serviceAccount.create=false,"
        "actuator.serviceAccount.name=gpu-mover",
    )
    binding = find(yours, "ClusterRoleBinding", "fracpilot-actuator-consolidation")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-mover", "namespace": "fracpilot"}
    ]
    # No actuator, no grant; off and recommend grant nothing either.
    for args in (
        "actuator.enabled=false,actuator.consolidation.mode=auto",
        "actuator.consolidation.mode=off",
    ):
        docs = helm.template("default", "fracpilot", "--set", args)
        assert (consolidation_grant(docs), patches_nodes(docs)) == ([], []), args


def test_recommendations_are_granted_only_when_their_scope_is_not_off(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """Least privilege: with fractionPolicies.recommendations off (the writer does not start)
    no rule names fractionrecommendations; with opted-in (the default) or all,
    deploy/rbac/actuator-recommendations.yaml's rules, exactly the verbs RecommendationWriter
    uses (create the object, patch its status), bound to the actuator's account."""

    def recommendation_rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
        return [
            (d["kind"], d["metadata"]["name"], rule)
            for d in docs
            for rule in d.get("rules") or ()
            if any(r.split("/")[0] in ("fractionrecommendations", "*") for r in rule["resources"])
        ]

    name = "fracpilot-actuator-recommendations"
    writer_rules = [
        {
            "apiGroups": ["fracpilot.io"],
            "resources": ["fractionrecommendations"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["fracpilot.io"],
            "resources": ["fractionrecommendations/status"],
            "verbs": ["patch"],
        },
    ]
    assert rules_in(RBAC_DIR / "actuator-recommendations.yaml", "ClusterRole") == writer_rules
    off = helm.template("default", "fracpilot", "--set", "fractionPolicies.recommendations=off")
    assert container_env(off, "actuator")["FRACPILOT_POLICYSYNC_RECOMMENDATIONS"] == "off"
    assert recommendation_rules(off) == []
    assert [d for d in off if d["metadata"]["name"] == name] == []
    default = rendered["default"]
    for scope, docs in (
        ("opted-in", default),
        (
            "all",
            helm.template("default", "fracpilot", "--set", "fractionPolicies.recommendations=all"),
        ),
    ):
        assert container_env(docs, "actuator")["FRACPILOT_POLICYSYNC_RECOMMENDATIONS"] == scope
        assert recommendation_rules(docs) == [
            ("ClusterRole", name, rule) for rule in writer_rules
        ], scope
        binding = find(docs, "ClusterRoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "fracpilot-actuator", "namespace": "fracpilot"}
        ]
        assert (
            find(docs, "ClusterRole", name)["metadata"]["labels"]["app.kubernetes.io/component"]
            == "actuator"
        )
    # off changes nothing else: the two objects and the variable.
    names = {(d["kind"], d["metadata"]["name"]) for d in default}
    assert names - {(d["kind"], d["metadata"]["name"]) for d in off} == {
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
    }
    # No actuator, no grant.
    docs = helm.template("default", "fracpilot", "--set", "actuator.enabled=false")
    assert recommendation_rules(docs) == []


def test_the_notes_say_when_nodes_may_be_drained(helm: Helm) -> None:
    def notes(*args: str) -> str:
        proc = helm.run(
            "install",
            "fp",
            str(CHART),
            "--namespace",
            "fracpilot",
            "--dry-run=client",
            *SHARED_CLUSTER_VALUES,
            *args,
        )
        return proc.stdout.split("NOTES:", 1)[1]

    assert "consolidation" not in notes()
    auto = notes("--set", "actuator.consolidation.mode=auto")
    assert (
        "actuator.consolidation.mode is auto: GPU nodes may be tainted "
        "(fracpilot.io/consolidating) and drained of opted-in pods for consolidation; to stop "
        "it, upgrade with --set actuator.consolidation.mode=recommend (or off)."
    ) in auto


def container_env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    """The container's environment, with stand-ins for values from Secrets and fields."""
    deployment = find(docs, "Deployment", f"fracpilot-{component}")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else f"from-{var['name'].lower()}"
    return env


@pytest.mark.parametrize("case", CASES)
def test_every_variable_is_a_real_setting_that_parses(
    rendered: dict[str, list[dict[str, Any]]], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for component, settings_class in SETTINGS.items():
        env = container_env(rendered[case], component)
        fields = env_fields(settings_class)
        unknown = {n for n in env if n.removeprefix("FRACPILOT_").lower() not in fields}
        assert not unknown, f"{component}: {sorted(unknown)} are no settings of {settings_class}"
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            settings = settings_class()
        assert settings.metrics.host == "0.0.0.0"
        if component == "decision":
            assert isinstance(settings, DecisionSettings)
            policy = cluster_default(settings.policy_json)
            path = CASES[case]
            values = yaml.safe_load(path.read_text()) if path else {}
            expected = Policy.model_validate(values.get("policy", {}))
            assert policy == expected


def test_values_reach_the_services(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["all-on-values"]
    actuator = container_env(docs, "actuator")
    assert actuator["FRACPILOT_DRY_RUN"] == "true"
    assert actuator["FRACPILOT_WEBHOOK_PORT"] == "9443"
    assert actuator["FRACPILOT_TARGETS_VIA"] == "webhook"
    assert {n: v for n, v in actuator.items() if n.startswith("FRACPILOT_CONSOLIDATION_")} == {
        "FRACPILOT_CONSOLIDATION_MODE": "auto",
        "FRACPILOT_CONSOLIDATION_INTERVAL_S": "120",
        "FRACPILOT_CONSOLIDATION_MAX_MOVES_PER_HOUR": "2",
        "FRACPILOT_CONSOLIDATION_QUIET_HOURS": "22-6",
        "FRACPILOT_CONSOLIDATION_MOVE_TIMEOUT_S": "900",
    }
    ingest = container_env(docs, "ingest")
    assert ingest["FRACPILOT_SOURCES"] == "prometheus,scrape"
    assert json.loads(ingest["FRACPILOT_GPU_PRICES"]) == {"H100": 4.2, "A100 80GB": 3.1}
    for component in SETTINGS:
        env = container_env(docs, component)
        assert env["FRACPILOT_NATS_CREDS_FILE"] == "/etc/fracpilot/nats/auth/nats.creds"
        assert env["FRACPILOT_NATS_TLS_CA_FILE"] == "/etc/fracpilot/nats/tls/ca.crt"
        assert env["FRACPILOT_METRICS_PORT"] == "9191"
        assert env.get("FRACPILOT_CLUSTER") == (None if component == "decision" else "prod-eu-1")
    assert container_env(rendered["minimal-values"], "actuator")["FRACPILOT_TARGETS_VIA"] == (
        "template"
    )
    default = container_env(rendered["default"], "decision")
    assert default["FRACPILOT_NATS_URL"] == "nats://fracpilot-nats.fracpilot.svc:4222"


def test_ingest_replicas_share_the_gpus_by_shards(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ingest.shards reaches IngestSettings and lets ingest.replicas go above one, rolled one
    pod at a time (a pod hands its shards over on SIGTERM); unsharded, one pod, Recreate."""
    docs = helm.template("default", "fracpilot", "--set", "ingest.replicas=3,ingest.shards=16")
    deployment = find(docs, "Deployment", "fracpilot-ingest")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    env = container_env(docs, "ingest")
    with monkeypatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = IngestSettings()
    assert (settings.ingest.shards, settings.ingest.shard_lease_s) == (16, 10.0)
    default = find(rendered["default"], "Deployment", "fracpilot-ingest")
    assert default["spec"]["strategy"] == {"type": "Recreate"}
    assert "FRACPILOT_INGEST_SHARDS" not in container_env(rendered["default"], "ingest")


def ingest_files(docs: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each file the ingest container can read from a mounted volume: path -> (key in the
    source, the volume's source)."""
    pod = find(docs, "Deployment", "fracpilot-ingest")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: dict[str, tuple[str, dict[str, Any]]] = {}
    for mount in container["volumeMounts"]:
        # A subPath mount is never updated by the kubelet: a rotated token would not be seen.
        assert "subPath" not in mount, mount
        volume = volumes[mount["name"]]
        source = volume.get("secret") or volume.get("configMap") or {}
        for item in source.get("items", ()):
            files[f"{mount['mountPath']}/{item['path']}"] = (item["key"], source)
    return files


def test_prometheus_client_values_reach_ingest(
    helm: Helm, rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """verifyTls, the CA (ConfigMap or Secret), the bearer token Secret, headers and hamiNodes
    become IngestSettings, and the files they name are mounted from their sources."""
    docs = rendered["all-on-values"]
    env = container_env(docs, "ingest")
    with monkeypatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = IngestSettings()
    assert settings.prometheus.verify_tls is True
    assert settings.prometheus.headers == {"X-Scope-OrgID": "gpu-platform"}
    assert settings.hami_nodes is True
    files = ingest_files(docs)
    assert settings.prometheus.ca_file is not None
    assert settings.prometheus.bearer_token_file is not None
    ca_key, ca_source = files[settings.prometheus.ca_file]
    assert (ca_key, ca_source["name"]) == ("service-ca.crt", "prometheus-ca")
    token_key, token_source = files[settings.prometheus.bearer_token_file]
    assert (token_key, token_source["secretName"]) == ("token", "prometheus-reader")

    # The defaults: verified with the system's CAs, no token, no headers, no nodes watched.
    default = container_env(rendered["default"], "ingest")
    assert default["FRACPILOT_PROMETHEUS_VERIFY_TLS"] == "true"
    unset = ("CA_FILE", "BEARER_TOKEN_FILE", "HEADERS")
    assert not {f"FRACPILOT_PROMETHEUS_{n}" for n in unset} & set(default)
    assert "FRACPILOT_HAMI_NODES" not in default
    assert not {p for p in ingest_files(rendered["default"]) if "prometheus" in p}

    # A CA from a Secret, and verification turned off, which parses as off.
    docs = helm.template(
        "default",
        "fracpilot",
        "--set",
        "ingest.prometheus.ca.secretName=prom-ca,ingest.prometheus.verifyTls=false",
    )
    env = container_env(docs, "ingest")
    with monkeypatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = IngestSettings()
    assert settings.prometheus.verify_tls is False
    assert settings.prometheus.ca_file is not None
    assert settings.prometheus.bearer_token_file is None
    key, source = ingest_files(docs)[settings.prometheus.ca_file]
    assert (key, source["secretName"]) == ("ca.crt", "prom-ca")

    # No prometheus source: nothing of its client is set or mounted.
    docs = helm.template("all-on-values", "fracpilot", "--set", "ingest.sources={scrape}")
    assert not {n for n in container_env(docs, "ingest") if "PROMETHEUS" in n}
    assert not {p for p in ingest_files(docs) if "prometheus" in p}


def test_pods_are_locked_down(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for case, docs in rendered.items():
        for doc in docs:
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, (case, doc["metadata"])
            assert pod["enableServiceLinks"] is False
            for container in pod["containers"]:
                sc = container["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert container["resources"]["requests"]["cpu"]
                assert container["resources"]["requests"]["memory"]
                if container["name"] == "reloader":
                    # The NATS config reloader serves nothing (no port, no probe), as in the
                    # official chart; it only signals the server.
                    assert "ports" not in container
                    assert "readinessProbe" not in container
                    continue
                path = container["readinessProbe"]["httpGet"]["path"]
                # the NATS metrics exporter sidecar serves its scrape path only
                assert (
                    path.startswith("/healthz")
                    or path == "/readyz"
                    or (container["name"] == "metrics" and path == "/metrics")
                )


# --- a real install and upgrade ----------------------------------------------------------------


def secret_data(api: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    data = api.read_namespaced_secret(name, namespace).data
    assert data
    return dict(data)


def verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    elif isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    else:
        raise AssertionError(f"unexpected CA key {type(key)}")


@pytest.fixture
def release(helm: Helm, kube_namespace: str) -> Iterator[tuple[str, list[str]]]:
    """A release name and the values it is installed with; uninstalled afterwards."""
    name = f"fp-{uuid.uuid4().hex[:6]}"
    values = [
        # cert-manager's CRDs may be installed by another test, but no cert-manager runs here.
        "--set=webhook.certManager.enabled=false",
        # One PriorityClass per cluster, made by other tests of this session.
        "--set=priorityClass.create=false",
        # One set of policy CRDs and roles per cluster, made by other tests of this session.
        "--set=fractionPolicies.crds.install=false",
        "--set=fractionPolicies.roles=false",
        "--set=nats.auth.type=userPassword",
    ]
    yield name, values
    helm.run("uninstall", name, "--namespace", kube_namespace, check=False)


def test_install_and_upgrade_keep_the_generated_secrets(
    helm: Helm,
    kube_admin: client.ApiClient,
    kube_namespace: str,
    release: tuple[str, list[str]],
) -> None:
    name, values = release
    core = client.CoreV1Api(kube_admin)
    install = helm.run("install", name, str(CHART), "--namespace", kube_namespace, *values)
    # NOTES.txt tells what to check, for this release.
    assert f"kubectl -n {kube_namespace} get lease fracpilot-actuator" in install.stdout
    # Prefixed "fracpilot-" so that it sorts before KAI's mutating-kai-admission (_helpers.tpl).
    assert f"get mutatingwebhookconfiguration fracpilot-{name}-fracpilot-targets" in install.stdout
    assert "fracpilot policy get" in install.stdout

    tls_before = secret_data(core, kube_namespace, f"{name}-fracpilot-webhook-tls")
    nats_before = secret_data(core, kube_namespace, f"{name}-fracpilot-nats-auth")
    helm.run(
        "upgrade", name, str(CHART), "--namespace", kube_namespace, *values, "--set=logLevel=DEBUG"
    )
    assert secret_data(core, kube_namespace, f"{name}-fracpilot-webhook-tls") == tls_before
    assert secret_data(core, kube_namespace, f"{name}-fracpilot-nats-auth") == nats_before
    assert len(base64.b64decode(nats_before["password"])) == 32

    admission = client.AdmissionregistrationV1Api(kube_admin)
    config = admission.read_mutating_webhook_configuration(f"fracpilot-{name}-fracpilot-targets")
    # The opt-in rule's two webhooks (opted-in namespaces, pods opted in by label): one service.
    assert [w.name for w in config.webhooks] == [
        "targets.fracpilot.io",
        "pods.targets.fracpilot.io",
    ]
    for webhook in config.webhooks:
        assert webhook.client_config.ca_bundle == tls_before["ca.crt"]
        assert webhook.client_config.service.name == f"{name}-fracpilot-webhook"
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls_before["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(tls_before["tls.crt"]))
    verify_signed_by(serving, ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{name}-fracpilot-webhook.{kube_namespace}.svc" in sans.get_values_for_type(
        x509.DNSName
    )
    deployment = client.AppsV1Api(kube_admin).read_namespaced_deployment(
        f"{name}-fracpilot-actuator", kube_namespace
    )
    assert deployment.spec.replicas == 2
