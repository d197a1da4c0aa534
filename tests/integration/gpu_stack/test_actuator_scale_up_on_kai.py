"""fracpilot's scale-up on the real stack (issue 15, "Proof against the real stack", scenario 3).

An upsize that fits on no GPU: the actuator's placeholder (one whole GPU, the pod's CPU and
memory requests, kube-scheduler) makes the real cluster-autoscaler (kwok provider) add a node;
once the placeholder is bound there the actuator evicts the pod (the placeholder stays until
the replacement is bound), the ReplicaSet's new pod gets the new fraction from fracpilot's
webhook and KAI binds it on the new node, with KAI's nodescaleadjuster on (as in production).
The time from the decision going onto NATS to the new pod Running is printed (``-s``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fracpilot_libs.contracts import Outcome, PlanKind
from support.fracpilot_on_stack import (
    KaiScenario,
    chat_and_other_sharing_a_gpu,
    decide,
    in_thread,
    publish,
    wait_replacement,
    wait_results,
)
from support.gpu_stack import GPU_FRACTION, GpuStack

pytestmark = pytest.mark.integration

NODE_GROUP_LABEL = "example.io/nodegroup"  # fromNodeLabelKey in ca-kwok-config.yaml
CAPACITY_SELECTOR = "fracpilot.io/role=capacity"  # the placeholders' label (object_values.py)


@contextlib.asynccontextmanager
async def autoscaling(stack: GpuStack) -> AsyncIterator[None]:
    """cluster-autoscaler for the block, beside KAI's nodescaleadjuster, as in production (CA
    deletes the nodes it added when it stops). nodescaleadjuster makes a scaling pod for the
    recreated pod the moment it exists; fracpilot deletes one that KAI's scaler left bound but
    marked PodScheduled=False (docs/backends.md), which would hold KAI's binder back."""
    await in_thread(stack.start_autoscaler)
    try:
        yield
    finally:
        await in_thread(stack.stop_autoscaler)


@pytest.mark.timeout(420)
async def test_an_upsize_that_fits_nowhere_gets_a_node_from_the_autoscaler(
    kai: KaiScenario,
) -> None:
    stack, ns, nats_url = kai.stack, kai.ns, kai.nats_url
    full = await kai.add_gpu_node()
    async with kai.actuator():
        chat, _ = await chat_and_other_sharing_a_gpu(stack, ns)
        assert chat["spec"]["nodeName"] == full
        async with autoscaling(stack):
            await scale_up(stack, ns, nats_url, chat)


async def scale_up(stack: GpuStack, ns: str, nats_url: str, chat: dict[str, Any]) -> None:
    """chat 0.5 -> 0.75 where its only GPU is full and no other node exists."""
    made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
    published = await publish(nats_url, made)
    [asked] = await wait_results(nats_url, made)
    # Nothing moved yet: PENDING, never APPLIED at "capacity requested".
    assert (asked.plan, asked.outcome) == (PlanKind.SCALE_UP, Outcome.PENDING), asked
    assert "capacity requested" in asked.detail
    [placeholder] = await in_thread(stack.items, "Pod", ns, CAPACITY_SELECTOR)
    limits = placeholder["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1"}

    what = "chat recreated and Running on a node cluster-autoscaler added"
    new = await wait_replacement(stack, ns, "chat", chat, what, 300)
    to_running = time.monotonic() - published
    print(f"\nscale-up: decision -> recreated pod Running in {to_running:.1f} s")

    node = await in_thread(stack.get, "Node", new["spec"]["nodeName"])
    assert node["metadata"]["labels"].get(NODE_GROUP_LABEL) == "gpu-h100"
    assert new["metadata"]["annotations"][GPU_FRACTION] == "0.75"
    # asked (PENDING), evicted (PENDING, the placeholder kept), verified (APPLIED).
    done = await wait_results(nats_url, made, count=3, timeout=120)
    assert [r.outcome for r in done] == [Outcome.PENDING, Outcome.PENDING, Outcome.APPLIED]
    last = done[-1]
    assert last.plan is PlanKind.SCALE_UP
    assert (last.node_after, last.fraction_after) == (new["spec"]["nodeName"], 0.75), last
    assert "evicted" in last.detail
    assert await in_thread(stack.items, "Pod", ns, CAPACITY_SELECTOR) == []
