"""deploy/rbac/*.yaml grant the services exactly the calls they make, against a real apiserver.

``ACTUATOR_CALLS`` and ``INGEST_CALLS`` are the single lists of the API calls each service
makes: add a call here when the code starts making it, then the rule in the YAML.
``ACTUATOR_CONSOLIDATION_CALLS`` are the calls only consolidation in auto mode makes, granted by
actuator-consolidation.yaml, which is installed only then; ``ACTUATOR_RECOMMENDATION_CALLS``
those of the FractionRecommendation writer, granted by actuator-recommendations.yaml, installed
unless FRACPILOT_POLICYSYNC_RECOMMENDATIONS is off. The tests apply the YAML as the chart
would (namespace substituted), mint a token for the ServiceAccount and prove with it that

- every listed call is allowed (SelfSubjectAccessReview), and the important ones succeed for
  real (patch a pod's annotations, evict, record events, take the leader Lease, mark a node for
  consolidation...);
- every rule in the YAML serves a listed call: nothing is granted that no code uses;
- calls outside the list are refused, by review and by real calls answering 403;
- the actuator's Kubernetes backend itself (resize in place, scale-up with a placeholder,
  eviction) and ingest's owner watches run with those tokens.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.election.core import (
    DEFAULT_LEASE_NAME,
    ElectionCore,
    ElectionTiming,
    RoundOutcome,
)
from fracpilot_actuator.election.lease_stores import (
    KubernetesLeaseStore,
    microtime,
)
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.consolidation_round import MARK_REASON, MARK_TAINT
from fracpilot_actuator.kube.namespaces import NamespaceLabels
from fracpilot_actuator.kube.placeholders import PRIORITY_CLASS
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.policy_sync.recommendations import RecommendationWriter
from fracpilot_actuator.settings import CapacitySettings, EvictionSettings
from fracpilot_actuator.stores.nats_kv import KvTargetStore
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind, utcnow
from fracpilot_libs.kube.policy_crd import GROUP, VERSION
from fracpilot_libs.kube.recommendation_crd import PLURAL as RECOMMENDATION_PLURAL
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import wait_for as wait_until
from k8s_control_plane import REPO_ROOT, ControlPlane, wait_for
from support.kube import gpu_node, kai_reservation, running_pod
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration

RBAC_DIR = REPO_ROOT / "deploy" / "rbac"
CHART_NAMESPACE = "fracpilot"  # what the YAML says; the chart substitutes its namespace
MERGE_PATCH = "application/merge-patch+json"  # the client would default to json-patch
PLACEHOLDER_PRIORITY_CLASS = PRIORITY_CLASS  # "fracpilot-capacity", created by the chart

# Where a call happens: the service's own namespace, a workload's namespace, or cluster-wide
# (a cluster-scoped resource, or a namespaced one across all namespaces).
Scope = Literal["own", "workload", "cluster"]


@dataclass(frozen=True)
class Call:
    verb: str
    group: str  # "" for the core group
    resource: str
    subresource: str = ""
    scope: Scope = "workload"
    name: str = ""  # for a rule narrowed by resourceNames
    why: str = ""

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _reads(group: str, resource: str, why: str) -> tuple[Call, ...]:
    """get in a workload namespace, list and watch across all namespaces (informers)."""
    return (
        Call("get", group, resource, why=why),
        Call("list", group, resource, scope="cluster", why=why),
        Call("watch", group, resource, scope="cluster", why=why),
    )


# The actuator's calls (the backend, the placeholders, the leader election). Extend it here.
ACTUATOR_CALLS: tuple[Call, ...] = (
    Call("get", "", "nodes", scope="cluster", why="GPU inventory"),
    Call("list", "", "nodes", scope="cluster", why="GPU inventory"),
    Call("watch", "", "nodes", scope="cluster", why="GPU inventory"),
    Call("get", "", "namespaces", scope="cluster", why="opt-in: the fracpilot.io/mode label"),
    Call("list", "", "namespaces", scope="cluster", why="opt-in: the fracpilot.io/mode label"),
    Call("watch", "", "namespaces", scope="cluster", why="opt-in: the fracpilot.io/mode label"),
    *_reads("", "pods", "what runs where, with which fraction"),
    *_reads("apps", "replicasets", "pod -> ReplicaSet -> Deployment"),
    *_reads("apps", "deployments", "the workload a decision is about"),
    *_reads("apps", "statefulsets", "the workload a decision is about"),
    *_reads("batch", "jobs", "pod -> Job"),
    Call("list", "apps", "replicasets", why="the decision's namespace: pod -> Deployment"),
    Call("list", "batch", "jobs", why="the decision's namespace: pod -> Job -> CronJob"),
    Call("get", "apps", "daemonsets", why="the workload object (its opt-out label)"),
    Call("get", "batch", "cronjobs", why="the workload object (its opt-out label)"),
    *_reads("policy", "poddisruptionbudgets", "may this pod be moved now"),
    # Consolidation, in every mode but off (the moves themselves are the evictions below).
    Call(
        "list",
        "policy",
        "poddisruptionbudgets",
        scope="cluster",
        why="consolidation: every PDB's disruptionsAllowed (KubeApi.list_disruption_budgets)",
    ),
    Call("create", "", "events", why="consolidation: Events on the node (in namespace default)"),
    Call("patch", "", "pods", why="in place: rewrite the gpu-fraction / gpu-memory annotation"),
    Call("get", "", "configmaps", why="a KAI pod's GPU-sharing ConfigMap: its memory limit"),
    Call("patch", "apps", "deployments", why="targets_via=template: size the pod template"),
    Call("patch", "apps", "statefulsets", why="targets_via=template: size the pod template"),
    Call("create", "", "pods", "eviction", why="recreate elsewhere, within the PDBs"),
    Call("create", "", "events", why="what was changed and why, on the pod"),
    Call("create", "events.k8s.io", "events", why="the same, events.k8s.io/v1"),
    Call("create", "", "pods", scope="own", why="a placeholder holding GPU capacity"),
    Call("delete", "", "pods", scope="own", why="the placeholder, once the move is done"),
    Call("create", "coordination.k8s.io", "leases", scope="own", why="leader election"),
    Call(
        "get",
        "coordination.k8s.io",
        "leases",
        scope="own",
        name=DEFAULT_LEASE_NAME,
        why="leader election",
    ),
    Call(
        "update",
        "coordination.k8s.io",
        "leases",
        scope="own",
        name=DEFAULT_LEASE_NAME,
        why="leader election",
    ),
    Call(
        "get",
        "scheduling.k8s.io",
        "priorityclasses",
        scope="cluster",
        name=PLACEHOLDER_PRIORITY_CLASS,
        why="the placeholders' PriorityClass (the chart creates it) exists",
    ),
    *(
        Call(verb, "fracpilot.io", plural, scope="cluster", why="the policy sync's informers")
        for verb in ("list", "watch")
        for plural in ("fractionpolicies", "clusterfractionpolicies")
    ),
    Call("patch", "fracpilot.io", "fractionpolicies", "status", why="a policy's status"),
    *(
        Call(verb, "scheduling.run.ai", "queues", scope="cluster", why="KAI queue quota/limit")
        for verb in ("list", "watch")
    ),
    *(
        Call(
            verb,
            "scheduling.run.ai",
            "bindrequests",
            scope="cluster",
            why="a pod counts on its KAI BindRequest's node before it is bound",
        )
        for verb in ("list", "watch")
    ),
    *(
        Call(
            verb,
            "scheduling.run.ai",
            "podgroups",
            scope="cluster",
            why="a KAI gang's minMember, and the queue KAI charges its pods",
        )
        for verb in ("list", "watch")
    ),
    Call(
        "patch",
        "fracpilot.io",
        "clusterfractionpolicies",
        "status",
        scope="cluster",
        why="the cluster default's status",
    ),
)

# What only consolidation in auto mode calls: deploy/rbac/actuator-consolidation.yaml, which the
# chart installs only with actuator.consolidation.mode auto (secure by default: no node patching).
ACTUATOR_CONSOLIDATION_CALLS: tuple[Call, ...] = (
    Call(
        "patch",
        "",
        "nodes",
        scope="cluster",
        why="the mark on the node being emptied: a taint and an annotation (KubeApi.patch_node)",
    ),
)

# What only the FractionRecommendation writer calls (RecommendationWriter.write, scope opted-in
# or all): deploy/rbac/actuator-recommendations.yaml, which the chart installs only when
# fractionPolicies.recommendations is not off.
ACTUATOR_RECOMMENDATION_CALLS: tuple[Call, ...] = (
    Call(
        "create",
        "fracpilot.io",
        "fractionrecommendations",
        why="a workload's FractionRecommendation, once (RecommendationWriter)",
    ),
    Call(
        "patch",
        "fracpilot.io",
        "fractionrecommendations",
        "status",
        why="the recommendation of each decision (RecommendationWriter)",
    ),
)

# Calls the actuator must not be able to make (with consolidation auto or the recommendation
# writer's file: all but their calls).
ACTUATOR_FORBIDDEN: tuple[Call, ...] = (
    Call("delete", "", "nodes", scope="cluster"),
    Call("patch", "", "nodes", scope="cluster"),
    Call("update", "", "nodes", scope="cluster"),  # a merge patch only, never a replace
    Call("patch", "", "nodes", "status", scope="cluster"),
    Call("create", "", "nodes", scope="cluster"),
    Call("get", "", "secrets"),
    Call("list", "", "secrets", scope="cluster"),
    Call("get", "", "secrets", scope="own"),
    Call("list", "", "configmaps", scope="cluster"),  # a KAI pod's own, by name, only
    Call("patch", "", "configmaps"),  # KAI's binder fills them; fracpilot never writes them
    Call("delete", "apps", "deployments"),
    Call("update", "apps", "deployments"),
    Call("patch", "apps", "daemonsets"),
    Call("patch", "apps", "replicasets"),
    Call("update", "apps", "deployments", "scale"),
    Call("delete", "", "pods"),  # in a workload's namespace: evictions only
    Call("create", "", "pods"),  # placeholders only in its own namespace
    Call("update", "", "pods"),
    Call("delete", "", "events"),
    Call("create", "coordination.k8s.io", "leases"),  # in a workload's namespace
    Call("get", "coordination.k8s.io", "leases", scope="own", name="kube-scheduler"),
    Call("update", "coordination.k8s.io", "leases", scope="own", name="someone-else"),
    Call("delete", "coordination.k8s.io", "leases", scope="own", name=DEFAULT_LEASE_NAME),
    Call("create", "scheduling.k8s.io", "priorityclasses", scope="cluster"),
    Call(
        "get", "scheduling.k8s.io", "priorityclasses", scope="cluster", name="system-node-critical"
    ),
    Call(
        "create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", scope="cluster"
    ),
    Call("create", "rbac.authorization.k8s.io", "clusterrolebindings", scope="cluster"),
    Call("create", "rbac.authorization.k8s.io", "rolebindings", scope="own"),
    Call("impersonate", "", "serviceaccounts"),
    Call("create", "", "serviceaccounts", "token", scope="own"),
    Call("create", "fracpilot.io", "fractionpolicies"),  # policies are their owners' to change
    Call("update", "fracpilot.io", "fractionpolicies"),
    Call("delete", "fracpilot.io", "fractionpolicies"),
    Call("patch", "fracpilot.io", "clusterfractionpolicies", scope="cluster"),
    Call("create", "fracpilot.io", "fractionrecommendations"),  # the writer's file only
    Call("patch", "fracpilot.io", "fractionrecommendations", "status"),  # the same
    Call("patch", "fracpilot.io", "fractionrecommendations"),  # its status only
    Call("delete", "fracpilot.io", "fractionrecommendations"),  # the garbage collector's
    Call("list", "fracpilot.io", "fractionrecommendations", scope="cluster"),
    Call("patch", "scheduling.run.ai", "queues", scope="cluster"),  # KAI's objects: read only
    Call("create", "scheduling.run.ai", "bindrequests"),
    Call("delete", "scheduling.run.ai", "bindrequests"),
    Call("get", "scheduling.run.ai", "podgroups"),  # listed and watched, never read one by one
    Call("patch", "scheduling.run.ai", "podgroups"),
)

# What fracpilot_ingest.owners.KubernetesOwners calls (owners=kubernetes; nodes with
# FRACPILOT_HAMI_NODES, for HAMi's device register annotation).
INGEST_CALLS: tuple[Call, ...] = (
    *_reads("", "pods", "the pod's controller"),
    *_reads("apps", "replicasets", "ReplicaSet -> Deployment"),
    *_reads("batch", "jobs", "Job -> CronJob"),
    Call("list", "", "nodes", scope="cluster", why="HAMi device register (hami_nodes)"),
    Call("watch", "", "nodes", scope="cluster", why="HAMi device register (hami_nodes)"),
)

INGEST_FORBIDDEN: tuple[Call, ...] = (
    Call("patch", "", "pods"),
    Call("create", "", "pods", "eviction"),
    Call("patch", "", "nodes", scope="cluster"),
    Call("get", "", "secrets"),
    Call("get", "apps", "deployments"),
    Call("create", "", "events"),
    Call("create", "coordination.k8s.io", "leases", scope="own"),
)


# --- applying the YAML as the chart would --------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    namespace: str  # the service's own namespace
    workload_namespace: str
    service_account: str
    documents: list[dict[str, Any]]


def load_manifests(path: Path, namespace: str, suffix: str) -> list[dict[str, Any]]:
    """The YAML's objects in ``namespace``; cluster-scoped names get ``suffix`` so that tests
    sharing one apiserver do not collide."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in documents:
        meta = doc["metadata"]
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{meta['name']}-{suffix}"
        else:
            assert meta.get("namespace") == CHART_NAMESPACE, f"{doc['kind']} {meta['name']}"
            meta["namespace"] = namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"{doc['roleRef']['name']}-{suffix}"
        for subject in doc.get("subjects", ()):
            assert subject["namespace"] == CHART_NAMESPACE
            subject["namespace"] = namespace
    return documents


