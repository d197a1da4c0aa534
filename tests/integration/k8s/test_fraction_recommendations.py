"""FractionRecommendation objects against a real kube-apiserver and NATS: the actuator (in-process,
backend=kubernetes, the chart's recommend-only defaults, the ServiceAccount token of
deploy/rbac/actuator.yaml and actuator-recommendations.yaml) writes each workload's last
decision into an object of its own in the workload's namespace, owned by the workload, once
the namespace opted in (labelled ``fracpilot.io/mode=recommend``: a fresh install writes
nothing in a team's namespace); the user's Deployment is not touched (GitOps: no drift);
``kubectl get fractionrecommendations`` (the API's Table) prints the printer columns. Where
the CRD is not installed (a control plane of its own) the writer stops after one warning and
asks again after its re-check interval.

The garbage collection through the ownerReference: test_fraction_recommendations_gc.py (it
runs kube-controller-manager's garbage collector on a control plane of its own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.policy_sync.recommendations import RecommendationWriter
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    CardForecast,
    FractionDecision,
    Outcome,
    PlanKind,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.kube.policy_crd import GROUP, VERSION
from fracpilot_libs.kube.recommendation_crd import PLURAL
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running, wait_for
from k8s_control_plane import REPO_ROOT, ControlPlane
from support import kube as objects
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def crds(kube_admin: client.ApiClient) -> None:
    install_crds(kube_admin)  # every CRD of deploy/crds/, FractionRecommendation with them


@pytest.fixture
def as_actuator(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str
) -> Iterator[client.ApiClient]:
    """deploy/rbac/actuator.yaml and actuator-recommendations.yaml applied as the chart applies
    them with the default scope (their namespace: the test's; the ClusterRoles renamed per
    test), and a client with the ServiceAccount's token."""
    ns = kube_namespace
    core, rbac = client.CoreV1Api(kube_admin), client.RbacAuthorizationV1Api(kube_admin)
    files = ("actuator.yaml", "actuator-recommendations.yaml")
    text = "\n---\n".join((REPO_ROOT / "deploy" / "rbac" / f).read_text() for f in files)
    text = text.replace("namespace: fracpilot", f"namespace: {ns}")
    for doc in (d for d in yaml.safe_load_all(text) if d):
        kind = doc["kind"]
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(ns, doc)
        elif kind == "ClusterRole":
            doc["metadata"]["name"] += f"-{ns}"
            rbac.create_cluster_role(doc)
        elif kind == "ClusterRoleBinding":
            doc["metadata"]["name"] += f"-{ns}"
            doc["roleRef"]["name"] += f"-{ns}"
            rbac.create_cluster_role_binding(doc)
        elif kind == "Role":
            rbac.create_namespaced_role(ns, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(ns, doc)
    with kube.service_account_client(ns, "fracpilot-actuator") as api:
        yield api


@pytest.fixture
def cluster(kube_admin: client.ApiClient, kube_namespace: str) -> dict[str, Any]:
    """A GPU node, KAI's reservation of its GPU, Deployment chat with two pods at 0.5."""
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    ns = kube_namespace
    node = objects.gpu_node(core, f"gpu-{ns}", 1, {"fracpilot.io/test": ns})
    group = f"g1-{ns}"
    objects.kai_reservation(core, group, node, f"GPU-{uuid.uuid4()}")
    # Argo CD's tracking label on the Deployment, as Argo CD would sync it from Git.
    owner = objects.deployment(apps, ns, "chat", labels={"app.kubernetes.io/instance": "chat-app"})
    for i in range(2):
        objects.running_pod(
            core,
            ns,
            f"chat-{i}",
            node,
            labels={"app": "chat", objects.KAI_GROUP: group},
            annotations={"gpu-fraction": "0.5"},
            owner=owner,
        )
    return {"ns": ns, "selector": f"fracpilot.io/test={ns}"}


def settings(nats_url: str, cluster: dict[str, Any], **extra: Any) -> ActuatorSettings:
    """The chart's defaults for the opt-in rule: recommend, nothing applied; recommendations
    written for the opted-in namespaces only."""
    return ActuatorSettings(
        nats={"url": nats_url},
        backend="kubernetes",
        cluster="test",
        gpu_node_selector=cluster["selector"],
        namespace=cluster["ns"],
        optin={"default_mode": "recommend"},
        **extra,
    )


async def label(service: ActuatorService, kube_admin: client.ApiClient, ns: str, mode: str) -> None:
    """``kubectl label namespace <ns> fracpilot.io/mode=<mode>``, seen by the actuator's watch."""
    objects.label_namespace(client.CoreV1Api(kube_admin), ns, {"fracpilot.io/mode": mode})
    namespaces = service.namespaces
    assert namespaces is not None
    await wait_for(lambda: (namespaces.cached(ns) or {}).get("fracpilot.io/mode") == mode)


def decide(ns: str, name: str, current: float, new: float, **extra: Any) -> FractionDecision:
    return decision(
        current=current,
        new=new,
        name=name,
        workload=WorkloadRef(cluster="test", namespace=ns, owner_name=name),
        decision_id=f"d-{uuid.uuid4().hex[:12]}",
        decided_at=utcnow(),
        pod=f"{name}-0",
        **extra,
    )


async def answer(nats_url: str, made: FractionDecision) -> ActuationResult:
    nc = await nats.connect(nats_url)
    await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
    await nc.close()
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM):
            result = ActuationResult.model_validate_json(data)
            if result.decision_id == made.decision_id:
                return result
        assert asyncio.get_running_loop().time() < deadline, "no result"
        await asyncio.sleep(0.1)


