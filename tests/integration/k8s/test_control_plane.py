"""The Kubernetes test control plane is the real thing: storage, admission, eviction, RBAC, helm.

Nothing here is fracpilot code yet; these tests pin down what the actuator's tests can rely on.
No controllers run, so every status a controller would write (node capacity, pod phase, PDB
budget) is written by the test.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s_control_plane import ControlPlane, k8s_version, wait_for
from support.kube import gpu_node, running_pod

pytestmark = pytest.mark.integration

MERGE_PATCH = "application/merge-patch+json"  # the client would default to json-patch


def _status_of(call: Any) -> int:
    """The HTTP status of an API call that is expected to fail."""
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status)


def _create_gpu_node(core: client.CoreV1Api, name: str, gpus: int) -> client.V1Node:
    labels = {"nvidia.com/gpu.present": "true", "fracpilot.io/pool": "inference"}
    gpu_node(core, name, gpus, labels)
    return core.read_node(name)


def _create_running_pod(
    core: client.CoreV1Api, namespace: str, name: str, node: str, labels: dict[str, str]
) -> None:
    # What a kubelet would report. A Pending or unready pod may be evicted whatever the budget.
    running_pod(
        core, namespace, name, node, labels=labels, annotations=None, limits={"nvidia.com/gpu": "1"}
    )


def test_serves_the_pinned_kubernetes_version(kube_admin: client.ApiClient) -> None:
    info = client.VersionApi(kube_admin).get_code()
    assert info.git_version == k8s_version()
    assert (info.major, info.minor) == ("1", k8s_version().split(".")[1])


def test_pdb_refuses_an_eviction_with_429(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    policy = client.PolicyV1Api(kube_admin)
    ns = kube_namespace
    node = f"gpu-{ns}"

    stored = _create_gpu_node(core, node, gpus=4)
    assert stored.status.capacity["nvidia.com/gpu"] == "4"
    selected = core.list_node(label_selector="fracpilot.io/pool=inference,nvidia.com/gpu.present")
    assert node in {n.metadata.name for n in selected.items}

    _create_running_pod(core, ns, "infer-0", node, labels={"app": "infer"})
    pod = core.read_namespaced_pod("infer-0", ns)
    assert (pod.spec.node_name, pod.status.phase) == (node, "Running")

    policy.create_namespaced_pod_disruption_budget(
        ns,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="infer"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1,
                selector=client.V1LabelSelector(match_labels={"app": "infer"}),
            ),
        ),
    )

    def set_budget(disruptions_allowed: int) -> None:
        generation = policy.read_namespaced_pod_disruption_budget("infer", ns).metadata.generation
        status = {
            "observedGeneration": generation,  # else the eviction answers "still being processed"
            "disruptionsAllowed": disruptions_allowed,
            "currentHealthy": 1,
            "desiredHealthy": 1 - disruptions_allowed,
            "expectedPods": 1,
        }
        policy.patch_namespaced_pod_disruption_budget_status(
            "infer", ns, {"status": status}, _content_type=MERGE_PATCH
        )

    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="infer-0", namespace=ns))
    set_budget(0)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction("infer-0", ns, eviction)
    assert refused.value.status == 429
    # The budget's own verdict, not "still being processed" (an unobserved generation).
    assert "The disruption budget infer needs 1 healthy pods and has 1 currently" in str(
        refused.value.body
    )
    assert core.read_namespaced_pod("infer-0", ns).metadata.deletion_timestamp is None

    # The same eviction goes through once the budget allows a disruption: the 429 was the PDB.
    set_budget(1)
    core.create_namespaced_pod_eviction("infer-0", ns, eviction)
    # No kubelet finishes the graceful deletion, so the pod stays, marked for deletion.
    assert core.read_namespaced_pod("infer-0", ns).metadata.deletion_timestamp is not None


def test_service_account_token_is_bound_by_rbac(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    rbac = client.RbacAuthorizationV1Api(kube_admin)
    ns = kube_namespace
    node = f"gpu-{ns}"
    _create_gpu_node(core, node, gpus=4)
    _create_running_pod(core, ns, "infer-0", node, labels={"app": "infer"})

    core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-getter"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader-gets-pods"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="pod-getter"
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=ns)],
        ),
    )

    with kube.service_account_client(ns, "reader") as as_reader:
        review = client.AuthenticationV1Api(as_reader).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == f"system:serviceaccount:{ns}:reader"

        reader = client.CoreV1Api(as_reader)
        # The RBAC authorizer reads through an informer cache: the binding lands in milliseconds.
        pod = wait_for(lambda: reader.read_namespaced_pod("infer-0", ns), timeout=10, what="get")
        assert pod.spec.node_name == node

        assert _status_of(lambda: reader.delete_namespaced_pod("infer-0", ns)) == 403
        assert _status_of(lambda: reader.delete_node(node)) == 403
        assert _status_of(lambda: reader.list_namespaced_pod(ns)) == 403
    assert core.read_namespaced_pod("infer-0", ns).metadata.deletion_timestamp is None


def test_static_token_user_authenticates_without_permissions(
    kube: ControlPlane, kube_namespace: str
) -> None:
    with kube.token_client() as as_tester:
        review = client.AuthenticationV1Api(as_tester).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == kube.static_token_user
        assert "testers" in review.status.user_info.groups
        core = client.CoreV1Api(as_tester)
        assert _status_of(lambda: core.list_namespaced_pod(kube_namespace)) == 403
    with kube.token_client("not-a-token") as anonymous_bad_token:
        assert _status_of(lambda: client.CoreV1Api(anonymous_bad_token).list_node()) == 401


# --- helm ----------------------------------------------------------------------------------------


def _helm(kube: ControlPlane, home: Path, *args: str) -> str:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    proc = subprocess.run(
        [str(kube.helm), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _chart(path: Path, kube_version_constraint: str) -> Path:
    (path / "templates").mkdir(parents=True)
    (path / "Chart.yaml").write_text(
        f'apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: "{kube_version_constraint}"\n'
    )
    (path / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-probe\n"
        "data:\n  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    return path


def test_helm_version_from_the_cache(kube: ControlPlane, tmp_path: Path) -> None:
    assert _helm(kube, tmp_path, "version", "--short").startswith("v3.")


def test_helm_targets_the_pinned_kubernetes(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    minor = k8s_version().split(".")[1]
    chart = _chart(tmp_path / "probe", f">=1.{minor}.0-0")

    # Offline, helm's linked-in default is the pinned minor (unstamped helm would say v1.20.0).
    rendered = _helm(kube, tmp_path, "template", "probe", str(chart))
    assert f'kubeVersion: "v1.{minor}.0"' in rendered
    _helm(kube, tmp_path, "lint", str(chart))

    # Online, helm installs through a kubeconfig and reads the server's version.
    kubeconfig = kube.write_kubeconfig()
    _helm(kube, tmp_path, "install", "probe", str(chart), "-n", kube_namespace,
          "--kubeconfig", str(kubeconfig))  # fmt: skip
    configmap = client.CoreV1Api(kube_admin).read_namespaced_config_map(
        "probe-probe", kube_namespace
    )
    assert configmap.data == {"kubeVersion": k8s_version()}