def create_objects(api: client.ApiClient, documents: list[dict[str, Any]]) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for doc in documents:
        kind, ns = doc["kind"], doc["metadata"].get("namespace", "")
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(ns, doc)
        elif kind == "ClusterRole":
            rbac.create_cluster_role(doc)
        elif kind == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(doc)
        elif kind == "Role":
            rbac.create_namespaced_role(ns, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(ns, doc)
        else:
            raise AssertionError(f"unexpected kind {kind} in an RBAC file")


def install(
    kube_admin: client.ApiClient, kube_namespace: str, files: tuple[str, ...], service_account: str
) -> Installed:
    workload_ns = f"w-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(kube_admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=workload_ns))
    )
    documents = [
        doc
        for file in files
        for doc in load_manifests(RBAC_DIR / file, kube_namespace, kube_namespace)
    ]
    create_objects(kube_admin, documents)
    return Installed(kube_namespace, workload_ns, service_account, documents)


@pytest.fixture
def actuator(kube_admin: client.ApiClient, kube_namespace: str) -> Installed:
    return install(kube_admin, kube_namespace, ("actuator.yaml",), "fracpilot-actuator")


@pytest.fixture
def actuator_consolidating(kube_admin: client.ApiClient, kube_namespace: str) -> Installed:
    """The actuator's RBAC as the chart installs it with actuator.consolidation.mode auto."""
    files = ("actuator.yaml", "actuator-consolidation.yaml")
    return install(kube_admin, kube_namespace, files, "fracpilot-actuator")


