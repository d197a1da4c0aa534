"""The policy CRDs (deploy/crds/) in a real kube-apiserver, and calls on their objects.

Used by tests/integration/k8s/test_fraction_policies.py and test_fraction_policy_sync.py.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_libs.kube.policy_crd import (
    CLUSTER_PLURAL,
    GROUP,
    NAMESPACED_KIND,
    NAMESPACED_PLURAL,
    VERSION,
)
from k8s_control_plane import REPO_ROOT, wait_for

CRD_DIR = REPO_ROOT / "deploy" / "crds"
API_VERSION = f"{GROUP}/{VERSION}"


def crd_documents() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def _put_crd(ext: client.ApiextensionsV1Api, doc: dict[str, Any]) -> None:
    name = doc["metadata"]["name"]
    try:
        current = ext.read_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        ext.create_custom_resource_definition(doc)
        return
    body = copy.deepcopy(doc)
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ext.replace_custom_resource_definition(name, body)


def install_crds(api: client.ApiClient, documents: list[dict[str, Any]] | None = None) -> None:
    """Create (or replace) the CRDs and wait until they are served."""
    ext = client.ApiextensionsV1Api(api)
    documents = documents or crd_documents()
    for doc in documents:
        _put_crd(ext, doc)

    def established() -> bool | None:
        for doc in documents:
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            conditions = {c.type: c.status for c in (crd.status.conditions or ())}
            if conditions.get("Established") != "True":
                return None
        return True

    wait_for(established, timeout=30, what="policy CRDs established")


def without_cel(doc: dict[str, Any]) -> dict[str, Any]:
    """The CRD as an older version without the CEL rules would have had it."""
    loose = copy.deepcopy(doc)
    for version in loose["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"].pop(
            "x-kubernetes-validations", None
        )
    return loose


@contextlib.contextmanager
def looser_crd(api: client.ApiClient) -> Iterator[None]:
    """The FractionPolicy CRD without its CEL rules while the block runs."""
    [namespaced] = [d for d in crd_documents() if d["spec"]["names"]["kind"] == NAMESPACED_KIND]
    install_crds(api, [without_cel(namespaced)])
    try:
        yield
    finally:
        install_crds(api, [namespaced])


def fraction_policy(name: str, spec: dict[str, Any], kind: str = NAMESPACED_KIND) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


def create(
    api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any], *, dry_run: bool = False
) -> dict[str, Any]:
    """Create a FractionPolicy (namespace "") or the ClusterFractionPolicy ``name``."""
    custom = client.CustomObjectsApi(api)
    extra = {"dry_run": "All"} if dry_run else {}
    if namespace:
        made = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, NAMESPACED_PLURAL, fraction_policy(name, spec), **extra
        )
    else:
        body = fraction_policy(name, spec, "ClusterFractionPolicy")
        made = custom.create_cluster_custom_object(GROUP, VERSION, CLUSTER_PLURAL, body, **extra)
    return dict(made)  # type: ignore[arg-type]


def refusal(api: client.ApiClient, namespace: str, spec: dict[str, Any], name: str = "p") -> str:
    """Why the apiserver refuses the object ("" when it accepts it; nothing is stored)."""
    try:
        create(api, namespace, name, spec, dry_run=True)
    except ApiException as exc:
        if exc.status != 422:
            raise
        return str(json.loads(exc.body).get("message", exc.body))
    return ""


def read(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, NAMESPACED_PLURAL, name)
    return dict(got)  # type: ignore[arg-type]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c["type"] == kind:
            return dict(c)
    return {}


def table(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """What ``kubectl get fractionpolicies`` asks for: the list as a meta.k8s.io Table."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{NAMESPACED_PLURAL}"
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io"
    method, url, headers, body, _ = api.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"]
    )
    response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=10)
    response.read()
    return dict(json.loads(response.data))


def source_file(kind: str) -> Path:
    plural = NAMESPACED_PLURAL if kind == NAMESPACED_KIND else CLUSTER_PLURAL
    return CRD_DIR / f"{GROUP}_{plural}.yaml"
