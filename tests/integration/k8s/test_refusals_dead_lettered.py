"""Issue 26: every API refusal is a FAILED result with the server's reason; a decision the API
server refuses for good is dead-lettered and counted, and never delivered again. A refusal
that may pass (a PodDisruptionBudget's 429) is a FAILED result and nothing more.

The actuator service (backend=kubernetes) runs in-process against a real kube-apiserver and a
real nats-server. The refusal is the API server's own: a ValidatingAdmissionPolicy (CEL, in
the API server, no webhook to run) that denies any change of a pod's ``gpu-fraction``, as an
admission that refuses the in-place patch would (KAI's validating webhook refuses some). As in
test_kube_backend.py, the test writes what controllers would (nodes, a Deployment's pods bound
and Running, PDB status).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from factories import decision
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    DeadLetter,
    FractionDecision,
    Outcome,
    PlanKind,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from helpers import counter, read_stream, reset_nats, running, wait_for
from support import kube

pytestmark = pytest.mark.integration

RETRY_DELAY_S = 1.0  # the actuator consumer's: a message nak'ed would come back after this
POLICY_MESSAGE = "gpu-fraction of a running pod may not change (test admission policy)"


@pytest.fixture
def ns(kube_admin: client.ApiClient, kube_namespace: str) -> str:
    """The test's namespace, opted in to automatic resizing."""
    kube.label_namespace(
        client.CoreV1Api(kube_admin), kube_namespace, {"fracpilot.io/mode": "auto"}
    )
    return kube_namespace


@pytest.fixture
def refusing_policy(kube_admin: client.ApiClient, ns: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy, bound to the test's namespace only, that refuses (422)
    an update of a pod changing its ``gpu-fraction``; in force once a dry-run patch is refused."""
    admission = client.AdmissionregistrationV1Api(kube_admin)
    name = f"no-fraction-change-{ns}"
    changed = (
        "object.metadata.?annotations[?'gpu-fraction'].orValue('') == "
        "oldObject.metadata.?annotations[?'gpu-fraction'].orValue('')"
    )
    admission.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [{"expression": changed, "message": POLICY_MESSAGE}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
            },
        }
    )
    try:
        yield
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


async def wait_until_refused(core: client.CoreV1Api, ns: str, pod: str) -> ApiException:
    """The policy's refusal of a dry-run change of the pod's share (policies load in the
    background: until then the dry run passes)."""
    patch = {"metadata": {"annotations": {"gpu-fraction": "0.99"}}}
    for _ in range(200):
        try:
            core.patch_namespaced_pod(pod, ns, patch, dry_run="All")
        except ApiException as exc:
            return exc
        await asyncio.sleep(0.1)
    raise TimeoutError("the admission policy never took effect")


def settings_for(nats_url: str, ns: str) -> ActuatorSettings:
    return ActuatorSettings(
        nats={"url": nats_url},
        backend="kubernetes",
        cluster="test",
        gpu_node_selector=f"fracpilot.io/test={ns}",
        allow_single_replica=True,
        eviction={"attempts": 3, "backoff_s": 0.05, "backoff_max_s": 0.1},
        capacity={"poll_s": 0.2, "timeout_s": 60, "autoscaler_max_node_provision_s": 0.1},
        namespace=ns,  # the Lease lives in the test's namespace
    )


@contextlib.asynccontextmanager
async def actuator(
    nats_url: str, kube_admin: client.ApiClient, ns: str
) -> AsyncIterator[ActuatorService]:
    await reset_nats(nats_url)
    service = ActuatorService(settings_for(nats_url, ns), kube_api=kube_admin)
    async with running(service):
        yield service


def gpu_node(core: client.CoreV1Api, ns: str, name: str) -> str:
    return kube.gpu_node(core, f"{name}-{ns}", 1, {"fracpilot.io/test": ns})


def kai_chats(kube_admin: client.ApiClient, ns: str, node: str, fraction: str) -> None:
    """Deployment chat, its pods chat-0 and chat-1 sharing a GPU of ``node`` at ``fraction``."""
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    owner = kube.deployment(apps, ns, "chat", template=kube.pod_template("chat", None))
    kube.kai_reservation(core, f"g1-{ns}", node, f"GPU-{uuid.uuid4()}")
    for name in ("chat-0", "chat-1"):
        kube.running_pod(
            core,
            ns,
            name,
            node,
            labels={"app": "chat", kube.KAI_GROUP: f"g1-{ns}"},
            annotations={"gpu-fraction": fraction},
            owner=owner,
        )


def decide(ns: str, current: float, new: float) -> FractionDecision:
    made: FractionDecision = decision(
        current=current,
        new=new,
        name="chat",
        workload=WorkloadRef(cluster="test", namespace=ns, owner_name="chat"),
        decision_id=f"d-{uuid.uuid4().hex[:12]}",
        decided_at=utcnow(),
        pod="chat-0",
        explanation=f"test: chat {current:g} -> {new:g}",
    )
    return made


async def publish(nats_url: str, made: FractionDecision) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
    finally:
        await nc.close()


async def results_of(nats_url: str, made: FractionDecision) -> list[ActuationResult]:
    found = [
        ActuationResult.model_validate_json(data)
        for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM)
    ]
    return [r for r in found if r.decision_id == made.decision_id]


async def dead_letters(nats_url: str) -> list[DeadLetter]:
    letters = await read_stream(
        nats_url, subjects.DEADLETTER_STREAM, subjects.deadletter_subject("actuator")
    )
    return [DeadLetter.model_validate_json(data) for _, data in letters]


async def deliveries(nats_url: str) -> tuple[int, int, int]:
    """The actuator's decision consumer: (messages delivered, redeliveries of any of them
    pending, messages awaiting an ack), every delivery counted."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(
            subjects.DECISION_STREAM, subjects.ACTUATOR_CONSUMER
        )
    finally:
        await nc.close()
    return info.delivered.consumer_seq or 0, info.num_redelivered or 0, info.num_ack_pending or 0


