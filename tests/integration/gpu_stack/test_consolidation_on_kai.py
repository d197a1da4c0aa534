"""Consolidation on the real stack (issue 27, "Must show"): fracpilot empties a node and the real
cluster-autoscaler removes it.

Two kwok GPU nodes of cluster-autoscaler's kwok node group ``gpu-h100`` (made here as its kwok
provider makes them: ``providerID kwok:<name>`` and its node-group annotation, so the provider
counts them in the group, ``cloudprovider/kwok/kwok_helpers.go`` ``getNGName`` at CA
1959f5f61f6c, and may delete them, ``kwok_nodegroups.go`` ``DeleteNodes``), each with one pod of
Deployment ``chat`` (0.25 GPU) under a PDB allowing one disruption. fracpilot (consolidation
``auto``) marks one node, evicts its pod; KAI binds the replacement on the other node's GPU; the
mark comes off and cluster-autoscaler (short scale-down times, set here) deletes the empty node.
The workload keeps a Running pod throughout (polled).

Cluster-autoscaler's flags: a GPU node counts as underutilized by its GPU requests (KAI's
reservation pod holds one of four GPUs: 0.25), so ``--scale-down-gpu-utilization-threshold=0.1``
leaves a node with a pod alone and removes an empty one; ``--unremovable-node-recheck-timeout``
is short because both nodes are unremovable (not underutilized) until fracpilot empties one.

Variants, same set-up: recommend mode, both nodes annotated scale-down-disabled, a PDB allowing
0: nothing moves and ``fracpilot_consolidation_would_free_gpus`` / ``_nodes`` say what would be
freed (1 and 1 in recommend mode, 0 and 0 when nothing may go).

A single card (a GPU of a node that keeps other pods): one kwok node with 2 GPUs; ``chat``'s two
pods each alone on its own card (KAI would binpack them onto one: a 0.75 filler pod fills the
first pod's card while the second is placed, then goes), a PDB allowing one disruption. No other
node can take a pod, so no node can be emptied: fracpilot empties one card without a taint,
evicting its pod; KAI's binpack binds the replacement on the other card, the one the planner
predicted (the emptied card is all released and takes no shared pod: ``IsTaskFitOnGpuGroup``,
``pkg/scheduler/api/node_info/gpu_sharing_node_info.go``, KAI v0.12.0); KAI deletes the emptied
card's reservation pod, and the card is reported freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client

from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.consolidation_round import MARK_TAINT
from fracpilot_actuator.kube.object_values import KAI_GROUP
from fracpilot_libs.contracts import CardForecast
from fracpilot_libs.placement.consolidation import SCALE_DOWN_DISABLED
from support.fracpilot_on_stack import (
    KaiScenario,
    decide,
    in_thread,
    kai_deployment,
    kai_pod_body,
    pdb,
    running_pods,
    wait_running,
)
from support.gpu_stack import KWOK_TAINT, GpuStack

pytestmark = pytest.mark.integration

GROUP = "gpu-h100"  # ca-kwok-config.yaml's node group
GROUP_LABEL = "example.io/nodegroup"  # its fromNodeLabelKey
NG_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/name"  # kwok_constants.go NGNameAnnotation
HOLD = {"key": "test.fracpilot.io/hold", "value": "true", "effect": "NoSchedule"}
SCAN_S = 1  # CA's loop (start_autoscaler's 5 s, the last flag wins)
UNNEEDED_S = 5
AUTOSCALER_FLAGS = (
    f"--scan-interval={SCAN_S}s",
    f"--scale-down-unneeded-time={UNNEEDED_S}s",
    "--scale-down-delay-after-add=0s",
    "--scale-down-delay-after-delete=0s",
    "--scale-down-delay-after-failure=5s",
    "--scale-down-utilization-threshold=0.1",
    "--scale-down-gpu-utilization-threshold=0.1",
    "--unremovable-node-recheck-timeout=5s",
    "--node-delete-delay-after-taint=0s",
)


# How long nothing may move: fracpilot's rounds run every second (a move it should not make
# starts in the first ones); a node it emptied would be gone after CA's unneeded time and two
# more scans.
QUIET_S = 3 + UNNEEDED_S + 2 * SCAN_S


def group_node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    """A 4-GPU H100 kwok node of node group gpu-h100, as CA's kwok provider makes one."""
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "4",
        GROUP_LABEL: GROUP,
    }
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                NG_ANNOTATION: GROUP,
                **annotations,
            },
            "labels": labels,
        },
        "spec": {"providerID": f"kwok:{name}", "taints": [KWOK_TAINT]},
        "status": {"allocatable": resources, "capacity": resources},
    }