@pytest.fixture
def actuator_recommending(kube_admin: client.ApiClient, kube_namespace: str) -> Installed:
    """The actuator's RBAC as the chart installs it with fractionPolicies.recommendations
    opted-in (the default) or all."""
    files = ("actuator.yaml", "actuator-recommendations.yaml")
    return install(kube_admin, kube_namespace, files, "fracpilot-actuator")


@pytest.fixture
def ingest(kube_admin: client.ApiClient, kube_namespace: str) -> Installed:
    return install(kube_admin, kube_namespace, ("ingest.yaml",), "fracpilot-ingest")


@pytest.fixture
def as_actuator(kube: ControlPlane, actuator: Installed) -> Iterator[client.ApiClient]:
    with kube.service_account_client(actuator.namespace, actuator.service_account) as api:
        yield api


@pytest.fixture
def as_actuator_consolidating(
    kube: ControlPlane, actuator_consolidating: Installed
) -> Iterator[client.ApiClient]:
    installed = actuator_consolidating
    with kube.service_account_client(installed.namespace, installed.service_account) as api:
        yield api


@pytest.fixture
def as_actuator_recommending(
    kube: ControlPlane, actuator_recommending: Installed
) -> Iterator[client.ApiClient]:
    installed = actuator_recommending
    with kube.service_account_client(installed.namespace, installed.service_account) as api:
        yield api


@pytest.fixture
def as_ingest(kube: ControlPlane, ingest: Installed) -> Iterator[client.ApiClient]:
    with kube.service_account_client(ingest.namespace, ingest.service_account) as api:
        yield api


# --- asking the apiserver ------------------------------------------------------------------------


def namespace_of(call: Call, installed: Installed) -> str:
    return {"own": installed.namespace, "workload": installed.workload_namespace}.get(
        call.scope, ""
    )


def allowed(api: client.ApiClient, call: Call, installed: Installed) -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=call.verb,
                    group=call.group,
                    resource=call.resource,
                    subresource=call.subresource or None,
                    namespace=namespace_of(call, installed) or None,
                    name=call.name or None,
                )
            )
        )
    )
    assert review.status is not None
    return bool(review.status.allowed)


def wait_bound(api: client.ApiClient, installed: Installed, calls: tuple[Call, ...]) -> None:
    """The RBAC authorizer reads through an informer cache: wait for the bindings to land."""
    wait_for(
        lambda: True if allowed(api, calls[0], installed) else None,
        timeout=10,
        what="the bindings",
    )


def status_of(call: Callable[[], object]) -> int:
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status)


def http_status(call: Callable[[], object]) -> int:
    """200 when the call succeeds, else the status it failed with."""
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def rule_grants(rule: dict[str, Any], call: Call) -> bool:
    names = rule.get("resourceNames")
    return (
        call.group in rule["apiGroups"]
        and call.resource_path in rule["resources"]
        and call.verb in rule["verbs"]
        and (not names or call.name in names)
    )


