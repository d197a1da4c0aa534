"""fracpilot's actuator never recreates a pod on a node it may not go to (issue 26, "a tainted
node, and a node whose selector does not match, are never chosen"), on the real KAI-Scheduler.

``chat`` (a Deployment's KAI fraction pod, nodeSelector ``fracpilot.test/pool=a``, no toleration
for ``dedicated=other:NoSchedule``) holds 0.5 of a GPU whose co-tenant leaves no room for 0.75.
Two other nodes have room for it and are the best fit by fracpilot's rule (the fullest GPU that
holds the share: each holds a 0.25 pod, so 0.75 free), but the pod may not go to either: one is
tainted ``dedicated=other:NoSchedule`` (and in pool a), the other is in pool b (untainted). The
only node it may go to has an empty GPU (1.0 free: the worse fit). Without kube-scheduler's
predicates the planner picks an invalid node; with them, the recreate goes to the valid one and
KAI binds the replacement there, or, with no valid node, the upsize is a scale-up that waits
for capacity and never evicts. As in test_actuator_on_kai.py, the actuator and its webhook run
in-process on the stack's apiserver (tests/support/fracpilot_on_stack.py), nodescaleadjuster on.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from fracpilot_actuator.admission import TARGET_ANNOTATION
from fracpilot_libs.contracts import ActuationResult, Outcome, PlanKind
from support.fracpilot_on_stack import (
    actuator_on_stack,
    apply,
    decide,
    gpu_portions,
    in_thread,
    kai_deployment,
    kai_pod_body,
    replacement,
    unschedulable,
    wait_results,
    wait_running,
)
from support.gpu_stack import GPU_FRACTION, GPU_GROUP, RESERVATION_APP, RESERVATION_NS, GpuStack

pytestmark = pytest.mark.integration

POOL = "fracpilot.test/pool"
HOSTNAME = "kubernetes.io/hostname"
DEDICATED = {"key": "dedicated", "value": "other", "effect": "NoSchedule"}
CAPACITY_SELECTOR = "fracpilot.io/role=capacity"  # the placeholders' label (object_values.py)

MakeNode = Callable[[str, Mapping[str, str], Sequence[Mapping[str, str]]], str]


@pytest.fixture
def make_node(gpu_stack: GpuStack) -> Iterator[MakeNode]:
    """Ready kwok nodes with one GPU, labels and taints, for one test; deleted afterwards."""
    made: list[str] = []

    def make(role: str, labels: Mapping[str, str], taints: Sequence[Mapping[str, str]]) -> str:
        name = f"kwok-{role}-{uuid.uuid4().hex[:6]}"
        made.append(gpu_stack.create_gpu_node(name, gpus=1, labels=labels, taints=taints))
        return name

    yield make
    for name in made:
        with contextlib.suppress(client.ApiException):
            client.CoreV1Api(gpu_stack.api).delete_node(name)


def pinned(name: str, fraction: str, node: str, *, tolerate: bool = False) -> dict[str, Any]:
    """A KAI fraction pod bound by KAI to ``node`` (its hostname selector)."""
    body = kai_pod_body(name, fraction)
    body["spec"]["nodeSelector"] = {HOSTNAME: node}
    if tolerate:
        body["spec"]["tolerations"].append({**DEDICATED, "operator": "Equal"})
    return body


async def chat_on_a_full_gpu(
    stack: GpuStack, ns: str, make_node: MakeNode
) -> tuple[str, dict[str, Any]]:
    """Node ``home`` (pool a, one GPU) holding chat (0.5, pool a only) and other (0.5), on one
    GPU group that has its reservation pod."""
    home = await in_thread(make_node, "home", {POOL: "a"}, ())
    chat = kai_deployment("chat", "0.5")
    chat["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "a"}
    await in_thread(stack.create, chat, ns)
    # other only once chat is Running (its GPU group labelled and reserved): two pods bound at
    # once into one new group race in KAI v0.12.0's binder (kai-scheduler/KAI-Scheduler#1103,
    # fixed after v0.12.0 by #1387). One Bind's sync sees the group's new reservation pod in
    # its cache before either pod's group label, and deletes it; chat's eviction then has the
    # binder delete other as "a pod without reservation", and the replacement fits on the
    # emptied home (pkg/binder/binding/binder.go:45, binder/controllers/pod_controller.go:95,
    # binding/resourcereservation/resource_reservation.go:186-205,350-358).
    [pod] = await in_thread(wait_running, stack, ns, "chat")
    await in_thread(stack.create, pinned("other", "0.5", home), ns)
    [other] = await in_thread(wait_running, stack, ns, "other")
    assert pod["spec"]["nodeName"] == home
    group = pod["metadata"]["labels"][GPU_GROUP]
    assert other["metadata"]["labels"][GPU_GROUP] == group
    assert await in_thread(reservation_nodes, stack, group) == [home]
    return home, pod


async def invalid_best_fits(stack: GpuStack, ns: str, make_node: MakeNode) -> tuple[str, str]:
    """A tainted node (pool a) and a pool-b node, each GPU holding a 0.25 pod: 0.75 free,
    fuller than an empty GPU, so fracpilot's best fit would pick them but for the predicates."""
    tainted = await in_thread(make_node, "tainted", {POOL: "a"}, (DEDICATED,))
    pool_b = await in_thread(make_node, "poolb", {POOL: "b"}, ())
    await in_thread(stack.create, pinned("filler-t", "0.25", tainted, tolerate=True), ns)
    await in_thread(stack.create, pinned("filler-b", "0.25", pool_b), ns)
    [t] = await in_thread(wait_running, stack, ns, "filler-t")
    [b] = await in_thread(wait_running, stack, ns, "filler-b")
    assert (t["spec"]["nodeName"], b["spec"]["nodeName"]) == (tainted, pool_b)
    return tainted, pool_b