def read(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        got = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(got)  # type: ignore[arg-type]


def table(api: client.ApiClient, path: str) -> dict[str, Any]:
    """What ``kubectl get`` asks for: the list as a meta.k8s.io Table."""
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io"
    method, url, headers, body, _ = api.param_serialize(
        "GET", path, header_params={"Accept": accept}, auth_settings=["BearerToken"]
    )
    response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=10)
    response.read()
    return dict(json.loads(response.data))


async def written(service: ActuatorService) -> None:
    writer = service.recommendations
    assert writer is not None, "the actuator runs no FractionRecommendation writer"
    await asyncio.sleep(0)  # the result was published before the writer was offered it
    assert await writer.drained(10.0)


async def test_recommend_only_decisions_become_fraction_recommendations(
    nats_url: str,
    kube_admin: client.ApiClient,
    as_actuator: client.ApiClient,
    crds: None,
    cluster: dict[str, Any],
) -> None:
    ns = cluster["ns"]
    apps = client.AppsV1Api(kube_admin)
    before = apps.read_namespaced_deployment("chat", ns)
    await reset_nats(nats_url)
    service = ActuatorService(settings(nats_url, cluster), kube_api=as_actuator)
    async with running(service):
        await label(service, kube_admin, ns, "recommend")  # the team asks for them
        forecast = CardForecast(memory_peak=0.12, memory_jump=0.02, compute=0.18)
        first = await answer(nats_url, decide(ns, "chat", 0.5, 0.25, forecast=forecast))
        # Recommend-only: nothing applied, the recommendation written all the same.
        assert first.outcome is Outcome.DRY_RUN, first.detail
        await written(service)
        obj = read(kube_admin, ns, "deployment-chat")
        assert obj is not None, "no FractionRecommendation for Deployment chat"
        status = obj["status"]
        assert {k: status[k] for k in ("target", "currentFraction", "recommendedFraction")} == {
            "target": "Deployment/chat",
            "currentFraction": 0.5,
            "recommendedFraction": 0.25,
        }
        assert status["wouldSave"] == 0.25
        assert (status["memoryPeak"], status["computePeak"]) == (0.12, 0.18)
        assert status["memoryNeedMiB"] == int(0.25 * 80 * 1024) // 2
        assert (status["mode"], status["isolation"], status["reason"]) == (
            "auto",
            "auto",
            "underused",
        )
        assert (status["outcome"], status["heldBack"]) == ("dry_run", "not_opted_in")
        assert status["decisionId"] == first.decision_id
        assert status["decisionTime"].endswith("Z")
        assert obj["spec"]["targetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "chat",
        }
        # Owned by the workload (the garbage collector deletes it with it), not controlled.
        [ref] = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "chat",
            "uid": before.metadata.uid,
        }
        # Argo CD's tracking label is not copied: no Application counts it as its own.
        assert "app.kubernetes.io/instance" not in obj["metadata"]["labels"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fracpilot-actuator"

        # The next decision replaces the status; what it does not say is cleared.
        second = await answer(nats_url, decide(ns, "chat", 0.5, 0.375))
        await written(service)
        status = (read(kube_admin, ns, "deployment-chat") or {})["status"]
        assert (status["recommendedFraction"], status["wouldSave"]) == (0.375, 0.125)
        assert status["decisionId"] == second.decision_id
        assert "memoryPeak" not in status
        assert "computePeak" not in status

        # A workload that is not there gets no object.
        await answer(nats_url, decide(ns, "ghost", 0.5, 0.25))
        await written(service)
        assert read(kube_admin, ns, "deployment-ghost") is None
        writes = service.runtime.registry.get_sample_value
        assert writes("fracpilot_recommendation_writes_total", {"result": "created"}) == 1
        assert writes("fracpilot_recommendation_writes_total", {"result": "status"}) == 1
        assert writes("fracpilot_recommendation_writes_total", {"result": "gone"}) == 1

    # GitOps: the user's Deployment was not written to (no annotation, no label: no drift).
    after = apps.read_namespaced_deployment("chat", ns)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.metadata.annotations == before.metadata.annotations

    # kubectl get fractionrecommendations -A: the printer columns, as the API prints them.
    got = table(kube_admin, f"/apis/{GROUP}/{VERSION}/{PLURAL}")
    names = [c["name"] for c in got["columnDefinitions"] if c["priority"] == 0]
    assert names == [
        *("Name", "Target", "Current", "Recommended", "Would-Save", "Memory-Peak"),
        *("Compute-Peak", "Mode", "Outcome", "Decided"),
    ]
    [row] = [r for r in got["rows"] if r["object"]["metadata"]["namespace"] == ns]
    cells = dict(zip([c["name"] for c in got["columnDefinitions"]], row["cells"], strict=True))
    assert {k: cells[k] for k in ("Name", "Target", "Current", "Recommended", "Would-Save")} == {
        "Name": "deployment-chat",
        "Target": "Deployment/chat",
        "Current": 0.5,
        "Recommended": 0.375,
        "Would-Save": 0.125,
    }
    assert (cells["Mode"], cells["Outcome"], cells["Held-Back"]) == (
        "auto",
        "dry_run",
        "not_opted_in",
    )


def writes_of(service: ActuatorService, result: str) -> float:
    got = service.runtime.registry.get_sample_value(
        "fracpilot_recommendation_writes_total", {"result": result}
    )
    return got or 0.0


async def test_nothing_is_written_in_a_namespace_until_it_opts_in(
    nats_url: str,
    kube_admin: client.ApiClient,
    as_actuator: client.ApiClient,
    crds: None,
    cluster: dict[str, Any],
) -> None:
    """The default scope: a fresh install creates no object in a team's namespace; labelling
    it recommend (nothing else changes: recommend is the default mode) writes the next one;
    labelling it off stops the writes."""
    ns = cluster["ns"]
    await reset_nats(nats_url)
    service = ActuatorService(settings(nats_url, cluster), kube_api=as_actuator)
    async with running(service):
        first = await answer(nats_url, decide(ns, "chat", 0.5, 0.25))  # once it leads
        assert first.outcome is Outcome.DRY_RUN, first.detail
        assert service.recommendations is not None
        assert service.recommendations.scope == "opted-in"
        await written(service)
        assert read(kube_admin, ns, "deployment-chat") is None
        assert writes_of(service, "not_opted_in") == 1
        assert writes_of(service, "created") == 0

        await label(service, kube_admin, ns, "recommend")
        second = await answer(nats_url, decide(ns, "chat", 0.5, 0.375))
        await written(service)
        obj = read(kube_admin, ns, "deployment-chat")
        assert obj is not None, "no FractionRecommendation once the namespace opted in"
        assert obj["status"]["decisionId"] == second.decision_id

        await label(service, kube_admin, ns, "off")
        third = await answer(nats_url, decide(ns, "chat", 0.5, 0.25))
        assert third.outcome is Outcome.SKIPPED, third.detail
        await written(service)
        kept = (read(kube_admin, ns, "deployment-chat") or {})["status"]
        assert kept["decisionId"] == second.decision_id  # off: not written to any more
        assert writes_of(service, "not_opted_in") == 2


async def test_scope_all_writes_in_every_namespace_and_off_writes_none(
    nats_url: str,
    kube_admin: client.ApiClient,
    as_actuator: client.ApiClient,
    crds: None,
    cluster: dict[str, Any],
) -> None:
    ns = cluster["ns"]
    await reset_nats(nats_url)
    everywhere = settings(nats_url, cluster, policysync={"recommendations": "all"})
    service = ActuatorService(everywhere, kube_api=as_actuator)
    async with running(service):
        await answer(nats_url, decide(ns, "chat", 0.5, 0.25))
        await written(service)
        assert read(kube_admin, ns, "deployment-chat") is not None  # no label needed
    await reset_nats(nats_url)
    none = settings(nats_url, cluster, policysync={"recommendations": "off"})
    service = ActuatorService(none, kube_api=as_actuator)
    async with running(service):
        await answer(nats_url, decide(ns, "chat", 0.5, 0.375))  # it leads and acts
        assert service.recommendations is None  # no writer at all


async def test_without_the_crd_the_writer_warns_once_stops_and_asks_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A control plane of its own, without the FractionRecommendation CRD (the session's has
    every CRD). The resource answers 404: one warning, the results counted not_served and not
    written, the API not asked again before the re-check; once the CRD is installed and the
    re-check is due, the next result is written."""
    with ControlPlane() as plane, plane.admin_client() as admin:
        core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
        objects.ensure_namespace(core, "team-a")
        objects.label_namespace(core, "team-a", {"fracpilot.io/mode": "recommend"})
        objects.deployment(apps, "team-a", "chat")
        now = [1000.0]
        registry = CollectorRegistry()

        async def labels_of(namespace: str) -> dict[str, Any]:
            got = core.read_namespace(namespace).metadata.labels
            return dict(got or {})

        writer = RecommendationWriter(
            KubeApi(admin),
            registry,
            10.0,
            namespace_labels=labels_of,
            recheck_s=600.0,
            clock=lambda: now[0],
        )
        held = Actuation(PlanKind.IN_PLACE, Outcome.DRY_RUN, "recommend", held_back="policy")

        def offer(new: float) -> None:
            writer.offer(decide("team-a", "chat", 0.5, new), held)

        def count(result: str) -> float:
            got = registry.get_sample_value(
                "fracpilot_recommendation_writes_total", {"result": result}
            )
            return got or 0.0

        writer.start()
        try:
            with caplog.at_level(logging.WARNING):
                offer(0.25)
                assert await writer.drained(10.0)
                assert count("not_served") == 1
                assert not writer.writing
                for new in (0.3, 0.35, 0.4):  # not even queued: no call, counted
                    offer(new)
                    assert await writer.drained(1.0)
                assert count("not_served") == 4
                now[0] += 601.0  # the re-check is due: asked once more, still 404
                offer(0.45)
                assert await writer.drained(10.0)
                assert count("not_served") == 5
                warned = [r for r in caplog.records if "not written" in r.getMessage()]
                assert len(warned) == 1, [r.getMessage() for r in warned]
                assert "is the FractionRecommendation CRD installed" in warned[0].error

            install_crds(admin)
            offer(0.125)  # installed, but the re-check is not due yet
            assert await writer.drained(1.0)
            assert read(admin, "team-a", "deployment-chat") is None
            now[0] += 601.0
            offer(0.375)
            assert await writer.drained(10.0)
            assert writer.writing
            obj = read(admin, "team-a", "deployment-chat")
            assert obj is not None
            assert obj["status"]["recommendedFraction"] == 0.375
            assert count("created") == 1
            assert count("error") == 0
        finally:
            await writer.stop()