async def claim_of(nats_url: str, made: FractionDecision) -> str:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.ACTUATOR_STATE_BUCKET)
        entry = await kv.get(f"decision.{made.decision_id}")
        return (entry.value or b"").decode()
    finally:
        await nc.close()


def dead_lettered_decisions(service: ActuatorService) -> float:
    return counter(
        service.runtime.registry,
        "fracpilot_dead_letters_total",
        subject_prefix=subjects.DECISION_PREFIX,
        kind="processing",
    )


async def test_a_patch_the_api_server_refuses_is_failed_with_its_reason_and_dead_lettered(
    nats_url: str, kube_admin: client.ApiClient, ns: str, refusing_policy: None
) -> None:
    core = client.CoreV1Api(kube_admin)
    node = gpu_node(core, ns, "gpu")
    kai_chats(kube_admin, ns, node, "0.25")
    refusal = await wait_until_refused(core, ns, "chat-0")
    assert refusal.status == 422  # a real refusal of the API server, for good

    async with actuator(nats_url, kube_admin, ns) as service:
        made = decide(ns, 0.25, 0.37)  # in place: a patch of gpu-fraction
        await publish(nats_url, made)
        await wait_for(lambda: dead_lettered_decisions(service) == 1, timeout=30)
        [result] = await results_of(nats_url, made)
        [letter] = await dead_letters(nats_url)
        # Time for a redelivery, if there were to be one.
        await asyncio.sleep(RETRY_DELAY_S * 2.5)
        delivered, redelivering, unacked = await deliveries(nats_url)
        again = await results_of(nats_url, made)
        claim = await claim_of(nats_url, made)

        # A copy of the decision published again is not acted on either.
        await publish(nats_url, made)
        registry = service.runtime.registry
        await wait_for(
            lambda: (
                counter(
                    registry, "fracpilot_actuator_actions_total", plan="none", outcome="duplicate"
                )
                == 1
            ),
            timeout=15,
        )
        failed = counter(
            registry, "fracpilot_actuator_actions_total", plan="in_place", outcome="failed"
        )
        letters_after_copy = dead_lettered_decisions(service)

    assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.FAILED), result.detail
    error = result.error or ""
    assert "in-place resize of" in error, error
    assert "refused (422)" in error, error
    assert POLICY_MESSAGE in error  # the server's own message
    assert result.fraction_after == 0.25  # nothing changed
    # The dead letter is the decision itself, with the reason.
    assert letter.error_kind == "processing"
    assert letter.subject == subjects.decision_subject(made.workload)
    assert FractionDecision.model_validate_json(letter.raw_payload).decision_id == made.decision_id
    assert "refused (422)" in letter.reason
    assert POLICY_MESSAGE in letter.reason
    # Delivered once, terminated: never again.
    assert (delivered, redelivering, unacked) == (1, 0, 0)
    assert len(again) == 1
    assert claim == "done:failed"
    assert failed == 1
    assert letters_after_copy == 1
    for name in ("chat-0", "chat-1"):
        pod = kube.read_pod(core, ns, name)
        assert pod is not None
        assert pod.metadata.annotations["gpu-fraction"] == "0.25"


async def test_an_eviction_a_pdb_refuses_is_failed_but_not_dead_lettered(
    nats_url: str, kube_admin: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    full = gpu_node(core, ns, "full")
    gpu_node(core, ns, "spare")
    kai_chats(kube_admin, ns, full, "0.5")
    kube.pdb(client.PolicyV1Api(kube_admin), ns, "chat", disruptions_allowed=0)

    async with actuator(nats_url, kube_admin, ns) as service:
        made = decide(ns, 0.5, 0.62)  # no room on its GPU: a recreate on the spare node
        await publish(nats_url, made)
        registry = service.runtime.registry
        await wait_for(
            lambda: (
                counter(
                    registry,
                    "fracpilot_actuator_actions_total",
                    plan="recreate_elsewhere",
                    outcome="failed",
                )
                == 1
            ),
            timeout=30,
        )
        await asyncio.sleep(RETRY_DELAY_S * 2.5)
        [result] = await results_of(nats_url, made)
        delivered, redelivering, unacked = await deliveries(nats_url)
        letters = await dead_letters(nats_url)
        dead = dead_lettered_decisions(service)
        claim = await claim_of(nats_url, made)

    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED)
    assert "refused 3 times (429" in (result.error or "")
    assert "disruption budget" in (result.error or "")
    assert not kube.pod_is_evicted(core, ns, "chat-0")
    # A normal FAILED: acknowledged once, nothing dead-lettered.
    assert (letters, dead) == ([], 0)
    assert (delivered, redelivering, unacked) == (1, 0, 0)
    assert claim == "done:failed"