def assert_every_rule_is_used(installed: Installed, calls: tuple[Call, ...]) -> None:
    """Each (group, resource, verb, name) a rule grants is a listed call of the right scope."""
    for doc in installed.documents:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        cluster_wide = doc["kind"] == "ClusterRole"
        for rule in doc["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"a wildcard in {doc['kind']}: {rule}"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            used = [
                                c
                                for c in calls
                                if rule_grants(rule, c)
                                and (c.group, c.resource_path, c.verb) == (group, resource, verb)
                                and c.name == name
                                and (c.scope != "own") == cluster_wide
                            ]
                            assert used, (
                                f"{doc['kind']} grants {verb} {group}/{resource} {name} "
                                "that no listed call uses"
                            )


# --- the actuator --------------------------------------------------------------------------------


def test_actuator_rbac_file_is_what_the_chart_expects() -> None:
    documents = load_manifests(RBAC_DIR / "actuator.yaml", "ns", "x")
    assert [d["kind"] for d in documents] == [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ]
    assert documents[0]["metadata"]["name"] == "fracpilot-actuator"
    assert DEFAULT_LEASE_NAME == "fracpilot-actuator"


def test_actuator_may_make_every_listed_call_and_nothing_else(
    as_actuator: client.ApiClient, actuator: Installed
) -> None:
    wait_bound(as_actuator, actuator, ACTUATOR_CALLS)
    refused = [c for c in ACTUATOR_CALLS if not allowed(as_actuator, c, actuator)]
    assert refused == []
    granted = [c for c in ACTUATOR_FORBIDDEN if allowed(as_actuator, c, actuator)]
    assert granted == []
    assert_every_rule_is_used(actuator, ACTUATOR_CALLS)


def _pod(name: str, namespace: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, annotations={"gpu-fraction": "0.5"}
        ),
        spec=client.V1PodSpec(
            scheduler_name="kai-scheduler",
            containers=[client.V1Container(name="server", image="registry.invalid/infer:1")],
        ),
    )


def test_actuator_real_calls_succeed(
    kube_admin: client.ApiClient, as_actuator: client.ApiClient, actuator: Installed
) -> None:
    admin_core = client.CoreV1Api(kube_admin)
    ns, own = actuator.workload_namespace, actuator.namespace
    admin_core.create_namespaced_pod(ns, _pod("infer-0", ns))
    admin_core.create_namespaced_pod(ns, _pod("infer-1", ns))
    client.AppsV1Api(kube_admin).create_namespaced_deployment(
        ns,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="infer"),
            spec=client.V1DeploymentSpec(
                selector=client.V1LabelSelector(match_labels={"app": "infer"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "infer"}),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="s", image="registry.invalid/s:1")]
                    ),
                ),
            ),
        ),
    )
    wait_bound(as_actuator, actuator, ACTUATOR_CALLS)
    core = client.CoreV1Api(as_actuator)
    apps = client.AppsV1Api(as_actuator)

    # Reads across the cluster, as the inventory's informers do.
    assert "infer-0" in {p.metadata.name for p in core.list_pod_for_all_namespaces().items}
    core.list_node()
    assert apps.read_namespaced_deployment("infer", ns).metadata.name == "infer"
    apps.list_replica_set_for_all_namespaces()
    apps.list_stateful_set_for_all_namespaces()
    client.BatchV1Api(as_actuator).list_job_for_all_namespaces()
    client.PolicyV1Api(as_actuator).list_pod_disruption_budget_for_all_namespaces()
    for _ in watch.Watch().stream(core.list_node, timeout_seconds=1):  # type: ignore[no-untyped-call]
        pass  # served (a 403 would raise); the nodes of other tests may show up
    scheduling = client.SchedulingV1Api(as_actuator)
    # Cluster-scoped and the chart's, so not created here: a 404 (authorised) counts too.
    assert http_status(lambda: scheduling.read_priority_class(PLACEHOLDER_PRIORITY_CLASS)) in (
        200,
        404,
    )
    assert status_of(lambda: scheduling.read_priority_class("system-node-critical")) == 403

    # The in-place plan: a merge patch of the annotations, and an event on the pod.
    patched = core.patch_namespaced_pod(
        "infer-0",
        ns,
        {"metadata": {"annotations": {"gpu-fraction": "0.25"}}},
        _content_type=MERGE_PATCH,
    )
    assert patched.metadata.annotations["gpu-fraction"] == "0.25"
    reference = client.V1ObjectReference(
        api_version="v1", kind="Pod", name="infer-0", namespace=ns, uid=patched.metadata.uid
    )
    now = microtime(datetime.now(UTC))
    core.create_namespaced_event(
        ns,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"infer-0.{uuid.uuid4().hex[:12]}"),
            involved_object=reference,
            reason="FractionResized",
            message="gpu-fraction 0.5 -> 0.25",
            type="Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="fracpilot-actuator"),
        ),
    )
    client.EventsV1Api(as_actuator).create_namespaced_event(
        ns,
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name=f"infer-0.{uuid.uuid4().hex[:12]}"),
            event_time=now,
            action="Resize",
            reason="FractionResized",
            note="gpu-fraction 0.5 -> 0.25",
            type="Normal",
            regarding=reference,
            reporting_controller="fracpilot.io/actuator",
            reporting_instance="fracpilot-actuator-0",
        ),
    )

    # Recreate elsewhere: the eviction (no PDB here, so it is granted at once).
    core.create_namespaced_pod_eviction(
        "infer-1",
        ns,
        client.V1Eviction(metadata=client.V1ObjectMeta(name="infer-1", namespace=ns)),
    )
    # An unscheduled pod goes at once (a bound one would be marked for deletion).
    assert status_of(lambda: admin_core.read_namespaced_pod("infer-1", ns)) == 404

    # A placeholder in its own namespace, created and deleted.
    core.create_namespaced_pod(own, _pod("placeholder-0", own))
    core.delete_namespaced_pod("placeholder-0", own, grace_period_seconds=0)

    # Leader election with the service account: create, renew (update), release.
    store = KubernetesLeaseStore(as_actuator, own)
    timing = ElectionTiming()
    core_a = ElectionCore(store, "actuator-a", timing)
    assert core_a.round(datetime.now(UTC)).outcome is RoundOutcome.ACQUIRED
    assert core_a.round(datetime.now(UTC)).outcome is RoundOutcome.RENEWED
    assert core_a.release(datetime.now(UTC))
    taken = ElectionCore(store, "actuator-b", timing).round(datetime.now(UTC))
    assert taken.outcome is RoundOutcome.ACQUIRED
    lease = client.CoordinationV1Api(kube_admin).read_namespaced_lease(DEFAULT_LEASE_NAME, own)
    assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("actuator-b", 1)