def group_nodes(stack: GpuStack) -> list[str]:
    nodes = stack.items("Node", selector=f"{GROUP_LABEL}={GROUP}")
    return sorted(n["metadata"]["name"] for n in nodes)


@contextlib.contextmanager
def two_nodes(stack: GpuStack, tag: str, annotations: dict[str, str]) -> Iterator[list[str]]:
    names = [f"{GROUP}-{tag}-a", f"{GROUP}-{tag}-b"]
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(stack.api).delete_node(name)


def set_taints(stack: GpuStack, node: str, taints: list[dict[str, str]]) -> None:
    client.CoreV1Api(stack.api).patch_node(node, {"spec": {"taints": taints}})


def budget(stack: GpuStack, ns: str, allowed: int) -> None:
    """chat's PodDisruptionBudget (at most ``allowed`` pods unavailable), once
    kube-controller-manager's disruption controller says it allows ``allowed`` disruptions (a
    round that reads it earlier sees none allowed)."""
    stack.create(pdb("chat", allowed), ns)

    def known() -> bool | None:
        status = stack.get("PodDisruptionBudget", "chat", ns, "policy/v1").get("status") or {}
        return True if status.get("disruptionsAllowed") == allowed else None

    stack.wait(known, f"PDB chat allowing {allowed}", 60)


def one_pod_on_each(
    stack: GpuStack, ns: str, names: list[str], annotations: dict[str, str], unavailable: int
) -> list[dict[str, Any]]:
    """Deployment chat's two pods, one on each node (KAI would binpack them onto one GPU: the
    first node is held back by a taint while the second pod is placed)."""
    a, b = names
    stack.create(group_node(a, annotations))
    stack.wait_node_ready(a)
    stack.create(kai_deployment("chat", "0.25"), ns)
    wait_running(stack, ns, "chat")
    stack.create(group_node(b, annotations))
    stack.wait_node_ready(b)
    set_taints(stack, a, [KWOK_TAINT, HOLD])
    client.AppsV1Api(stack.api).patch_namespaced_deployment_scale(
        "chat", ns, {"spec": {"replicas": 2}}
    )
    pods = wait_running(stack, ns, "chat", count=2)
    set_taints(stack, a, [KWOK_TAINT])
    assert sorted(p["spec"]["nodeName"] for p in pods) == names
    budget(stack, ns, unavailable)
    return pods


@contextlib.asynccontextmanager
async def autoscaling(stack: GpuStack) -> AsyncIterator[None]:
    await in_thread(stack.start_autoscaler, AUTOSCALER_FLAGS)
    try:
        yield
    finally:
        await in_thread(stack.stop_autoscaler)


class ReadyWatch:
    """The fewest Running pods of chat seen, polled until stopped."""

    def __init__(self, stack: GpuStack, ns: str) -> None:
        self.stack, self.ns = stack, ns
        self.fewest = 99
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        while True:
            count = len(await in_thread(running_pods, self.stack, self.ns, "chat"))
            self.fewest = min(self.fewest, count)
            self.polls += 1
            await asyncio.sleep(0.2)

    def __enter__(self) -> ReadyWatch:
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def backend_of(service: ActuatorService) -> KubernetesBackend:
    assert service.handler is not None
    backend = service.handler.backend
    assert isinstance(backend, KubernetesBackend)
    return backend


def sample(service: ActuatorService, name: str, **labels: str) -> float:
    value = service.runtime.registry.get_sample_value(name, labels)
    return -1.0 if value is None else value


