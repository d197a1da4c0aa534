"""The policy sync against a real kube-apiserver and a real nats-server: FractionPolicy objects
become entries of the policy bucket (with the actuator's own RBAC), their statuses say what is
in force, deletion falls back, an invalid object is reported and dead-lettered, and the
decision service decides with the synced policy.

The schema, the CEL rules and the roles: test_fraction_policies.py; the pure plan:
tests/unit/actuator/policy_sync/test_objects_and_plan.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import nats
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from nats.js.errors import KeyNotFoundError
from prometheus_client import CollectorRegistry

from factories import sample, workload
from fracpilot_actuator.policy_sync.controller import PolicySync
from fracpilot_actuator.settings import PolicySyncSettings
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    DeadLetter,
    Direction,
    FractionDecision,
    Policy,
    PolicyLevel,
    PolicyReply,
    PolicyScope,
    ReasonCode,
)
from fracpilot_libs.kube.policy_crd import GROUP, NAMESPACED_PLURAL, VERSION
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import read_stream, reset_nats, running
from k8s_control_plane import REPO_ROOT, ControlPlane, wait_for
from support.policy_crds import condition, create, install_crds, looser_crd, read, table

pytestmark = pytest.mark.integration

MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture(scope="module")
def policy_crds(kube_admin: client.ApiClient) -> None:
    install_crds(kube_admin)


@pytest.fixture
def as_actuator(
    kube: ControlPlane, kube_admin: client.ApiClient, kube_namespace: str
) -> Iterator[client.ApiClient]:
    """A client with the actuator's token and deploy/rbac/actuator.yaml's grants."""
    suffix = kube_namespace
    core, rbac = client.CoreV1Api(kube_admin), client.RbacAuthorizationV1Api(kube_admin)
    text = (REPO_ROOT / "deploy" / "rbac" / "actuator.yaml").read_text()
    for doc in (d for d in yaml.safe_load_all(text) if d):
        kind, meta = doc["kind"], doc["metadata"]
        if kind == "ServiceAccount":
            meta["namespace"] = kube_namespace
            core.create_namespaced_service_account(kube_namespace, doc)
        elif kind == "ClusterRole":
            meta["name"] += f"-{suffix}"
            rbac.create_cluster_role(doc)
        elif kind == "ClusterRoleBinding":
            doc["metadata"]["name"] += f"-{suffix}"
            doc["roleRef"]["name"] += f"-{suffix}"
            doc["subjects"][0]["namespace"] = kube_namespace
            rbac.create_cluster_role_binding(doc)
    with kube.service_account_client(kube_namespace, "fracpilot-actuator") as api:
        custom = client.CustomObjectsApi(api)

        def may_list() -> bool | None:
            try:
                custom.list_cluster_custom_object(GROUP, VERSION, NAMESPACED_PLURAL, limit=1)
            except ApiException:
                return None
            return True

        wait_for(may_list, timeout=10, what="the actuator's bindings")
        yield api


@pytest.fixture
async def sync(
    nats_url: str, as_actuator: client.ApiClient, policy_crds: None
) -> AsyncIterator[PolicySync]:
    await reset_nats(nats_url)
    bus = Bus("actuator", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect()
    await bus.ensure_streams()  # as the actuator's runtime does: the dead letters' stream
    await bus.kv(subjects.POLICY_BUCKET)
    syncer = PolicySync(as_actuator, bus, bus.registry, PolicySyncSettings(resync_s=1.0))
    syncer.start()
    try:
        yield syncer
    finally:
        await syncer.stop()
        await bus.close()


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 15.0) -> Any:
    """The first truthy result of ``check``, tried until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if result := await check():
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{check} not met in {timeout} s")
        await asyncio.sleep(0.1)


async def entry(nats_url: str, key: str) -> Policy | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.POLICY_BUCKET)
        try:
            found = await kv.get(key)
        except KeyNotFoundError:
            return None
        return Policy.model_validate_json(found.value or b"")
    finally:
        await nc.close()


def status_of(api: client.ApiClient, ns: str, name: str, kind: str, value: str) -> Any:
    async def check() -> dict[str, Any] | None:
        obj = await asyncio.to_thread(read, api, ns, name)
        found = condition(obj, kind)
        meta = obj["metadata"]
        current = found.get("observedGeneration") == meta["generation"]
        return obj if found.get("status") == value and current else None

    return check


def patch_spec(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, NAMESPACED_PLURAL, name, {"spec": spec}, _content_type=MERGE_PATCH
    )


def delete(api: client.ApiClient, ns: str, name: str) -> None:
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, ns, NAMESPACED_PLURAL, name
    )