def test_actuator_real_calls_outside_the_list_are_refused(
    kube_admin: client.ApiClient, as_actuator: client.ApiClient, actuator: Installed
) -> None:
    ns, own = actuator.workload_namespace, actuator.namespace
    admin_core = client.CoreV1Api(kube_admin)
    admin_core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=f"gpu-{own}")))
    admin_core.create_namespaced_pod(ns, _pod("infer-0", ns))
    admin_core.create_namespaced_secret(
        ns, client.V1Secret(metadata=client.V1ObjectMeta(name="token"), string_data={"k": "v"})
    )
    wait_bound(as_actuator, actuator, ACTUATOR_CALLS)
    core = client.CoreV1Api(as_actuator)
    apps = client.AppsV1Api(as_actuator)
    rbac = client.RbacAuthorizationV1Api(as_actuator)
    leases = client.CoordinationV1Api(as_actuator)

    forbidden: dict[str, Callable[[], object]] = {
        "delete a node": lambda: core.delete_node(f"gpu-{own}"),
        "mark a node (consolidation auto only)": lambda: core.patch_node(
            f"gpu-{own}",
            {"metadata": {"annotations": {MARK_REASON: "x"}}},
            _content_type=MERGE_PATCH,
        ),
        "read a secret": lambda: core.read_namespaced_secret("token", ns),
        "list secrets": lambda: core.list_secret_for_all_namespaces(),
        "delete a deployment": lambda: apps.delete_namespaced_deployment("infer", ns),
        "create a clusterrolebinding": lambda: rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=f"escalate-{own}"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name="fracpilot-actuator", namespace=own
                    )
                ],
            )
        ),
        "delete a workload pod": lambda: core.delete_namespaced_pod("infer-0", ns),
        "create a pod in a workload namespace": lambda: core.create_namespaced_pod(
            ns, _pod("sneaky", ns)
        ),
        "replace a pod": lambda: core.replace_namespaced_pod(
            "infer-0", ns, admin_core.read_namespaced_pod("infer-0", ns)
        ),
        "read another lease": lambda: leases.read_namespaced_lease("kube-scheduler", own),
        "create a lease in a workload namespace": lambda: leases.create_namespaced_lease(
            ns, client.V1Lease(metadata=client.V1ObjectMeta(name=DEFAULT_LEASE_NAME))
        ),
    }
    statuses = {what: status_of(call) for what, call in forbidden.items()}
    assert statuses == dict.fromkeys(forbidden, 403)
    assert admin_core.read_node(f"gpu-{own}").metadata.deletion_timestamp is None
    assert admin_core.read_namespaced_pod("infer-0", ns).metadata.deletion_timestamp is None


# --- the actuator, consolidation auto ------------------------------------------------------------


def test_consolidation_rbac_file_grants_patch_nodes_to_the_actuator() -> None:
    documents = load_manifests(RBAC_DIR / "actuator-consolidation.yaml", "ns", "x")
    assert [d["kind"] for d in documents] == ["ClusterRole", "ClusterRoleBinding"]
    role, binding = documents
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fracpilot-actuator", "namespace": "ns"}
    ]


def _what(call: Call) -> tuple[str, str, str, Scope, str]:
    """A call without its reason."""
    return (call.verb, call.group, call.resource_path, call.scope, call.name)


def test_with_consolidation_auto_the_actuator_may_patch_nodes_and_nothing_else_new(
    as_actuator_consolidating: client.ApiClient, actuator_consolidating: Installed
) -> None:
    api, installed = as_actuator_consolidating, actuator_consolidating
    calls = ACTUATOR_CALLS + ACTUATOR_CONSOLIDATION_CALLS
    wait_bound(api, installed, ACTUATOR_CALLS)
    wait_bound(api, installed, ACTUATOR_CONSOLIDATION_CALLS)
    assert [c for c in calls if not allowed(api, c, installed)] == []
    granted_now = {_what(c) for c in ACTUATOR_CONSOLIDATION_CALLS}
    still_forbidden = tuple(c for c in ACTUATOR_FORBIDDEN if _what(c) not in granted_now)
    assert len(still_forbidden) == len(ACTUATOR_FORBIDDEN) - 1  # patch nodes, only
    assert [c for c in still_forbidden if allowed(api, c, installed)] == []
    assert_every_rule_is_used(installed, calls)
    # Without the consolidation calls listed, its grant is one no code uses.
    with pytest.raises(AssertionError, match="grants patch /nodes"):
        assert_every_rule_is_used(installed, ACTUATOR_CALLS)