def reservation_nodes(stack: GpuStack, group: str) -> list[str]:
    """The nodes of the reservation pods holding GPU group ``group`` (KAI's binder)."""
    selector = f"app={RESERVATION_APP},{GPU_GROUP}={group}"
    return [p["spec"].get("nodeName", "") for p in stack.items("Pod", RESERVATION_NS, selector)]


def cotenants(stack: GpuStack, ns: str, node: str) -> list[tuple[str, str, str, str, bool]]:
    """The pods on ``node``: name, uid, phase, fraction, terminating (a failure's evidence)."""
    return [
        (
            p["metadata"]["name"],
            p["metadata"]["uid"],
            p.get("status", {}).get("phase", ""),
            (p["metadata"].get("annotations") or {}).get(GPU_FRACTION, ""),
            bool(p["metadata"].get("deletionTimestamp")),
        )
        for p in stack.items("Pod", ns)
        if p.get("spec", {}).get("nodeName") == node
    ]


def never_names(results: list[ActuationResult], *nodes: str) -> None:
    """No result targets ``nodes``: neither its node_after nor its detail names them."""
    for r in results:
        assert r.node_after not in nodes, r
        for node in nodes:
            assert node not in r.detail, r


@pytest.mark.timeout(300)
async def test_a_recreate_never_goes_to_a_tainted_or_unselected_node_however_well_it_fits(
    gpu_stack: GpuStack,
    gpu_namespace: str,
    make_node: MakeNode,
    nats_url: str,
    tmp_path: Path,
) -> None:
    stack, ns = gpu_stack, gpu_namespace
    async with actuator_on_stack(stack, nats_url, ns, tmp_path):
        home, chat = await chat_on_a_full_gpu(stack, ns, make_node)
        tainted, pool_b = await invalid_best_fits(stack, ns, make_node)
        valid = await in_thread(make_node, "valid", {POOL: "a"}, ())  # empty: the worse fit

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        evicted, verified = await apply(nats_url, made, count=2, timeout=150)
        assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
        # The planner's own words: the best fit the pod may go to, and that two with room
        # (the tainted and the pool-b node) refused it.
        assert f"on {valid} (1 free)" in evicted.detail, evicted
        assert "2 node(s) with room refused it" in evicted.detail, evicted
        assert (verified.plan, verified.outcome) == (
            PlanKind.RECREATE_ELSEWHERE,
            Outcome.APPLIED,
        ), verified
        never_names([evicted, verified], tainted, pool_b)

        # The ReplicaSet's new pod, sized by fracpilot's webhook, bound by KAI on the valid
        # node and started with the new portion; the result says what it holds.
        new = await in_thread(
            stack.wait,
            lambda: replacement(stack, ns, "chat", chat["metadata"]["uid"]),
            "the recreated chat pod Running",
            120,
        )
        assert new["spec"]["nodeName"] == valid, (verified, cotenants(stack, ns, home))
        assert new["metadata"]["annotations"][GPU_FRACTION] == "0.75"
        assert TARGET_ANNOTATION in new["metadata"]["annotations"]
        assert await in_thread(gpu_portions, stack, new) == ["0.75"]
        assert (verified.node_before, verified.node_after) == (home, valid)
        assert verified.fraction_after == 0.75
        assert verified.enforced_fraction in (None, 0.75)


