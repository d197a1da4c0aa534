"""KAI's Queues and BindRequests read from a real kube-apiserver, with KAI's own CRDs applied
(tests/integration/k8s/crds/scheduling.run.ai_*.yaml, vendored from NVIDIA/KAI-scheduler
v0.12.0), and the Kubernetes backend holding an in-place upsize that would take a queue past
its limit. No KAI scheduler runs: the test writes what it would (Queue status, BindRequests).
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
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind, utcnow
from fracpilot_libs.kai import KaiSettings
from support import kai_objects

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kai_crds(kube_admin: client.ApiClient) -> None:
    kai_objects.install_kai_crds(kube_admin)


def settings_for(ns: str, **changes: Any) -> KubeBackendSettings:
    return KubeBackendSettings(
        cluster="test",
        node_selector=f"fracpilot.io/test={ns}",
        inventory_cache=False,
        opt_in=OptInSettings(default_mode="auto"),
        **changes,
    )


@pytest.mark.usefixtures("kai_crds")
def test_the_reader_reads_kai_queues_and_counts_a_pod_on_its_bind_requests_node(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    queue = f"team-{ns}"
    kai_objects.queue(
        kube_admin, queue, quota=1, limit=2, allocated={"nvidia.com/gpu": "1500m", "cpu": "2"}
    )
    node, gpu, workload = kai_objects.chat_sharing_a_gpu(kube_admin, ns, queue)
    # A third pod KAI has chosen a node and GPU group for, not bound yet: its BindRequest.
    kai_objects.pending_pod(client.CoreV1Api(kube_admin), ns, "late-0", labels={"app": "late"})
    kai_objects.bind_request(kube_admin, ns, "late-0", node, f"g-{ns}")

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
    kai_objects.queue(  # 0.2 GPU left
        kube_admin, queue, quota=1, limit=1, allocated={"nvidia.com/gpu": "800m", "cpu": "2"}
    )
    _, _, workload = kai_objects.chat_sharing_a_gpu(kube_admin, ns, queue)
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
        await backend.start(utcnow())
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
