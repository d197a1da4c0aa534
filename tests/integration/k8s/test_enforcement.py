"""Accounted versus enforced against a real kube-apiserver: the reader finds each KAI pod's
memory limit in the GPU-sharing ConfigMap its env refers to (as KAI's hamicore admission
plugin and binder leave them), and the backend recreates, never patches, an upsize that must
raise that limit. No KAI runs: the test writes the pods and ConfigMaps as KAI would.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.reader import ClusterReader
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.memory import MemoryTargetStore
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind, WorkloadRef, utcnow
from support import kube

pytestmark = pytest.mark.integration

LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"


def settings_for(ns: str) -> KubeBackendSettings:
    return KubeBackendSettings(
        cluster="test",
        node_selector=f"fracpilot.io/test={ns}",
        inventory_cache=False,
        opt_in=OptInSettings(default_mode="auto"),
    )


def kai_pod(
    core: client.CoreV1Api,
    ns: str,
    name: str,
    node: str,
    group: str,
    owner: client.V1OwnerReference,
    configmap: str | None,
) -> None:
    """A bound, Running KAI pod at 0.25; with ``configmap``, the fraction container's
    CUDA_DEVICE_MEMORY_LIMIT refers to it, as KAI's hamicore admission plugin writes it."""
    env = None
    annotations = {"gpu-fraction": "0.25"}
    if configmap is not None:
        annotations["runai/shared-gpu-configmap"] = configmap.rsplit("-", 1)[0]
        ref = client.V1ConfigMapKeySelector(name=configmap, key=LIMIT, optional=True)
        env = [
            client.V1EnvVar(name=LIMIT, value_from=client.V1EnvVarSource(config_map_key_ref=ref))
        ]
    core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={"app": "chat", kube.KAI_GROUP: group},
                annotations=annotations,
                owner_references=[owner],
            ),
            spec=client.V1PodSpec(
                node_name=node,
                containers=[client.V1Container(name="main", image="registry.invalid/x:1", env=env)],
            ),
        ),
    )
    core.patch_namespaced_pod_status(name, ns, {"status": kube.RUNNING_AND_READY})


def configmap(core: client.CoreV1Api, ns: str, name: str, data: dict[str, str]) -> None:
    """The capabilities ConfigMap as KAI's binder fills it before binding."""
    core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=data)
    )


def set_up(api: client.ApiClient, ns: str, limits: dict[str, str | None]) -> WorkloadRef:
    """A GPU node, a reserved GPU group and a Deployment with one KAI pod per entry of
    ``limits``: pod name -> its ConfigMap's CUDA_DEVICE_MEMORY_LIMIT ("" no hamicore env, None
    an env whose ConfigMap is not there)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    node = kube.gpu_node(core, f"gpu-{ns}", 1, {"fracpilot.io/test": ns})
    group = f"g-{ns}"
    kube.kai_reservation(core, group, node, f"GPU-{ns}")
    owner = kube.deployment(apps, ns, "chat")
    for name, limit in limits.items():
        cm = None if limit == "" else f"{name}-abcdefg-shared-gpu-0"
        if limit:
            configmap(core, ns, str(cm), {"GPU_PORTION": "0.25", LIMIT: limit})
        kai_pod(core, ns, name, node, group, owner, cm)
    return WorkloadRef(cluster="test", namespace=ns, owner_kind="Deployment", owner_name="chat")


def test_the_reader_finds_each_kai_pods_enforced_limit_in_its_configmap(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    limits = {"chat-0": "20480m", "chat-1": "", "chat-2": None}
    workload = set_up(kube_admin, ns, limits)

    async def observe() -> Any:
        return await ClusterReader(KubeApi(kube_admin), settings_for(ns)).observe(workload)

    view = asyncio.run(observe())
    e = view.enforcement
    assert (e["chat-0"].memory_mib, e["chat-0"].fraction) == (20480, 0.25)
    assert "KAI hamicore" in e["chat-0"].how
    assert not e["chat-1"].enforced
    assert not e["chat-1"].unknown  # no hamicore env: accounting only
    assert e["chat-2"].unknown  # refers to a ConfigMap that is not there


def test_an_upsize_past_the_enforced_limit_is_evicted_never_patched_in_place(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    workload = set_up(kube_admin, ns, {"chat-0": "20480m", "chat-1": "20480m"})
    finished: list[Actuation] = []

    async def report(_decision: FractionDecision, actuation: Actuation) -> None:
        finished.append(actuation)

    made = decision(
        0.25, 0.38, name="chat", decision_id=f"d-{uuid.uuid4().hex[:8]}", decided_at=utcnow()
    ).model_copy(update={"workload": workload})

    async def run() -> Actuation:
        backend = KubernetesBackend(
            KubeApi(kube_admin), MemoryTargetStore(), settings_for(ns), report, instance="enf"
        )
        await backend.start(utcnow())
        try:
            return await backend.actuate(made, dry_run="", now=utcnow() + timedelta(minutes=10))
        finally:
            backend.close()

    result = asyncio.run(run())
    # 0.38 fits on the GPU (KAI's accounting could take it in place), but the containers are
    # held to 0.25 by HAMi-core: the eviction makes new pods, which the webhook sizes.
    # Evicted: pending until a replacement is bound, and its enforced share not claimed yet.
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
    assert "moves only KAI's accounting" in result.detail
    assert result.enforced_fraction is None, result
    core = client.CoreV1Api(kube_admin)
    pod = kube.read_pod(core, ns, "chat-0")
    assert pod is not None
    assert pod.metadata.annotations["gpu-fraction"] == "0.25"  # never patched
    assert kube.pod_is_evicted(core, ns, "chat-0")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=chat-0").items
    evicted = next(e for e in events if e.reason == "FractionEvictionRequested")
    assert "accounted and enforced 0.38 once recreated" in evicted.message
    assert "enforced 0.25" in evicted.message
