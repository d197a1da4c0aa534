"""fracpilot's actuator and webhook acting on the real KAI-Scheduler (issue 15, "Proof against
the real stack", scenarios 1, 2 and 4).

The actuator service runs in-process with backend=kubernetes on the stack's apiserver
(tests/support/fracpilot_on_stack.py): a decision goes onto NATS, the actuator judges it on
what the cluster shows and acts; KAI (scheduler, binder, admission), kwok and
kube-controller-manager do the rest. Each test checks what the real scheduler made of it.
Blocking calls go through ``in_thread``: the webhook is served from the test's event loop.
"""

from __future__ import annotations

import pytest

from fracpilot_actuator.admission import TARGET_ANNOTATION
from fracpilot_libs.contracts import Outcome, PlanKind
from support.fracpilot_on_stack import (
    KaiScenario,
    allocation_of,
    apply,
    chat_and_other_sharing_a_gpu,
    decide,
    gpu_portions,
    in_thread,
    kai_deployment,
    kai_pod_body,
    pdb,
    unschedulable,
    wait_queue_allocated,
    wait_replacement,
    wait_running,
)
from support.gpu_stack import GPU_FRACTION, GPU_GROUP, GpuStack

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_a_downsize_in_place_frees_a_share_that_kai_gives_to_a_pending_pod(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    node = await kai.add_gpu_node()  # one GPU: the freed share is the only room
    async with kai.actuator():
        chat, other = await chat_and_other_sharing_a_gpu(stack, ns)
        group = chat["metadata"]["labels"][GPU_GROUP]
        assert other["metadata"]["labels"][GPU_GROUP] == group
        await in_thread(stack.create, kai_pod_body("late", "0.25"), ns)
        await in_thread(
            stack.wait, lambda: unschedulable(stack, ns, "late"), "late Unschedulable", 60
        )

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.25)
        [result] = await apply(nats_url, made)
        assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), result
        assert (result.node_before, result.fraction_after) == (node, 0.25)
        # The binder started the container with 0.50 and nothing changes it: accounted only.
        assert result.enforced_fraction is None or result.enforced_fraction == 0.5

        [late] = await in_thread(wait_running, stack, ns, "late")
        assert (late["spec"]["nodeName"], late["metadata"]["labels"][GPU_GROUP]) == (node, group)
        resized = await in_thread(stack.get, "Pod", chat["metadata"]["name"], ns)
        assert resized["metadata"]["uid"] == chat["metadata"]["uid"]  # not recreated
        assert resized["metadata"]["annotations"][GPU_FRACTION] == "0.25"
        assert await in_thread(gpu_portions, stack, resized) == ["0.50"]  # as it started
        allocation = await allocation_of(nats_url, made.workload)
        assert allocation is not None
        assert (allocation.node, allocation.fraction) == (node, 0.25)


def disruptions_allowed(stack: GpuStack, ns: str, name: str, allowed: int) -> bool | None:
    budget = stack.get("PodDisruptionBudget", name, ns, api_version="policy/v1")
    status = budget.get("status") or {}
    current = status.get("observedGeneration") == budget["metadata"]["generation"]
    return True if current and status.get("disruptionsAllowed") == allowed else None


@pytest.mark.timeout(300)
async def test_an_upsize_that_does_not_fit_is_evicted_within_the_pdb_and_recreated_elsewhere(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    full = await kai.add_gpu_node()
    async with kai.actuator():
        chat, _ = await chat_and_other_sharing_a_gpu(stack, ns)
        assert chat["spec"]["nodeName"] == full
        spare = await kai.add_gpu_node()  # empty: where 0.75 fits
        await in_thread(stack.create, pdb("chat", max_unavailable=0), ns)
        await in_thread(
            stack.wait, lambda: disruptions_allowed(stack, ns, "chat", 0), "PDB status", 30
        )

        refused = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        [result] = await apply(nats_url, refused)
        assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED)
        assert "disruption budget" in (result.error or ""), result
        assert result.node_after == spare
        still = await in_thread(stack.get, "Pod", chat["metadata"]["name"], ns)
        assert not still["metadata"].get("deletionTimestamp")  # retried, never forced

        budget = pdb("chat", max_unavailable=1)
        budget["metadata"]["namespace"] = ns
        await in_thread(stack.apply_objects, [budget])
        await in_thread(
            stack.wait, lambda: disruptions_allowed(stack, ns, "chat", 1), "PDB allows 1", 30
        )
        allowed = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        # PENDING once evicted; APPLIED only when the replacement is bound, read from it.
        evicted, verified = await apply(nats_url, allowed, count=2, timeout=150)
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert (verified.plan, verified.outcome) == (
            PlanKind.RECREATE_ELSEWHERE,
            Outcome.APPLIED,
        ), verified

        # The ReplicaSet's new pod: sized by fracpilot's webhook before KAI's saw it, placed
        # by KAI on the spare GPU, started with the new portion.
        new = await wait_replacement(stack, ns, "chat", chat, "the recreated chat pod Running")
        assert new["spec"]["nodeName"] == spare
        assert new["metadata"]["annotations"][GPU_FRACTION] == "0.75"
        assert TARGET_ANNOTATION in new["metadata"]["annotations"]
        assert await in_thread(gpu_portions, stack, new) == ["0.75"]
        # The result says what the new pod holds: its node, its share, its GPU_PORTION.
        assert (verified.node_after, verified.fraction_after) == (spare, 0.75)
        assert verified.enforced_fraction in (None, 0.75)
        template = await in_thread(stack.get, "Deployment", "chat", ns, "apps/v1")
        assert template["spec"]["template"]["metadata"]["annotations"][GPU_FRACTION] == "0.5"


@pytest.mark.timeout(300)
async def test_no_upsize_in_place_takes_a_kai_queue_past_its_limit(
    kai: KaiScenario, half_gpu_queue: str
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    node = await kai.add_gpu_node()
    async with kai.actuator():
        await in_thread(stack.create, kai_deployment("chat", "0.5", queue=half_gpu_queue), ns)
        [chat] = await in_thread(wait_running, stack, ns, "chat")
        assert chat["spec"]["nodeName"] == node
        await wait_queue_allocated(stack, half_gpu_queue, 0.5)

        # 0.75 fits on the GPU (alone on it), but not in the queue: KAI would not notice.
        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        [result] = await apply(nats_url, made)
        # Held back as a recommendation (the judge's queue_limit), the reason in the result.
        assert (result.plan, result.outcome) == (PlanKind.IN_PLACE, Outcome.DRY_RUN), result
        assert "past its limit 0.5" in result.detail, result
        assert half_gpu_queue in result.detail
        pod = await in_thread(stack.get, "Pod", chat["metadata"]["name"], ns)
        assert pod["metadata"]["annotations"][GPU_FRACTION] == "0.5"
        assert not pod["metadata"].get("deletionTimestamp")