async def test_an_object_is_synced_updated_shadowed_and_deleted(
    nats_url: str, sync: PolicySync, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    scope = PolicyScope(
        level=PolicyLevel.WORKLOAD, namespace=ns, workload="chat", kind="Deployment"
    )
    key = f"kubernetes.{scope.key}"
    # A policy set over NATS at the same scope, before: it stays, under the object's.
    nats_policy = Policy(scope=scope, max_fraction=0.75, revision=3)
    nc = await nats.connect(nats_url)
    await (await nc.jetstream().key_value(subjects.POLICY_BUCKET)).put(
        scope.key, nats_policy.to_json()
    )
    await nc.close()

    target = {"kind": "Deployment", "name": "chat"}
    create(kube_admin, ns, "chat", {"targetRef": target, "maxFraction": 0.5})
    synced = await eventually(lambda: entry(nats_url, key))
    assert (synced.scope, synced.max_fraction, synced.revision) == (scope, 0.5, 1)
    obj = await eventually(status_of(kube_admin, ns, "chat", "Ready", "True"))
    status = obj["status"]
    assert status["inForce"] == "FractionPolicy/chat"
    assert status["scope"] == scope.key
    assert status["policyRevision"] == 1
    assert "over the policy set over NATS" in condition(obj, "Ready")["message"]
    assert condition(obj, "Invalid")["status"] == "False"

    # What `kubectl get fractionpolicies` prints.
    listed = await asyncio.to_thread(table, kube_admin, ns)
    names = [c["name"] for c in listed["columnDefinitions"]]
    assert names == ["Name", "Target", "Mode", "Min", "Max", "In-Force", "Ready", "Age"]
    [row] = listed["rows"]
    expected = ["chat", "Deployment/chat", "auto", 0.1, 0.5, "FractionPolicy/chat", "True"]
    assert row["cells"][:7] == expected

    # An update: the next revision.
    patch_spec(kube_admin, ns, "chat", {"maxFraction": 0.25})
    await eventually(status_of(kube_admin, ns, "chat", "Ready", "True"))
    assert (await entry(nats_url, key)) == Policy(scope=scope, max_fraction=0.25, revision=2)

    # A later object for the same workload is shadowed.
    create(kube_admin, ns, "chat-later", {"targetRef": target, "maxFraction": 0.5})
    later = await eventually(status_of(kube_admin, ns, "chat-later", "Shadowed", "True"))
    assert later["status"]["inForce"] == "FractionPolicy/chat"
    assert condition(later, "Ready")["status"] == "False"
    assert (await entry(nats_url, key)).max_fraction == 0.25  # type: ignore[union-attr]

    # Deleting the winner: the shadowed one takes over; deleting it too: the NATS policy.
    delete(kube_admin, ns, "chat")
    await eventually(status_of(kube_admin, ns, "chat-later", "Ready", "True"))
    assert (await entry(nats_url, key)) == Policy(scope=scope, max_fraction=0.5, revision=3)
    delete(kube_admin, ns, "chat-later")

    async def gone() -> bool:
        return await entry(nats_url, key) is None

    await eventually(gone)
    assert await entry(nats_url, scope.key) == nats_policy  # never touched
    writes = sync.metrics.writes
    assert writes.labels("put")._value.get() >= 3
    assert writes.labels("delete")._value.get() >= 1

    # Settled: further passes (one a second here) write nothing, statuses included.
    before = {op: writes.labels(op)._value.get() for op in ("put", "delete", "status")}
    passes = sync.passes

    async def two_more_passes() -> bool:
        return sync.passes >= passes + 2

    await eventually(two_more_passes)
    assert {op: writes.labels(op)._value.get() for op in before} == before


async def test_an_object_stored_under_an_older_schema_is_reported_invalid(
    nats_url: str, sync: PolicySync, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns, name = kube_namespace, f"old-{uuid.uuid4().hex[:6]}"
    off_grid = {"targetRef": {"name": "etl"}, "minFraction": 0.125}  # hundredths: off the grid

    def stored() -> bool | None:
        try:
            create(kube_admin, ns, name, off_grid)
        except ApiException as exc:
            if exc.status == 422:  # the looser schema is not served yet
                return None
            raise
        return True

    with looser_crd(kube_admin):
        wait_for(stored, timeout=30, what="the looser CRD served")
    obj = await eventually(status_of(kube_admin, ns, name, "Invalid", "True"))
    message = condition(obj, "Invalid")["message"]
    assert "minFraction 0.125 is not on the grid of 1/100" in message
    assert condition(obj, "Ready")["status"] == "False"
    assert obj["status"]["inForce"] == "default"
    assert await entry(nats_url, f"kubernetes.workload.{ns}.etl") is None
    assert sync.metrics.invalid.labels("FractionPolicy")._value.get() == 1

    letters = [
        DeadLetter.model_validate_json(data)
        for _, data in await read_stream(nats_url, subjects.DEADLETTER_STREAM)
    ]
    [letter] = [d for d in letters if d.subject.endswith(f".{ns}.{name}")]
    assert letter.error_kind == "validation"
    assert "minFraction 0.125" in letter.reason
    assert letter.headers["generation"] == "1"

    # Fixed: in force, and reported once only.
    patch_spec(kube_admin, ns, name, {"minFraction": 0.12})
    await eventually(status_of(kube_admin, ns, name, "Ready", "True"))
    assert sync.metrics.invalid.labels("FractionPolicy")._value.get() == 1


async def test_a_statefulset_policy_sizes_the_statefulset_only(
    nats_url: str, sync: PolicySync, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    """targetRef.kind counts: a FractionPolicy for the StatefulSet x leaves the Deployment x of
    the same namespace to the default, in the bucket and in the decision service."""
    ns = kube_namespace
    stateful = workload("x", ns).model_copy(update={"owner_kind": "StatefulSet"})
    deployment = workload("x", ns).model_copy(update={"owner_kind": "Deployment"})
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as service:
        target = {"kind": "StatefulSet", "name": "x"}
        create(kube_admin, ns, "x-statefulset", {"targetRef": target, "maxFraction": 0.25})
        obj = await eventually(status_of(kube_admin, ns, "x-statefulset", "Ready", "True"))
        assert obj["status"]["scope"] == f"workload.{ns}.StatefulSet/x"

        async def sized(max_fraction: float) -> bool:
            return service.policies.for_workload(stateful).max_fraction == max_fraction

        await eventually(lambda: sized(0.25))
        assert service.policies.for_workload(deployment) == service.policies.default
        # `fracpilot policy get` for each workload says the same.
        for ref, expected in ((stateful, 0.25), (deployment, Policy().max_fraction)):
            got = await _policy_request(nats_url, subjects.POLICY_GET, ref.to_json())
            assert got.policy is not None
            assert got.policy.max_fraction == expected, ref.owner_kind

        # The Deployment's own object: not shadowed by the StatefulSet's, each in force.
        target = {"kind": "Deployment", "name": "x"}
        create(kube_admin, ns, "x-deployment", {"targetRef": target, "maxFraction": 0.5})
        other = await eventually(status_of(kube_admin, ns, "x-deployment", "Ready", "True"))
        assert other["status"]["inForce"] == "FractionPolicy/x-deployment"
        assert condition(other, "Shadowed")["status"] == "False"

        async def deployment_sized() -> bool:
            return service.policies.for_workload(deployment).max_fraction == 0.5

        await eventually(deployment_sized)
        assert service.policies.for_workload(stateful).max_fraction == 0.25


async def _policy_request(url: str, subject: str, payload: bytes) -> PolicyReply:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(subject, payload, timeout=5)
    finally:
        await nc.close()
    return PolicyReply.model_validate_json(msg.data)


async def test_the_decision_follows_the_object_and_falls_back_to_the_nats_policy(
    nats_url: str, sync: PolicySync, kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    chat = workload("chat", ns)
    scope = PolicyScope(level=PolicyLevel.WORKLOAD, namespace=ns, workload="chat")
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as service:
        # The NATS messages keep working: a policy set over NATS ...
        reply = await _policy_request(
            nats_url, subjects.POLICY_SET, Policy(scope=scope, max_fraction=0.75).to_json()
        )
        assert reply.ok, reply.error
        # ... and an object for the same workload, which wins.
        create(kube_admin, ns, "chat", {"targetRef": {"name": "chat"}, "maxFraction": 0.15})

        async def deciding_with(max_fraction: float) -> bool:
            return service.policies.for_workload(chat).max_fraction == max_fraction

        await eventually(lambda: deciding_with(0.15))
        got = await _policy_request(nats_url, subjects.POLICY_GET, scope.to_json())
        assert got.policy is not None
        assert got.policy.max_fraction == 0.15  # `fracpilot policy get` shows the one in force

        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        subject = subjects.usage_subject(chat)

        async def decide(minute: int) -> FractionDecision:
            seen = len(await read_stream(nats_url, subjects.DECISION_STREAM))
            usage = sample(compute=0.1, memory_share=0.1, allocated=1.0, minute=minute)
            await js.publish(subject, usage.model_copy(update={"workload": chat}).to_json())

            async def new_decision() -> FractionDecision | None:
                msgs = await read_stream(nats_url, subjects.DECISION_STREAM)
                if len(msgs) <= seen:
                    return None
                return FractionDecision.model_validate_json(msgs[-1][1])

            decision: FractionDecision = await eventually(new_decision)
            return decision

        first = await decide(0)
        assert first.reason is ReasonCode.POLICY_BOUNDS
        assert first.direction is Direction.DOWN
        assert first.new_fraction == 0.15  # the usage needs more: the object's bound holds
        assert first.policy_revision == 1

        # Deleted: the policy set over NATS is in force again, and the decisions follow it.
        delete(kube_admin, ns, "chat")
        await eventually(lambda: deciding_with(0.75))
        second = await decide(1)
        await nc.close()
        assert second.reason is ReasonCode.POLICY_BOUNDS
        assert 0.15 < second.new_fraction <= 0.75  # sized by the need, within 0.75