async def test_with_consolidation_auto_the_actuator_marks_a_node_and_no_more(
    kube_admin: client.ApiClient,
    as_actuator_consolidating: client.ApiClient,
    actuator_consolidating: Installed,
) -> None:
    """The mark as consolidation makes it (KubeApi.patch_node: a merge patch of the taints
    and the annotation, conditional on the resourceVersion) and takes it off, with the token;
    replacing, deleting a node or patching its status stays refused."""
    api, own = as_actuator_consolidating, actuator_consolidating.namespace
    admin_core = client.CoreV1Api(kube_admin)
    node = f"gpu-{own}"
    admin_core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    wait_bound(api, actuator_consolidating, ACTUATOR_CONSOLIDATION_CALLS)
    kube = KubeApi(api)
    version = admin_core.read_node(node).metadata.resource_version
    mark = {"key": MARK_TAINT, "value": "true", "effect": "NoSchedule"}
    marked = await kube.patch_node(
        node,
        {
            "metadata": {"annotations": {MARK_REASON: "frees 1 GPU"}, "resourceVersion": version},
            "spec": {"taints": [mark]},
        },
    )
    read = admin_core.read_node(node)
    assert int(read.metadata.resource_version) == marked
    assert read.metadata.annotations[MARK_REASON] == "frees 1 GPU"
    assert [(t.key, t.value, t.effect) for t in read.spec.taints] == [
        (MARK_TAINT, "true", "NoSchedule")
    ]
    await kube.patch_node(
        node,
        {
            "metadata": {"annotations": {MARK_REASON: None}, "resourceVersion": str(marked)},
            "spec": {"taints": []},
        },
    )
    read = admin_core.read_node(node)
    assert MARK_REASON not in (read.metadata.annotations or {})
    assert not read.spec.taints

    core = client.CoreV1Api(api)
    forbidden: dict[str, Callable[[], object]] = {
        "delete a node": lambda: core.delete_node(node),
        "replace a node": lambda: core.replace_node(node, admin_core.read_node(node)),
        "patch a node's status": lambda: core.patch_node_status(
            node, {"status": {"capacity": {"nvidia.com/gpu": "8"}}}, _content_type=MERGE_PATCH
        ),
        "create a node": lambda: core.create_node(
            client.V1Node(metadata=client.V1ObjectMeta(name=f"fake-{own}"))
        ),
    }
    statuses = {what: status_of(call) for what, call in forbidden.items()}
    assert statuses == dict.fromkeys(forbidden, 403)
    assert admin_core.read_node(node).metadata.deletion_timestamp is None


# --- the actuator, FractionRecommendations written (scope opted-in or all) -------------------


def test_recommendations_rbac_file_grants_create_and_status_patch_only() -> None:
    documents = load_manifests(RBAC_DIR / "actuator-recommendations.yaml", "ns", "x")
    assert [d["kind"] for d in documents] == ["ClusterRole", "ClusterRoleBinding"]
    role, binding = documents
    assert role["rules"] == [
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
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fracpilot-actuator", "namespace": "ns"}
    ]
    # actuator.yaml alone grants nothing on them: scope off installs only that.
    plain = load_manifests(RBAC_DIR / "actuator.yaml", "ns", "x")
    assert not [
        rule
        for d in plain
        for rule in d.get("rules") or ()
        if any(r.startswith("fractionrecommendations") for r in rule["resources"])
    ]


def test_with_recommendations_the_actuator_may_write_them_and_nothing_else_new(
    as_actuator_recommending: client.ApiClient, actuator_recommending: Installed
) -> None:
    api, installed = as_actuator_recommending, actuator_recommending
    calls = ACTUATOR_CALLS + ACTUATOR_RECOMMENDATION_CALLS
    wait_bound(api, installed, ACTUATOR_CALLS)
    wait_bound(api, installed, ACTUATOR_RECOMMENDATION_CALLS)
    assert [c for c in calls if not allowed(api, c, installed)] == []
    granted_now = {_what(c) for c in ACTUATOR_RECOMMENDATION_CALLS}
    still_forbidden = tuple(c for c in ACTUATOR_FORBIDDEN if _what(c) not in granted_now)
    assert len(still_forbidden) == len(ACTUATOR_FORBIDDEN) - 2  # create, patch status
    assert [c for c in still_forbidden if allowed(api, c, installed)] == []
    assert_every_rule_is_used(installed, calls)
    # Without the writer's calls listed, its grant is one no code uses.
    with pytest.raises(
        AssertionError, match=r"grants create fracpilot\.io/fractionrecommendations "
    ):
        assert_every_rule_is_used(installed, ACTUATOR_CALLS)


HELD = Actuation(PlanKind.IN_PLACE, Outcome.DRY_RUN, "recommend", held_back="policy")


def chat_decision(kube_admin: client.ApiClient, ns: str, new: float) -> FractionDecision:
    """Deployment chat in ``ns`` (made once: the writer reads its uid) and a decision for it."""
    apps = client.AppsV1Api(kube_admin)
    if not apps.list_namespaced_deployment(ns).items:
        apps.create_namespaced_deployment(
            ns,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name="chat"),
                spec=client.V1DeploymentSpec(
                    selector=client.V1LabelSelector(match_labels={"app": "chat"}),
                    template=client.V1PodTemplateSpec(
                        metadata=client.V1ObjectMeta(labels={"app": "chat"}),
                        spec=client.V1PodSpec(
                            containers=[client.V1Container(name="s", image="registry.invalid/s")]
                        ),
                    ),
                ),
            ),
        )
    return decision(
        0.5, new, name="chat", decision_id=f"d-{uuid.uuid4().hex[:8]}",
        workload=decision(name="chat").workload.model_copy(update={"namespace": ns}),
        decided_at=utcnow(), pod="chat-0",
    )  # fmt: skip


async def test_the_recommendation_writer_runs_with_its_grant(
    kube_admin: client.ApiClient,
    as_actuator_recommending: client.ApiClient,
    actuator_recommending: Installed,
) -> None:
    """RecommendationWriter.write with the token of actuator.yaml and
    actuator-recommendations.yaml: the object is created, then its status patched."""
    install_crds(kube_admin)  # deploy/crds/, FractionRecommendation with them (idempotent)
    api, installed = as_actuator_recommending, actuator_recommending
    wait_bound(api, installed, ACTUATOR_RECOMMENDATION_CALLS)
    ns = installed.workload_namespace
    writer = RecommendationWriter(KubeApi(api), CollectorRegistry(), 10.0)
    assert await writer.write(chat_decision(kube_admin, ns, 0.25), HELD) == "created"
    assert await writer.write(chat_decision(kube_admin, ns, 0.375), HELD) == "status"
    got = client.CustomObjectsApi(kube_admin).get_namespaced_custom_object(
        GROUP, VERSION, ns, RECOMMENDATION_PLURAL, "deployment-chat"
    )
    assert got["status"]["recommendedFraction"] == 0.375  # type: ignore[index]


