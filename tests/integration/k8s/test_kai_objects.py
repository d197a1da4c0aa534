"""KAI's Queues and BindRequests read from a real kube-apiserver, with KAI's own CRDs applied
(tests/integration/k8s/crds/scheduling.run.ai_*.yaml, vendored from NVIDIA/KAI-scheduler
v0.12.0), and the Kubernetes backend holding an in-place upsize that would take a queue past
its limit. No KAI scheduler runs: the test writes what it would (Queue status, BindRequests).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
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
from fracpilot_libs.kai import KaiSettings
from support import kube
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration

CRD_DIR = Path(__file__).resolve().parent / "crds"
KAI_CRDS = ("scheduling.run.ai_queues.yaml", "scheduling.run.ai_bindrequests.yaml")
QUEUE_LABEL = "kai.scheduler/queue"


@pytest.fixture(scope="module")
def kai_crds(kube_admin: client.ApiClient) -> None:
    install_crds(kube_admin, [yaml.safe_load((CRD_DIR / name).read_text()) for name in KAI_CRDS])


def make_queue(
    api: client.ApiClient, name: str, quota: float, limit: float, allocated: str
) -> None:
    """A Queue and the status KAI's queue controller would write."""
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"resources": {"gpu": {"quota": quota, "limit": limit, "overQuotaWeight": 1}}},
    }
    custom.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", body)
    custom.patch_cluster_custom_object_status(
        "scheduling.run.ai",
        "v2",
        "queues",
        name,
        {"status": {"allocated": {"nvidia.com/gpu": allocated, "cpu": "2"}}},
    )


def settings_for(ns: str, **changes: Any) -> KubeBackendSettings:
    return KubeBackendSettings(
        cluster="test",
        node_selector=f"fracpilot.io/test={ns}",
        inventory_cache=False,
        opt_in=OptInSettings(default_mode="auto"),
        **changes,
    )


def set_up(api: client.ApiClient, ns: str, queue: str) -> tuple[str, str, WorkloadRef]:
    """One GPU node, a reserved GPU group, a Deployment with two KAI pods at 0.25 in ``queue``."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    node = kube.gpu_node(core, f"gpu-{ns}", 2, {"fracpilot.io/test": ns})
    group, gpu = f"g-{ns}", f"GPU-{ns}"
    kube.kai_reservation(core, group, node, gpu)
    owner = kube.deployment(apps, ns, "chat", labels={QUEUE_LABEL: queue})
    for i in range(2):
        kube.running_pod(
            core,
            ns,
            f"chat-{i}",
            node,
            labels={"app": "chat", kube.KAI_GROUP: group, QUEUE_LABEL: queue},
            annotations={"gpu-fraction": "0.25"},
            owner=owner,
        )
    workload = WorkloadRef(cluster="test", namespace=ns, owner_kind="Deployment", owner_name="chat")
    return node, gpu, workload


@pytest.mark.usefixtures("kai_crds")
def test_the_reader_reads_kai_queues_and_counts_a_pod_on_its_bind_requests_node(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    queue = f"team-{ns}"
    make_queue(kube_admin, queue, quota=1, limit=2, allocated="1500m")
    node, gpu, workload = set_up(kube_admin, ns, queue)
    # A third pod KAI has chosen a node and GPU group for, not bound yet: its BindRequest.
    core = client.CoreV1Api(kube_admin)
    core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="late-0", annotations={"gpu-fraction": "0.5"}, labels={"app": "late"}
            ),
            spec=client.V1PodSpec(
                scheduler_name="kai-scheduler",
                containers=[client.V1Container(name="main", image="registry.invalid/x")],
            ),
        ),
    )
    client.CustomObjectsApi(kube_admin).create_namespaced_custom_object(
        "scheduling.run.ai",
        "v1alpha2",
        ns,
        "bindrequests",
        {
            "apiVersion": "scheduling.run.ai/v1alpha2",
            "kind": "BindRequest",
            "metadata": {"name": "late-0"},
            "spec": {
                "podName": "late-0",
                "selectedNode": node,
                "selectedGPUGroups": [f"g-{ns}"],
                "receivedResourceType": "Fraction",
                "receivedGPU": {"count": 1, "portion": "0.50"},
            },
        },
    )

    async def observe() -> Any:
        return await ClusterReader(KubeApi(kube_admin), settings_for(ns)).observe(workload)

    view = asyncio.run(observe())
    assert view.queues is not None
    team = view.queues[queue]
    assert (team.quota, team.limit, team.allocated) == (1.0, 2.0, 1.5)
    late = view.inventory.pods[f"{ns}/late-0"]
    assert (late.node, late.share.gpu_uuid if late.share else None) == (node, gpu)
    assert view.inventory.state.used(gpu) == pytest.approx(1.0)  # 0.25 + 0.25 + 0.5

    # KAI's binder flags moved the reservation pods: the group's GPU is not known then.
    moved = settings_for(ns, kai=KaiSettings(reservation_namespace="elsewhere"))
    elsewhere = asyncio.run(ClusterReader(KubeApi(kube_admin), moved).observe(workload))
    assert {p.gpu_uuid for p in elsewhere.inventory.placements_of(elsewhere.live)} == {
        f"{node}/group/g-{ns}"
    }


@pytest.mark.usefixtures("kai_crds")
def test_an_upsize_past_the_queue_limit_is_recommended_and_the_pods_keep_their_share(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    queue = f"full-{ns}"
    make_queue(kube_admin, queue, quota=1, limit=1, allocated="800m")  # 0.2 GPU left
    _, _, workload = set_up(kube_admin, ns, queue)
    finished: list[Actuation] = []

    async def report(_decision: FractionDecision, actuation: Actuation) -> None:
        finished.append(actuation)

    def grow(new: float) -> FractionDecision:
        made = decision(
            0.25,
            new,
            name="chat",
            decision_id=f"d-{uuid.uuid4().hex[:8]}",
            decided_at=utcnow(),
        )
        return made.model_copy(update={"workload": workload})

    async def run() -> tuple[Actuation, Actuation]:
        backend = KubernetesBackend(
            KubeApi(kube_admin), MemoryTargetStore(), settings_for(ns), report, instance="kai-test"
        )
        await backend.start()
        try:
            now = utcnow() + timedelta(minutes=10)  # past the guardrails' settle time
            held = await backend.actuate(grow(0.5), dry_run="", now=now)  # +0.5 GPU: past it
            fits = await backend.actuate(grow(0.3), dry_run="", now=now)  # +0.1 GPU: fits
            return held, fits
        finally:
            backend.close()

    held, fits = asyncio.run(run())
    assert (held.outcome, held.held_back) == (Outcome.DRY_RUN, "queue_limit")
    assert f"KAI queue {queue}" in held.detail
    assert "past its limit 1" in held.detail
    assert (fits.plan, fits.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), fits.detail
    core = client.CoreV1Api(kube_admin)
    fractions = {
        p.metadata.name: p.metadata.annotations["gpu-fraction"]
        for p in core.list_namespaced_pod(ns).items
    }
    assert fractions == {"chat-0": "0.3", "chat-1": "0.3"}  # never 0.5