def events(
    stack: GpuStack, namespace: str, reason: str, about: list[str] | None = None
) -> list[dict[str, Any]]:
    """Events of ``reason`` in the namespace (``about``: only those on these objects)."""
    return [
        e
        for e in stack.items("Event", namespace)
        if e.get("reason") == reason and (about is None or e["involvedObject"]["name"] in about)
    ]


def consolidation(mode: str) -> dict[str, Any]:
    return {"mode": mode, "interval_s": 1, "move_timeout_s": 120, "max_moves_per_hour": 4}


@pytest.mark.timeout(420)
async def test_fracpilot_empties_a_node_and_the_autoscaler_removes_it(kai: KaiScenario) -> None:
    stack, ns = kai.stack, kai.ns
    with two_nodes(stack, "move", {}) as names:
        before = await in_thread(one_pod_on_each, stack, ns, names, {}, 1)
        old = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in before}
        assert await in_thread(group_nodes, stack) == names
        async with (
            autoscaling(stack),
            kai.actuator(consolidation=consolidation("auto")) as service,
        ):
            started = time.monotonic()
            with ReadyWatch(stack, ns) as ready:
                [left] = await in_thread(
                    stack.wait,
                    lambda: nodes if len(nodes := group_nodes(stack)) == 1 else None,
                    "cluster-autoscaler to delete the node fracpilot emptied",
                    240,
                )
            took = time.monotonic() - started
            print(f"\nconsolidation: actuator up -> node removed in {took:.1f} s")
            assert ready.polls > 10
            assert ready.fewest >= 1  # never zero Running pods
            [emptied] = [n for n in names if n != left]
            pods = await in_thread(running_pods, stack, ns, "chat")
            assert [p["spec"]["nodeName"] for p in pods] == [left, left]
            moved = [uid for uid, node in old.items() if node == emptied]
            assert all(p["metadata"]["uid"] not in moved for p in pods)
            # Verified from the replacement, where the planner predicted KAI would put it.
            [verified] = await in_thread(events, stack, ns, "ConsolidationMoveVerified")
            assert f"bound on {left}, GPU " in verified["message"]
            assert "(as predicted)" in verified["message"]
            assert verified["involvedObject"]["name"] in {p["metadata"]["name"] for p in pods}
            [move] = await in_thread(events, stack, ns, "ConsolidationMove")
            assert "autoscaler can remove it" in move["message"]
            node_events = await in_thread(events, stack, "default", "ConsolidationStarted", names)
            assert [e["involvedObject"]["name"] for e in node_events] == [emptied]
            done = await in_thread(events, stack, "default", "ConsolidationDone", names)
            assert [e["involvedObject"]["name"] for e in done] == [emptied]
            assert sample(service, "fracpilot_consolidation_moves_total", result="verified") == 1
            assert sample(service, "fracpilot_consolidation_moves_total", result="failed") == 0
            assert sample(service, "fracpilot_consolidation_freed_nodes_total") == 1
            assert sample(service, "fracpilot_consolidation_freed_gpus_total") == 4
            taints = (await in_thread(stack.get, "Node", left))["spec"].get("taints") or []
            assert MARK_TAINT not in {t["key"] for t in taints}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("variant", "would_free"),
    [("recommend", (1, 1)), ("scale_down_disabled", (0, 0)), ("pdb_allows_0", (0, 0))],
)
async def test_nothing_moves_when_it_may_not_and_the_would_free_gauges_say_so(
    kai: KaiScenario, variant: str, would_free: tuple[int, int]
) -> None:
    stack, ns = kai.stack, kai.ns
    notes = {SCALE_DOWN_DISABLED: "true"} if variant == "scale_down_disabled" else {}
    unavailable = 0 if variant == "pdb_allows_0" else 1
    mode = "recommend" if variant == "recommend" else "auto"
    with two_nodes(stack, variant.replace("_", "-"), notes) as names:
        before = await in_thread(one_pod_on_each, stack, ns, names, notes, unavailable)
        uids = sorted(p["metadata"]["uid"] for p in before)
        async with (
            autoscaling(stack),
            kai.actuator(consolidation=consolidation(mode)) as service,
        ):
            backend = backend_of(service)
            await in_thread(
                stack.wait,
                lambda: backend.consolidation.last_round,
                "a consolidation round",
                60,
            )
            await asyncio.sleep(QUIET_S)
            gauges = (
                sample(service, "fracpilot_consolidation_would_free_gpus"),
                sample(service, "fracpilot_consolidation_would_free_nodes"),
            )
            assert gauges == would_free
            after = await in_thread(running_pods, stack, ns, "chat")
            assert sorted(p["metadata"]["uid"] for p in after) == uids
            assert await in_thread(group_nodes, stack) == names
            for name in names:
                taints = (await in_thread(stack.get, "Node", name))["spec"].get("taints") or []
                assert MARK_TAINT not in {t["key"] for t in taints}
            assert await in_thread(events, stack, ns, "ConsolidationMove") == []
            assert sample(service, "fracpilot_consolidation_moves_total", result="verified") == 0