async def test_without_its_grant_the_recommendation_writer_warns_once_and_counts(
    kube_admin: client.ApiClient,
    kube_namespace: str,
    as_actuator: client.ApiClient,
    actuator: Installed,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """actuator.yaml alone (what the chart binds with scope off) while the writer runs (the
    scope set otherwise by hand): the status patch answers 403; one warning, the results
    counted forbidden, the API not asked again before the re-check, the writer still running.
    Once actuator-recommendations.yaml is bound and the re-check is due, the next is written."""
    install_crds(kube_admin)
    wait_bound(as_actuator, actuator, ACTUATOR_CALLS)
    ns = actuator.workload_namespace
    now = [1000.0]
    registry = CollectorRegistry()
    writer = RecommendationWriter(
        KubeApi(as_actuator), registry, 10.0, scope="all", recheck_s=600.0, clock=lambda: now[0]
    )

    def count(result: str) -> float:
        got = registry.get_sample_value("fracpilot_recommendation_writes_total", {"result": result})
        return got or 0.0

    async def offered(new: float, timeout_s: float = 10.0) -> None:
        writer.offer(chat_decision(kube_admin, ns, new), HELD)
        assert await writer.drained(timeout_s)

    writer.start()
    try:
        with caplog.at_level(logging.WARNING):
            await offered(0.25)
            assert (count("forbidden"), writer.writing) == (1, False)
            for new in (0.3, 0.35):  # not even queued: no call, counted
                await offered(new, 1.0)
            assert count("forbidden") == 3
            now[0] += 601.0  # the re-check is due: asked once more, still 403
            await offered(0.4)
            assert count("forbidden") == 4
        warned = [r for r in caplog.records if "not written" in r.getMessage()]
        assert [r.getMessage() for r in warned] == [
            "FractionRecommendations are not written: the actuator may not write them (RBAC)"
        ]
        assert "actuator-recommendations.yaml" in warned[0].error
        assert count("error") == 0

        create_objects(
            kube_admin,
            load_manifests(
                RBAC_DIR / "actuator-recommendations.yaml", kube_namespace, kube_namespace
            ),
        )
        wait_bound(as_actuator, actuator, ACTUATOR_RECOMMENDATION_CALLS)
        now[0] += 601.0
        await offered(0.375)
        assert (count("created"), writer.writing) == (1, True)
        got = client.CustomObjectsApi(kube_admin).get_namespaced_custom_object(
            GROUP, VERSION, ns, RECOMMENDATION_PLURAL, "deployment-chat"
        )
        assert got["status"]["recommendedFraction"] == 0.375  # type: ignore[index]
    finally:
        await writer.stop()


async def test_the_backend_runs_with_the_actuator_token(
    kube_admin: client.ApiClient,
    as_actuator: client.ApiClient,
    actuator: Installed,
    nats_url: str,
) -> None:
    """The Kubernetes backend's own calls, with the ServiceAccount's token: a resize in place,
    then a scale-up (a placeholder in the actuator's namespace) ending in an eviction."""
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    ns, own = actuator.workload_namespace, actuator.namespace
    for cluster_scoped in (
        lambda: core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name="kai-resource-reservation"))
        ),
        lambda: client.SchedulingV1Api(kube_admin).create_priority_class(
            client.V1PriorityClass(  # the chart's, as the backend would make it
                metadata=client.V1ObjectMeta(name=PRIORITY_CLASS),
                # The chart's value: the session's apiserver is shared, and a PriorityClass's
                # value cannot change (the chart tests apply theirs on the same apiserver).
                value=CapacitySettings().priority,
                preemption_policy="Never",
            )
        ),
    ):
        assert http_status(cluster_scoped) in (200, 409)  # shared by the session
    # One GPU holding two KAI pods at 0.5 each: growing one fits nowhere, so a scale-up.
    node, group = f"gpu-a-{own}", f"group-{own}"
    owners: dict[str, client.V1OwnerReference] = {}
    gpu_node(core, node, 1, {"fracpilot.io/test": own})
    kai_reservation(core, group, node, f"GPU-{own}")
    for name in ("chat", "embed"):
        deployment = apps.create_namespaced_deployment(
            ns,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name=name),
                spec=client.V1DeploymentSpec(
                    selector=client.V1LabelSelector(match_labels={"app": name}),
                    template=client.V1PodTemplateSpec(
                        metadata=client.V1ObjectMeta(labels={"app": name}),
                        spec=client.V1PodSpec(
                            containers=[client.V1Container(name="s", image="registry.invalid/s")]
                        ),
                    ),
                ),
            ),
        )
        owner = client.V1OwnerReference(
            api_version="apps/v1",
            kind="Deployment",
            name=name,
            uid=deployment.metadata.uid,
            controller=True,
        )
        owners[name] = owner
        running_pod(
            core,
            ns,
            f"{name}-0",
            node,
            labels={"app": name, "runai-gpu-group": group},
            annotations={"gpu-fraction": "0.5"},
            owner=owner,
        )
    wait_bound(as_actuator, actuator, ACTUATOR_CALLS)

    bus = Bus("rbac-test", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect()
    finished: list[Actuation] = []

    async def report(_decision: FractionDecision, actuation: Actuation) -> None:
        finished.append(actuation)

    # The workloads' namespace opts in; the actuator reads that label with its own token.
    core.patch_namespace(ns, {"metadata": {"labels": {"fracpilot.io/mode": "auto"}}})
    namespaces = NamespaceLabels(as_actuator)
    namespaces.start()
    backend: KubernetesBackend | None = None
    try:
        assert await namespaces.wait_synced(10), "namespaces not listed with the actuator's token"
        backend = KubernetesBackend(
            KubeApi(as_actuator),
            KvTargetStore(await bus.kv(subjects.TARGET_BUCKET)),
            KubeBackendSettings(
                cluster="test",
                node_selector=f"fracpilot.io/test={own}",
                capacity_namespace=own,  # placeholders only where the Role allows them
                eviction=EvictionSettings(attempts=1),
                guardrails=GuardrailSettings(allow_single_replica=True),
            ),
            report,
            instance="rbac-test",
            namespaces=namespaces,
        )
        await backend.start(utcnow())

        def grow(name: str, current: float, new: float) -> FractionDecision:
            return decision(
                current, new, name=name, decision_id=f"d-{uuid.uuid4().hex[:8]}",
                workload=decision(name=name).workload.model_copy(update={"namespace": ns}),
                decided_at=utcnow(), pod=f"{name}-0",
            )  # fmt: skip

        shrunk = await backend.actuate(grow("embed", 0.5, 0.25), dry_run="", now=utcnow())
        assert (shrunk.plan, shrunk.outcome, shrunk.error) == (
            PlanKind.IN_PLACE,
            Outcome.APPLIED,
            None,
        )
        scaled = await backend.actuate(grow("chat", 0.5, 0.9), dry_run="", now=utcnow())
        assert (scaled.plan, scaled.outcome, scaled.error) == (  # capacity requested
            PlanKind.SCALE_UP,
            Outcome.PENDING,
            None,
        )
        placeholders = core.list_namespaced_pod(own).items
        assert [p.spec.priority_class_name for p in placeholders] == [PRIORITY_CLASS]
        gpu_node(core, f"gpu-b-{own}", 1, {"fracpilot.io/test": own})  # the autoscaler's answer
        if (cache := backend.cache) is not None:  # the node reaches the cache by its watch
            await wait_until(  # on the loop, where the cache's watches run
                lambda: any(
                    n["metadata"]["name"] == f"gpu-b-{own}"
                    and "nvidia.com/gpu" in ((n.get("status") or {}).get("allocatable") or {})
                    for n in cache.snapshot().nodes
                ),
                timeout=10,
            )
        await backend.reconcile(utcnow())  # capacity appeared: chat-0 evicted
        assert [(a.outcome, a.error) for a in finished] == [(Outcome.PENDING, None)]
        # The ReplicaSet's new pod, bound on the new node: verified with the actuator's token.
        running_pod(
            core,
            ns,
            "chat-1",
            f"gpu-b-{own}",
            labels={"app": "chat", "runai-gpu-group": f"{group}-b"},
            annotations={"gpu-fraction": "0.9"},
            owner=owners["chat"],
        )
        # Reconciled until the replacement is seen bound (the watch-fed cache may lag).
        deadline = asyncio.get_running_loop().time() + 20
        while len(finished) < 2 and asyncio.get_running_loop().time() < deadline:
            await backend.reconcile(utcnow())
            await asyncio.sleep(0.2)
        assert [(a.outcome, a.error) for a in finished] == [
            (Outcome.PENDING, None),
            (Outcome.APPLIED, None),
        ], [a.detail for a in finished]
    finally:
        namespaces.stop()
        if backend is not None:
            backend.close()
        await bus.close()
    assert http_status(lambda: core.read_namespaced_pod(placeholders[0].metadata.name, own)) in (
        404,
        200,  # deleted with a grace period of 0: gone at once, or about to be
    )
    evicted = core.read_namespaced_pod("chat-0", ns).metadata.deletion_timestamp
    assert evicted is not None
    reasons = {e.reason for e in core.list_namespaced_event(ns).items}
    assert {"FractionResized", "CapacityRequested", "FractionEvictionRequested"} <= reasons


# --- ingest --------------------------------------------------------------------------------------


def test_ingest_may_make_every_listed_call_and_nothing_else(
    as_ingest: client.ApiClient, ingest: Installed
) -> None:
    wait_bound(as_ingest, ingest, INGEST_CALLS)
    assert [c for c in INGEST_CALLS if not allowed(as_ingest, c, ingest)] == []
    assert [c for c in INGEST_FORBIDDEN if allowed(as_ingest, c, ingest)] == []
    assert_every_rule_is_used(ingest, INGEST_CALLS)


async def test_ingest_owner_watches_run_with_its_token(
    kube_admin: client.ApiClient, as_ingest: client.ApiClient, ingest: Installed
) -> None:
    from fracpilot_ingest.owners import KubernetesOwners

    ns = ingest.workload_namespace
    apps_admin = client.AppsV1Api(kube_admin)
    rs = apps_admin.create_namespaced_replica_set(
        ns,
        client.V1ReplicaSet(
            metadata=client.V1ObjectMeta(
                name="chat-5c8d9f7b6",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="apps/v1",
                        kind="Deployment",
                        name="chat",
                        uid=str(uuid.uuid4()),
                        controller=True,
                    )
                ],
            ),
            spec=client.V1ReplicaSetSpec(
                selector=client.V1LabelSelector(match_labels={"app": "chat"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "chat"}),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="s", image="registry.invalid/s:1")]
                    ),
                ),
            ),
        ),
    )
    pod = _pod("chat-5c8d9f7b6-q2w4x", ns)
    pod.metadata.owner_references = [
        client.V1OwnerReference(
            api_version="apps/v1",
            kind="ReplicaSet",
            name="chat-5c8d9f7b6",
            uid=rs.metadata.uid,
            controller=True,
        )
    ]
    client.CoreV1Api(kube_admin).create_namespaced_pod(ns, pod)
    wait_bound(as_ingest, ingest, INGEST_CALLS)

    owners = KubernetesOwners(as_ingest, "test", nodes=True)  # nodes: HAMi's register
    owners.start()
    try:
        assert await owners.wait_synced(10)
        resolved = await owners.resolve(ns, "chat-5c8d9f7b6-q2w4x")
        assert (resolved.owner_kind, resolved.owner_name) == ("Deployment", "chat")
    finally:
        owners.stop()
    core = client.CoreV1Api(as_ingest)
    assert status_of(lambda: core.read_node("any-node")) == 403
    assert (
        status_of(lambda: core.patch_node("any-node", {"metadata": {"labels": {"x": "y"}}})) == 403
    )
    assert status_of(lambda: core.patch_namespaced_pod(
        pod.metadata.name, ns, {"metadata": {"annotations": {"x": "y"}}},
        _content_type=MERGE_PATCH)) == 403  # fmt: skip


def test_every_rule_check_catches_an_unused_grant() -> None:
    """The guard against over-granting has teeth: an extra verb is reported."""
    documents = load_manifests(RBAC_DIR / "ingest.yaml", "ns", "x")
    widened = copy.deepcopy(documents)
    role = next(d for d in widened if d["kind"] == "ClusterRole")
    role["rules"][0]["verbs"].append("delete")
    with pytest.raises(AssertionError, match="grants delete /pods"):
        assert_every_rule_is_used(Installed("ns", "w", "fracpilot-ingest", widened), INGEST_CALLS)
    assert_every_rule_is_used(Installed("ns", "w", "fracpilot-ingest", documents), INGEST_CALLS)