@pytest.mark.timeout(300)
async def test_with_room_only_on_a_tainted_or_unselected_node_the_upsize_waits_and_never_evicts(
    gpu_stack: GpuStack,
    gpu_namespace: str,
    make_node: MakeNode,
    nats_url: str,
    tmp_path: Path,
) -> None:
    stack, ns = gpu_stack, gpu_namespace
    # No autoscaler runs here: a short wait for capacity, so the scale-up gives up in the test.
    capacity = {"timeout_s": 10, "autoscaler_max_node_provision_s": 5}
    async with actuator_on_stack(stack, nats_url, ns, tmp_path, capacity=capacity):
        _, chat = await chat_on_a_full_gpu(stack, ns, make_node)
        tainted, pool_b = await invalid_best_fits(stack, ns, make_node)

        made = decide(ns, "chat", chat["metadata"]["name"], 0.5, 0.75)
        [asked] = await apply(nats_url, made)
        # The judge today: fits nowhere the pod may go, so a scale-up (make before break)
        # saying why each node with room refused it; never a recreate onto one of them.
        assert (asked.plan, asked.outcome) == (PlanKind.SCALE_UP, Outcome.PENDING), asked
        assert "0.75 fits nowhere the pod may go" in asked.detail, asked
        assert f"node {tainted}: taint dedicated=other:NoSchedule not tolerated" in asked.detail
        assert f"node {pool_b}: nodeSelector {POOL}=a not matched" in asked.detail
        assert "capacity requested" in asked.detail
        # The placeholder asks for a GPU where chat may go; kube-scheduler finds none either.
        [placeholder] = await in_thread(stack.items, "Pod", ns, CAPACITY_SELECTOR)
        assert placeholder["spec"]["nodeSelector"] == {POOL: "a"}
        name = placeholder["metadata"]["name"]
        await in_thread(
            stack.wait, lambda: unschedulable(stack, ns, name), "placeholder Unschedulable", 15
        )

        # Re-planned every poll_s while it waits, on the same cluster: still nowhere to go,
        # so after the capacity timeout it gives up, the pod never evicted.
        _, ended = await wait_results(nats_url, made, count=2, timeout=60)
        assert (ended.plan, ended.outcome) == (PlanKind.SCALE_UP, Outcome.FAILED), ended
        assert "no GPU with 0.75 free appeared within 10 s" in ended.detail, ended
        assert ended.node_after == ""  # a scale-up step has no target until capacity exists
        pod = await in_thread(stack.get, "Pod", chat["metadata"]["name"], ns)
        assert pod["metadata"]["uid"] == chat["metadata"]["uid"]
        assert not pod["metadata"].get("deletionTimestamp")
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["annotations"][GPU_FRACTION] == "0.5"
        assert await in_thread(stack.items, "Pod", ns, CAPACITY_SELECTOR) == []
