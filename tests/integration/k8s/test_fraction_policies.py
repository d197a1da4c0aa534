"""The policy CRDs in a real kube-apiserver: the schema and its CEL rules refuse what Policy
refuses (named cases, and a corpus on which the apiserver and Policy must agree), and the
roles the chart ships decide who may change a policy.

The sync (objects -> the policy bucket -> decisions): test_fraction_policy_sync.py.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_actuator.policy_sync.objects import InvalidPolicyError, PolicyObject, to_policy
from fracpilot_libs.kube.policy_roles import EDIT_ROLE, VIEW_ROLE
from k8s_control_plane import REPO_ROOT, ControlPlane, wait_for
from support.policy_crds import create, install_crds, refusal

pytestmark = pytest.mark.integration

ROLES_FILE = REPO_ROOT / "deploy" / "rbac" / "policy-roles.yaml"


@pytest.fixture(scope="module")
def policy_crds(kube_admin: client.ApiClient) -> None:
    install_crds(kube_admin)


# --- the schema and the CEL rules -----------------------------------------------------------


@pytest.mark.usefixtures("policy_crds")
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"mode": "sideways"}, 'spec.mode: Unsupported value: "sideways"'),
        ({"minFraction": 0}, "spec.minFraction in body should be greater than 0"),
        ({"gridSteps": 101}, "spec.gridSteps in body should be less than or equal to 100"),
        ({"targetUtilization": 0.05}, "spec.targetUtilization: Invalid value"),
        ({"targetRef": {"name": "a..b"}}, "spec.targetRef.name: Invalid value"),
        ({"targetRef": {"kind": "Node", "name": "x"}}, "spec.targetRef.kind: Unsupported value"),
        ({"gridLevels": [0.5] * 65}, "spec.gridLevels: Too many: 65: must have at most 64 items"),
        # CEL: what the model's validators check across fields
        ({"minFraction": 0.5, "maxFraction": 0.25}, "minFraction must not be above maxFraction"),
        ({"maxFraction": 0.05}, "minFraction must not be above maxFraction"),  # default min 0.1
        ({"minFraction": 0.125}, "minFraction is off the grid"),  # hundredths by default
        ({"gridSteps": 3}, "minFraction is off the grid"),  # steps implied: 0.1 is off 1/3
        ({"grid": "levels"}, "grid levels needs gridLevels"),
        (
            {"grid": "levels", "gridLevels": [0.5, 0.25, 1.0], "minFraction": 0.25},
            "gridLevels must be strictly ascending",
        ),
        (
            {"grid": "levels", "gridLevels": [0.25, 0.5, 1.0], "minFraction": 0.3},
            "minFraction must be one of gridLevels",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_apiserver_refuses_an_invalid_policy(
    kube_admin: client.ApiClient, kube_namespace: str, spec: dict[str, Any], message: str
) -> None:
    reason = refusal(kube_admin, kube_namespace, spec)
    assert message in reason
    with pytest.raises(InvalidPolicyError):  # and so does Policy
        to_policy(PolicyObject("FractionPolicy", kube_namespace, "p", spec=spec))


@pytest.mark.usefixtures("policy_crds")
def test_the_cluster_default_is_one_object_named_default(kube_admin: client.ApiClient) -> None:
    other = f"other-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ApiException) as info:
        create(kube_admin, "", other, {"mode": "recommend"}, dry_run=True)
    assert info.value.status == 422
    assert "the one ClusterFractionPolicy is named 'default'" in str(info.value.body)
    made = create(kube_admin, "", "default", {"mode": "recommend"}, dry_run=True)
    assert made["metadata"]["name"] == "default"


def _corpus(count: int, seed: int) -> list[dict[str, Any]]:
    """Specs near the edges of the grids and bounds, valid and not."""
    rng = random.Random(seed)
    fractions = [0.01, 0.05, 0.1, 0.125, 0.2, 0.25, 0.3, 0.33, 0.5, 0.7, 0.75, 0.875, 1.0]
    choices: dict[str, list[Any]] = {
        "grid": ["backend", "steps", "levels"],
        "gridSteps": [1, 2, 3, 4, 8, 10, 16, 100],
        "gridLevels": [[0.25, 0.5, 1.0], [0.125, 0.25, 0.5, 0.75, 1.0], [0.5, 0.25], [0.3], []],
        "minFraction": fractions,
        "maxFraction": fractions,
        "mode": ["auto", "recommend"],
        "computeSizing": ["percentile", "soft"],
        "computeDelayBudget": [0.01, 0.5, 0.51],
        "downsizeMinChange": [0.0, 0.05, 1.0, 1.01],
        "signalMultiplier": [0.5, 1.0, 8.0, 8.5],
    }
    specs = []
    for _ in range(count):
        keys = rng.sample(sorted(choices), rng.randint(1, 5))
        specs.append({k: rng.choice(choices[k]) for k in keys})
    return specs


@pytest.mark.usefixtures("policy_crds")
def test_the_apiserver_and_policy_agree_on_a_corpus(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    """Every spec is accepted by the apiserver exactly when Policy accepts it: a model
    validator changed without its CEL rule (fracpilot_libs.kube.policy_crd) shows here."""
    disagreements = []
    corpus = _corpus(150, seed=18)
    for spec in corpus:
        refused = refusal(kube_admin, kube_namespace, spec)
        try:
            to_policy(PolicyObject("FractionPolicy", kube_namespace, "p", spec=spec))
            invalid = ""
        except InvalidPolicyError as exc:
            invalid = str(exc)
        if bool(refused) != bool(invalid):
            disagreements.append((spec, refused or "accepted", invalid or "valid"))
    assert disagreements == []
    valid = sum(1 for s in corpus if not refusal(kube_admin, kube_namespace, s))
    assert 0 < valid < len(corpus)  # both kinds of case were sent


# --- who may change a policy ---------------------------------------------------------------


def _roles(suffix: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(ROLES_FILE.read_text()) if d]
    for doc in docs:
        doc["metadata"]["name"] += f"-{suffix}"
    return docs


def _account(
    kube: ControlPlane, api: client.ApiClient, namespace: str, name: str, role: str
) -> client.ApiClient:
    """A ServiceAccount bound to ``role`` in ``namespace`` only, and a client acting as it."""
    client.CoreV1Api(api).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    return kube.service_account_client(namespace, name)


def _status(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


@pytest.mark.usefixtures("policy_crds")
def test_namespace_editors_may_change_their_policies_and_viewers_may_read_them(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    suffix = uuid.uuid4().hex[:6]
    rbac = client.RbacAuthorizationV1Api(kube_admin)
    for doc in _roles(suffix):
        rbac.create_cluster_role(doc)
    other_ns = f"o-{suffix}"
    client.CoreV1Api(kube_admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=other_ns))
    )
    editor = _account(kube, kube_admin, kube_namespace, "alice", f"{EDIT_ROLE}-{suffix}")
    viewer = _account(kube, kube_admin, kube_namespace, "bob", f"{VIEW_ROLE}-{suffix}")
    spec = {"targetRef": {"name": "chat"}, "maxFraction": 0.5}
    custom = client.CustomObjectsApi(viewer)

    def listed() -> int:
        return _status(
            lambda: custom.list_namespaced_custom_object(
                "fracpilot.io", "v1alpha1", kube_namespace, "fractionpolicies"
            )
        )

    wait_for(lambda: True if listed() == 200 else None, timeout=10, what="the bindings")
    assert _status(lambda: create(editor, kube_namespace, "chat", spec)) == 200
    assert _status(lambda: create(editor, other_ns, "chat", spec)) == 403  # not its namespace
    assert _status(lambda: create(editor, "", "default", {"mode": "auto"})) == 403
    status_patch = {"status": {"inForce": "forged"}}
    assert (
        _status(
            lambda: client.CustomObjectsApi(editor).patch_namespaced_custom_object_status(
                "fracpilot.io", "v1alpha1", kube_namespace, "fractionpolicies", "chat", status_patch
            )
        )
        == 403
    )  # the status is the actuator's
    assert listed() == 200
    assert _status(lambda: create(viewer, kube_namespace, "other", spec)) == 403
    delete = client.CustomObjectsApi(editor).delete_namespaced_custom_object
    args = ("fracpilot.io", "v1alpha1", kube_namespace, "fractionpolicies", "chat")
    assert _status(lambda: delete(*args)) == 200


def test_the_roles_carry_the_labels_the_standard_roles_aggregate(
    kube_admin: client.ApiClient,
) -> None:
    """The apiserver's own admin / edit / view ClusterRoles select the roles' labels (their
    rules are filled in by the controller-manager's aggregation controller, which these
    tests do not run)."""
    rbac = client.RbacAuthorizationV1Api(kube_admin)
    edit, view = (d["metadata"]["labels"] for d in _roles("x"))

    def selected(standard: str, labels: dict[str, str]) -> bool:
        rule = rbac.read_cluster_role(standard).aggregation_rule
        assert rule is not None, standard
        return any(
            all(labels.get(k) == v for k, v in (s.match_labels or {}).items())
            for s in rule.cluster_role_selectors
        )

    assert selected("admin", edit)
    assert selected("edit", edit)
    assert not selected("view", edit)  # viewers do not write
    assert selected("view", view)