# --- a single card --------------------------------------------------------------------------


def group_of(pod: dict[str, Any]) -> str:
    return str((pod["metadata"].get("labels") or {}).get(KAI_GROUP, ""))


def one_pod_on_each_card(stack: GpuStack, ns: str) -> list[dict[str, Any]]:
    """chat's two pods on the node's two cards (module docstring)."""
    stack.create(kai_deployment("chat", "0.25"), ns)
    [first] = wait_running(stack, ns, "chat")
    stack.create(kai_pod_body("filler", "0.75"), ns)
    [filler] = wait_running(stack, ns, "filler")
    assert group_of(filler) == group_of(first)  # binpack: the fuller card
    client.AppsV1Api(stack.api).patch_namespaced_deployment_scale(
        "chat", ns, {"spec": {"replicas": 2}}
    )
    pods = wait_running(stack, ns, "chat", count=2)
    client.CoreV1Api(stack.api).delete_namespaced_pod("filler", ns, grace_period_seconds=0)
    stack.wait(
        lambda: True if not stack.items("Pod", ns, selector="app=filler") else None,
        "the filler pod gone",
        60,
    )
    assert len({group_of(p) for p in pods}) == 2
    budget(stack, ns, 1)
    return pods


@pytest.mark.timeout(300)
async def test_fracpilot_empties_one_card_and_kai_binds_the_move_where_predicted(
    kai: KaiScenario,
) -> None:
    stack, ns = kai.stack, kai.ns
    node = await kai.add_gpu_node(2)
    before = await in_thread(one_pod_on_each_card, stack, ns)
    old_uids = {p["metadata"]["uid"] for p in before}
    async with kai.actuator(consolidation=consolidation("auto")) as service:
        with ReadyWatch(stack, ns) as ready:
            [done] = await in_thread(
                stack.wait,
                lambda: events(stack, "default", "ConsolidationCardDone", [node]) or None,
                "fracpilot to report the card emptied",
                180,
            )
        assert ready.polls > 5
        assert ready.fewest >= 1  # never zero Running pods
        pods = await in_thread(running_pods, stack, ns, "chat")
        assert len(pods) == 2
        assert len({group_of(p) for p in pods}) == 1  # both on one card now
        [moved] = [p for p in pods if p["metadata"]["uid"] not in old_uids]
        [stayed] = [p for p in pods if p["metadata"]["uid"] in old_uids]
        assert group_of(moved) == group_of(stayed)
        [verified] = await in_thread(events, stack, ns, "ConsolidationMoveVerified")
        assert verified["involvedObject"]["name"] == moved["metadata"]["name"]
        # the GPU the stayed pod is on (its group's reservation pod names it), as predicted
        assert f"bound on {node}, GPU " in verified["message"]
        assert f"{group_of(stayed)} (as predicted)" in verified["message"]
        [move] = await in_thread(events, stack, ns, "ConsolidationMove")
        assert "so that the whole GPU is free" in move["message"]
        [started] = await in_thread(events, stack, "default", "ConsolidationCardStarted", [node])
        assert f"on node {node}" in started["message"]
        assert "holds no pod any more" in done["message"]
        assert await in_thread(events, stack, "default", "ConsolidationCardAbandoned", [node]) == []
        assert sample(service, "fracpilot_consolidation_moves_total", result="verified") == 1
        assert sample(service, "fracpilot_consolidation_moves_total", result="failed") == 0
        assert sample(service, "fracpilot_consolidation_freed_gpus_total") == 1
        assert sample(service, "fracpilot_consolidation_freed_nodes_total") == 0
        raw = await in_thread(stack.get, "Node", node)
        assert MARK_TAINT not in {t["key"] for t in raw["spec"].get("taints") or []}


