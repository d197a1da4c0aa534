"""fracpilot's actuator on the real KAI-Scheduler (issue 26): a KAI queue's limit on the recreate
path, a target of a whole GPU, and a gang's minMember.

As in test_actuator_on_kai.py, the actuator and its webhook run in-process on the stack's
apiserver (tests/support/fracpilot_on_stack.py); KAI (scheduler, binder, podgrouper,
admission, and here its queuecontroller), kwok and kube-controller-manager do the rest.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from factories import decision
from fracpilot_libs.contracts import Outcome, PlanKind, WorkloadRef, utcnow
from support.fracpilot_on_stack import (
    CLUSTER,
    KaiScenario,
    apply,
    decide,
    in_thread,
    kai_deployment,
    kai_pod_body,
    wait_queue_allocated,
    wait_replacement,
    wait_running,
)
from support.gpu_stack import DEFAULT_QUEUE, GPU_FRACTION

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


@pytest.mark.timeout(300)
async def test_an_upsize_by_recreate_past_a_queues_limit_is_a_recommendation_and_the_pod_runs(
    kai: KaiScenario, half_gpu_queue: str
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    full = await kai.add_gpu_node()
    async with kai.actuator():
        await in_thread(stack.create, kai_deployment("chat", "0.5", queue=half_gpu_queue), ns)
        await in_thread(stack.create, kai_pod_body("other", "0.5"), ns)  # the default queue
        [chat] = await in_thread(wait_running, stack, ns, "chat")
        await in_thread(wait_running, stack, ns, "other")
        assert chat["spec"]["nodeName"] == full
        await kai.add_gpu_node()  # where 0.75 fits: only a recreate gets there
        await wait_queue_allocated(stack, half_gpu_queue, 0.5)

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        [result] = await apply(nats_url, made)
        assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.DRY_RUN)
        assert "an upsize by recreate of 0.25 GPU" in result.detail, result
        assert f"KAI queue {half_gpu_queue} to 0.75 GPU, past its limit 0.5" in result.detail
        pod = await in_thread(stack.get, "Pod", chat["metadata"]["name"], ns)
        assert pod["metadata"]["uid"] == chat["metadata"]["uid"]  # kept, never evicted
        assert not pod["metadata"].get("deletionTimestamp")
        assert pod["status"]["phase"] == "Running"


@pytest.mark.timeout(300)
async def test_a_target_of_a_whole_gpu_ends_with_a_pod_kai_accepts_and_binds(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    node = await kai.add_gpu_node()
    async with kai.actuator():
        await in_thread(stack.create, kai_deployment("chat", "0.5"), ns)
        [chat] = await in_thread(wait_running, stack, ns, "chat")

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 1.0)
        evicted, result = await apply(nats_url, made, count=2, timeout=150)
        # Never gpu-fraction "1" in place (KAI's webhook refuses it): a recreate, pending until
        # the replacement is bound, then applied as read from it.
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        assert "KAI's webhook accepts a gpu-fraction only in (0, 1)" in evicted.detail
        assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
        assert (result.fraction_after, result.node_after) == (1.0, node)

        # The ReplicaSet's new pod, made a whole-GPU pod by fracpilot's webhook, accepted by
        # KAI's, bound by KAI's binder on the one GPU.
        new = await wait_replacement(stack, ns, "chat", chat, "the recreated chat pod Running")
        assert new["spec"]["nodeName"] == node
        assert GPU_FRACTION not in new["metadata"]["annotations"]
        assert new["spec"]["containers"][0]["resources"]["limits"][GPU] == "1"


def gang_member(name: str, group: str) -> dict[str, Any]:
    """A bare fraction pod of a PodGroup its author made (KAI's podgrouper leaves a pod
    without owners that names its group alone: ``isOrphanPodWithPodGroup``)."""
    body = kai_pod_body(name, "0.5")
    body["metadata"]["labels"]["app"] = "gang"
    body["metadata"]["annotations"]["pod-group-name"] = group
    return body


@pytest.mark.timeout(300)
async def test_an_eviction_that_takes_a_gang_below_its_min_member_is_refused(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    full = await kai.add_gpu_node()
    group = "pg-gang"
    async with kai.actuator():
        await in_thread(
            stack.create,
            {
                "apiVersion": "scheduling.run.ai/v2alpha2",
                "kind": "PodGroup",
                "metadata": {"name": group},
                "spec": {"minMember": 2, "queue": DEFAULT_QUEUE},
            },
            ns,
        )
        for i in range(2):
            await in_thread(stack.create, gang_member(f"gang-{i}", group), ns)
        pods = await in_thread(wait_running, stack, ns, "gang", 2)
        assert {p["spec"]["nodeName"] for p in pods} == {full}  # KAI put the gang on one GPU
        await kai.add_gpu_node()  # where 0.75 would fit: only a recreate gets there

        wl = WorkloadRef(cluster=CLUSTER, namespace=ns, owner_kind="Pod", owner_name="gang-0")
        made = decision(
            current=0.5,
            new=0.75,
            name="gang-0",
            workload=wl,
            decision_id=f"d-{uuid.uuid4().hex[:12]}",
            decided_at=utcnow(),
            pod="gang-0",
        )
        [result] = await apply(nats_url, made)
        assert (result.plan, result.outcome) == (PlanKind.NONE, Outcome.SKIPPED), result
        assert f"PodGroup {ns}/{group} with 1 running pod(s), below its minMember 2" in (
            result.detail
        )
        for p in pods:
            now = await in_thread(stack.get, "Pod", p["metadata"]["name"], ns)
            assert now["metadata"]["uid"] == p["metadata"]["uid"]
            assert not now["metadata"].get("deletionTimestamp")
