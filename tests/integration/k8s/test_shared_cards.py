"""Shared isolation on a real kube-apiserver and a real NATS: one decision re-divides a GPU's
two KAI gpu-fraction pods in place, and the Events on both pods say why.

No KAI, scheduler or kubelet run (as in test_kube_backend.py): the test writes the
reservation pod, the Deployments' ReplicaSets and the pods bound and Running. The pods carry
no HAMi-core limit, so the actuator detects that their memory is not enforced (shared).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats
import pytest
from kubernetes import client

from factories import decision
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import Fence
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.kube.shared_cards import REDIVISION, patch_share
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    CardForecast,
    FractionDecision,
    GpuSharing,
    Outcome,
    PeakProfile,
    PlanKind,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running
from support import kube

pytestmark = pytest.mark.integration


def settings_for(nats_url: str, namespace: str, selector: str) -> ActuatorSettings:
    return ActuatorSettings(
        nats={"url": nats_url},
        backend="kubernetes",
        cluster="test",
        gpu_node_selector=selector,
        allow_single_replica=True,
        namespace=namespace,
    )


def decide(
    namespace: str, name: str, current: float, new: float, forecast: CardForecast
) -> FractionDecision:
    return decision(
        current=current,
        new=new,
        name=name,
        workload=WorkloadRef(cluster="test", namespace=namespace, owner_name=name),
        decision_id=f"d-{uuid.uuid4().hex[:12]}",
        decided_at=utcnow(),
        pod=f"{name}-0",
        explanation=f"test: {name} {current:g} -> {new:g}",
        forecast=forecast,
    )


async def apply(nats_url: str, made: FractionDecision) -> ActuationResult:
    nc = await nats.connect(nats_url)
    await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
    await nc.close()
    deadline = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < deadline:
        for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM):
            result = ActuationResult.model_validate_json(data)
            if result.decision_id == made.decision_id:
                return result
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no result for {made.decision_id}")


def annotation(core: client.CoreV1Api, namespace: str, pod: str, key: str) -> Any:
    read = kube.read_pod(core, namespace, pod)
    assert read is not None
    return read.metadata.annotations.get(key)


def events(core: client.CoreV1Api, namespace: str, pod: str) -> dict[str, client.CoreV1Event]:
    listed = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return {e.reason: e for e in listed.items}


def two_kai_pods(kube_admin: client.ApiClient, ns: str) -> None:
    """chat-0 at 0.3 and embed-0 at 0.6 of one GPU, in an opted-in namespace."""
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    kube.label_namespace(core, ns, {"fracpilot.io/mode": "auto"})
    node = kube.gpu_node(core, f"gpu-{ns}", 1, {"fracpilot.io/test": ns})
    gpu = f"GPU-{uuid.uuid4()}"
    group = f"g1-{ns}"
    kube.kai_reservation(core, group, node, gpu)
    for name, fraction in (("chat", "0.3"), ("embed", "0.6")):
        owner = kube.deployment(apps, ns, name)
        kube.running_pod(
            core,
            ns,
            f"{name}-0",
            node,
            labels={"app": name, kube.KAI_GROUP: group},
            annotations={"gpu-fraction": fraction},
            owner=owner,
        )


async def test_one_decision_redivides_two_kai_pods_on_one_gpu_in_place_and_says_why(
    nats_url: str, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    core = client.CoreV1Api(kube_admin)
    two_kai_pods(kube_admin, ns)
    await reset_nats(nats_url)
    service = ActuatorService(
        settings_for(nats_url, ns, f"fracpilot.io/test={ns}"), kube_api=kube_admin
    )
    async with running(service):
        # embed's own decision: its card holds it at 0.6 already (its need 0.55 + the
        # pooled floor beside chat's fixed 0.3): nothing changes, its forecast is known.
        embed = CardForecast(memory_peak=0.55, memory_jump=0.1, compute=0.2)
        first = await apply(nats_url, decide(ns, "embed", 0.6, 0.65, embed))
        assert first.outcome is Outcome.SKIPPED, first.detail
        assert "isolation shared (detected: memory not enforced" in first.detail
        # chat asks for 0.45: per pod it would not fit beside embed's 0.6 (a recreate); the
        # card holds both with one pooled headroom (0.5 x the largest jump 0.2 = 0.1).
        chat = CardForecast(memory_peak=0.3, memory_jump=0.2, compute=0.2)
        made = decide(ns, "chat", 0.3, 0.45, chat)
        result = await apply(nats_url, made)

    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result.detail
    assert (result.fraction_before, result.fraction_after) == (0.3, 0.36)
    assert f"co-tenant {ns}/embed-0 re-divided in place 0.6 -> 0.58" in result.detail
    assert "isolation shared (detected" in result.detail
    assert annotation(core, ns, "chat-0", "gpu-fraction") == "0.36"
    assert annotation(core, ns, "embed-0", "gpu-fraction") == "0.58"
    assert annotation(core, ns, "embed-0", "fracpilot.io/decision-id") == made.decision_id
    assert 0.36 + 0.58 <= 1.0
    why = events(core, ns, "embed-0")["FractionRedivided"]
    assert why.type == "Normal"
    assert "GPU share 0.6 -> 0.58" in why.message
    assert f"{ns}/chat's decision {made.decision_id}" in why.message
    assert "shared isolation" in why.message
    assert "FractionResized" in events(core, ns, "chat-0")


async def test_with_peak_profiles_two_pods_whose_peaks_never_coincide_share_one_card(
    nats_url: str, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    core = client.CoreV1Api(kube_admin)
    two_kai_pods(kube_admin, ns)
    await reset_nats(nats_url)
    hour = int(utcnow().timestamp() // 3600)

    def profile(*peaks: tuple[int, float]) -> PeakProfile:
        return PeakProfile(
            period_s=3600.0,
            first=hour - 24,
            last=hour,
            peaks=tuple((hour - k, v) for k, v in peaks),
        )

    service = ActuatorService(
        settings_for(nats_url, ns, f"fracpilot.io/test={ns}"), kube_api=kube_admin
    )
    async with running(service):
        # embed peaks at night (0.55), chat by day (0.5): summed, 0.5 + 0.55 + the pooled
        # headroom would not fit one card; their joint peak is 0.6
        embed = CardForecast(
            memory_peak=0.55, memory_jump=0.1, compute=0.2, profile=profile((20, 0.55), (8, 0.1))
        )
        first = await apply(nats_url, decide(ns, "embed", 0.6, 0.65, embed))
        assert first.outcome is Outcome.SKIPPED, first.detail  # 0.55 + the floor: as it is
        chat = CardForecast(
            memory_peak=0.5, memory_jump=0.2, compute=0.2, profile=profile((20, 0.05), (8, 0.5))
        )
        made = decide(ns, "chat", 0.3, 0.45, chat)
        result = await apply(nats_url, made)

    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result.detail
    # the card's budget: joint peak 0.6 + one pooled headroom 0.5 x 0.2 = 0.7, by need (50:55)
    assert "peaks pooled over 2 peak profiles: joint peak 0.6 where summed 1.05" in result.detail
    assert (result.fraction_before, result.fraction_after) == (0.3, 0.33)
    assert f"co-tenant {ns}/embed-0 re-divided in place 0.6 -> 0.36" in result.detail
    assert annotation(core, ns, "chat-0", "gpu-fraction") == "0.33"
    assert annotation(core, ns, "embed-0", "gpu-fraction") == "0.36"


@pytest.mark.parametrize(
    ("purpose", "says"),
    [
        (REDIVISION, "co-tenant re-division of"),
        ("consolidation shrink", "consolidation shrink of"),
        ("", "in-place GPU share change (consolidation: room for chat-0) of"),
    ],
)
async def test_a_share_patch_that_fails_says_what_it_was_for(
    kube_admin: client.ApiClient, kube_namespace: str, purpose: str, says: str
) -> None:
    """The patch is conditional on the pod as read: a stale resourceVersion gets the API
    server's 409, and the error and the Warning Event name the change's purpose (a
    consolidation shrink is no co-tenant re-division)."""
    ns = kube_namespace
    core = client.CoreV1Api(kube_admin)
    kube.running_pod(
        core, ns, "big-0", "n1", labels={"app": "big"}, annotations={"gpu-fraction": "0.8"}
    )
    raw = kube_admin.sanitize_for_serialization(core.read_namespaced_pod("big-0", ns))
    meta = raw["metadata"]
    pod = PodInfo(
        namespace=ns,
        name="big-0",
        uid=meta["uid"],
        node="n1",
        phase="Running",
        terminating=False,
        created_at=None,
        labels=meta["labels"],
        annotations=meta["annotations"],
        controller=None,
        backend=GpuSharing.KAI,
        share=None,
        whole_gpus=0,
        resource_version=str(int(meta["resourceVersion"]) - 1),  # read before a change
        raw=raw,
    )
    api = KubeApi(kube_admin, timeout_s=10.0)
    fences: list[Fence] = []
    executor = StepExecutor(api, KubeBackendSettings(), "test", fences.append, caching=False)
    error = await patch_share(
        executor,
        fences.append,
        pod,
        0.8,
        0.5,
        "consolidation: room for chat-0",
        now=utcnow(),
        purpose=purpose,
    )
    assert error is not None
    assert error.startswith(f"{says} {ns}/big-0 to gpu-fraction=0.5 failed: refused (409)")
    if purpose != REDIVISION:
        assert "re-divi" not in error
    failed = events(core, ns, "big-0")["FractionRedivideFailed"]
    assert (failed.type, failed.message) == ("Warning", error)
    assert annotation(core, ns, "big-0", "gpu-fraction") == "0.8"  # not changed