def a_shared_card_and_a_lone_one(stack: GpuStack, ns: str) -> dict[str, list[dict[str, Any]]]:
    """GPU X: chat's first pod (0.25) and big (0.6), 0.15 free; GPU Y: chat's second pod alone
    (it does not fit on X). KAI binpacks big onto chat's card, then the second chat pod onto the
    idle one."""
    stack.create(kai_deployment("chat", "0.25"), ns)
    [first] = wait_running(stack, ns, "chat")
    stack.create(kai_deployment("big", "0.6"), ns)
    [big] = wait_running(stack, ns, "big")
    assert group_of(big) == group_of(first)
    client.AppsV1Api(stack.api).patch_namespaced_deployment_scale(
        "chat", ns, {"spec": {"replicas": 2}}
    )
    pods = wait_running(stack, ns, "chat", count=2)
    assert len({group_of(p) for p in pods}) == 2
    budget(stack, ns, 1)
    return {"chat": pods, "big": [big]}


@pytest.mark.timeout(300)
async def test_under_shared_isolation_a_tenant_shrinks_in_place_then_the_lone_pod_moves(
    kai: KaiScenario,
) -> None:
    """big's workload decided with a card forecast (need 0.3): the planner shrinks big in place
    to its card budget on GPU X (KAI re-reads the annotation: accounting only, no restart), which
    makes room for chat's lone pod on GPU Y; KAI binds its replacement on X, as predicted."""
    stack, ns = kai.stack, kai.ns
    node = await kai.add_gpu_node(2)
    before = await in_thread(a_shared_card_and_a_lone_one, stack, ns)
    [big] = before["big"]
    old_uids = {p["metadata"]["uid"] for p in before["chat"]}
    async with kai.actuator(consolidation=consolidation("auto")) as service:
        forecast = CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3)
        made = decide(ns, "big", big["metadata"]["name"], 0.6, 0.4)  # recorded, not sent
        backend_of(service).cards.book.record(made.model_copy(update={"forecast": forecast}))
        with ReadyWatch(stack, ns) as ready:
            [done] = await in_thread(
                stack.wait,
                lambda: events(stack, "default", "ConsolidationCardDone", [node]) or None,
                "fracpilot to report the card emptied",
                180,
            )
        assert ready.fewest >= 1
        [redivided] = await in_thread(events, stack, ns, "FractionRedivided")
        assert redivided["involvedObject"]["name"] == big["metadata"]["name"]
        now_big = await in_thread(stack.get, "Pod", big["metadata"]["name"], ns)
        assert now_big["metadata"]["uid"] == big["metadata"]["uid"]  # in place: no restart
        shrunk = float(now_big["metadata"]["annotations"]["gpu-fraction"])
        assert 0.3 <= shrunk <= 0.5
        pods = await in_thread(running_pods, stack, ns, "chat")
        assert len(pods) == 2
        assert {group_of(p) for p in pods} == {group_of(big)}  # all on GPU X now
        [moved] = [p for p in pods if p["metadata"]["uid"] not in old_uids]
        [verified] = await in_thread(events, stack, ns, "ConsolidationMoveVerified")
        assert verified["involvedObject"]["name"] == moved["metadata"]["name"]
        assert f"{group_of(big)} (as predicted)" in verified["message"]
        assert "holds no pod any more" in done["message"]
        assert sample(service, "fracpilot_consolidation_freed_gpus_total") == 1
        print(f"\nshared isolation: big shrunk in place 0.6 -> {shrunk:g}; {done['message']}")
