"""The planner with kube-scheduler's predicates agrees with the real KAI-Scheduler (issue 26).

Many generated layouts run at once in one cluster: each gets kwok nodes of its own (labelled
``fracpilot.test/layout=<i>``, with random labels, taints, allocatable CPU and memory and 1 or 2
GPUs), a namespace of its own with fraction pods already placed by KAI, and then one candidate
fraction pod with a random node selector, required node affinity, tolerations, requests, pod
(anti-)affinity and topology spread. Every candidate's node affinity terms also require its
layout (ANDed into each term, which the planner sees too), so layouts cannot meet. One more
layout is written by hand: KAI binds a pod there that kube-scheduler's topology spread rule
would refuse everywhere.

The planner's answer (:func:`~fracpilot_libs.placement.planner.move_or_scale_up`, the
"recreate elsewhere" choice, on the cluster as the actuator's inventory reads it, with
:func:`~fracpilot_libs.placement.predicates.node_rule` as its ``node_ok``) is compared with
KAI's: bound to a node, or ``PodScheduled=False/Unschedulable``. "Fits somewhere" agreement is
counted apart from "same node": both pick the fullest place, but KAI scores nodes, the planner
GPUs. Taints here are NoSchedule and PreferNoSchedule only: KAI's reservation pods tolerate
nothing, so kube-controller-manager would evict them from a NoExecute node (unit tests cover
NoExecute). KAI v0.12 has no topology spread filter: the planner runs with ``spread=False`` for
KAI, and the test counts the candidates kube-scheduler's spread rule would have refused.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.placement.planner import move_or_scale_up
from fracpilot_libs.placement.predicates import node_rule
from fracpilot_libs.placement.scheduling_facts import cluster_facts, pod_facts
from support.gpu_stack import KWOK_TAINT, RESERVATION_NS, GpuStack, kai_pod

pytestmark = pytest.mark.integration

LAYOUTS = 60
SEED = 26
LAYOUT = "fracpilot.test/layout"
RUN = "fracpilot.test/run"
ROLE = "fracpilot.test/role"
ZONE, POOL, TIER, SSD = (f"fracpilot.test/{k}" for k in ("zone", "pool", "tier", "ssd"))
HOSTNAME = "kubernetes.io/hostname"
GPU_MEMORY_MIB = 81559
APPS = ("db", "web", "cache")
SETTLE_S = 120.0


@dataclass
class Layout:
    index: int
    namespace: str
    nodes: list[dict[str, Any]]
    existing: list[dict[str, Any]]
    candidate: dict[str, Any]
    fraction: float


@dataclass
class Outcome:
    layout: Layout
    planner_node: str  # "" = fits nowhere
    planner_reason: str
    kai_node: str  # "" = unschedulable (or never decided: kai_state)
    kai_state: str  # bound | unschedulable | undecided
    kai_message: str = ""
    node_reasons: dict[str, str | None] = field(default_factory=dict)
    spread_refuses: bool = False  # kube-scheduler's spread rule would refuse KAI's node


# --- generated layouts ----------------------------------------------------------------------


def _node(name: str, index: int, run: str, rng: random.Random) -> dict[str, Any]:
    gpus = rng.choice((1, 2))
    labels = {
        "type": "kwok",
        HOSTNAME: name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB),
        "nvidia.com/gpu.count": str(gpus),
        LAYOUT: str(index),
        RUN: run,
        ZONE: rng.choice("ab"),
        POOL: rng.choice(("train", "infer")),
        TIER: str(rng.randint(1, 4)),
    }
    if rng.random() < 0.4:
        labels[SSD] = "true"
    taints = [KWOK_TAINT]
    roll = rng.random()
    if roll < 0.2:
        taints.append({"key": "gpu", "value": "reserved", "effect": "NoSchedule"})
    elif roll < 0.35:
        taints.append({"key": "spot", "value": "true", "effect": "PreferNoSchedule"})
    elif roll < 0.45:
        taints.append({"key": "team", "value": rng.choice("ab"), "effect": "NoSchedule"})
    resources = {
        "cpu": rng.choice(("2", "4", "8")),
        "memory": rng.choice(("8Gi", "16Gi", "32Gi")),
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {"taints": taints},
        "status": {"allocatable": resources, "capacity": resources},
    }


def _fraction_pod(
    name: str, fraction: float, run: str, labels: dict[str, str], cpu: str, memory: str
) -> dict[str, Any]:
    pod: dict[str, Any] = kai_pod(name, fraction=f"{fraction:g}")
    pod["metadata"]["labels"].update({RUN: run, **labels})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return pod


def _existing(node: dict[str, Any], index: int, run: str, rng: random.Random) -> Iterator[Any]:
    """0-2 fraction pods pinned to the node, each fitting what the earlier ones left."""
    name = node["metadata"]["name"]
    alloc = node["status"]["allocatable"]
    free_gpus = [1.0] * int(alloc["nvidia.com/gpu"])
    cpu_left = int(alloc["cpu"]) * 1000 - 500
    memory_left = int(alloc["memory"].removesuffix("Gi")) - 2
    for k in range(rng.randint(0, 3)):
        fraction = rng.choice((0.25, 0.5, 0.75))
        cpu, memory = rng.choice((250, 500, 1000, 2000)), rng.choice((1, 2, 4, 8))
        holes = [i for i, f in enumerate(free_gpus) if f >= fraction]
        if not holes or cpu > cpu_left or memory > memory_left:
            continue
        free_gpus[min(holes, key=lambda i: free_gpus[i])] -= fraction
        cpu_left, memory_left = cpu_left - cpu, memory_left - memory
        labels = {"app": rng.choice(APPS), ROLE: "existing"}
        pod = _fraction_pod(f"{name}-p{k}", fraction, run, labels, f"{cpu}m", f"{memory}Gi")
        spec = pod["spec"]
        spec["nodeSelector"] = {HOSTNAME: name}
        spec["tolerations"] = [{"operator": "Exists"}]
        if rng.random() < 0.25:  # keeps candidates off its node or zone
            spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"team": "solo"}},
                            "topologyKey": rng.choice((HOSTNAME, ZONE)),
                        }
                    ]
                }
            }
        yield pod


_EXPRESSIONS = (
    {"key": ZONE, "operator": "In", "values": ["a"]},
    {"key": ZONE, "operator": "In", "values": ["a", "b"]},
    {"key": POOL, "operator": "NotIn", "values": ["train"]},
    {"key": TIER, "operator": "Gt", "values": ["2"]},
    {"key": TIER, "operator": "Lt", "values": ["3"]},
    {"key": SSD, "operator": "Exists"},
    {"key": SSD, "operator": "DoesNotExist"},
)

_TOLERATIONS = (
    {"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"},
    {"key": "gpu", "operator": "Exists"},
    {"key": "gpu", "operator": "Equal", "value": "other", "effect": "NoSchedule"},
    {"key": "gpu", "operator": "Exists", "effect": "PreferNoSchedule"},
    {"key": "team", "operator": "Equal", "value": "a"},
    {"operator": "Exists", "effect": "NoSchedule"},
)


def _candidate(
    layout: int, run: str, nodes: list[dict[str, Any]], rng: random.Random
) -> tuple[dict[str, Any], float]:
    fraction = rng.choice((0.25, 0.5, 0.75))
    labels = {"app": "candidate", ROLE: "candidate"}
    if rng.random() < 0.4:
        labels["team"] = "solo"  # what some existing pods' anti-affinity keeps away
    cpu = rng.choice(("250m", "500m", "1", "2", "4"))
    memory = rng.choice(("1Gi", "2Gi", "4Gi", "12Gi"))
    pod = _fraction_pod(f"candidate-{layout}", fraction, run, labels, cpu, memory)
    spec = pod["spec"]
    if rng.random() < 0.25:
        spec["nodeSelector"] = {POOL: rng.choice(("train", "infer"))}
    in_layout = {"key": LAYOUT, "operator": "In", "values": [str(layout)]}
    terms: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 2)):
            term: dict[str, Any] = {"matchExpressions": rng.sample(_EXPRESSIONS, rng.randint(1, 2))}
            if rng.random() < 0.15:
                picked = rng.choice(nodes)["metadata"]["name"]
                term["matchFields"] = [
                    {"key": "metadata.name", "operator": "In", "values": [picked]}
                ]
            terms.append(term)
    terms = [{**t, "matchExpressions": [*t["matchExpressions"], in_layout]} for t in terms]
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms or [{"matchExpressions": [in_layout]}]
            }
        }
    }
    if rng.random() < 0.2:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": rng.choice(APPS)}},
                    "topologyKey": rng.choice((HOSTNAME, ZONE)),
                }
            ]
        }
    if rng.random() < 0.15:
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": rng.choice(APPS)}},
                    "topologyKey": rng.choice((HOSTNAME, ZONE)),
                }
            ]
        }
    spec["affinity"] = affinity
    spec["tolerations"] += rng.sample(_TOLERATIONS, rng.randint(0, 3))
    if rng.random() < 0.25:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": rng.choice((ZONE, HOSTNAME)),
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {
                    "matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "web"]}]
                },
            }
        ]
    return pod, fraction


def _spread_layout(i: int, run: str) -> Layout:
    """KAI v0.12 runs no topology spread filter: zone a holds two web pods, zone b's node is
    tainted. kube-scheduler would refuse both nodes to a candidate spreading web pods by zone
    (skew 2 > 1 on a); KAI binds it on a, as the planner does with ``spread=False``."""
    rng = random.Random(i)
    nodes = [_node(f"pa-{run}-{i}-{zone}", i, run, rng) for zone in "ab"]
    for node, zone in zip(nodes, "ab", strict=True):
        node["metadata"]["labels"][ZONE] = zone
        node["metadata"]["labels"].pop(SSD, None)
        node["spec"]["taints"] = [KWOK_TAINT]
        node["status"]["allocatable"].update(cpu="8", memory="32Gi")  # capacity is the same
    nodes[1]["spec"]["taints"].append({"key": "gpu", "value": "reserved", "effect": "NoSchedule"})
    a = nodes[0]["metadata"]["name"]
    existing = []
    for k in range(2):
        web = _fraction_pod(f"{a}-w{k}", 0.25, run, {"app": "web", ROLE: "existing"}, "250m", "1Gi")
        web["spec"].update(nodeSelector={HOSTNAME: a}, tolerations=[{"operator": "Exists"}])
        existing.append(web)
    labels = {"app": "candidate", ROLE: "candidate"}
    candidate = _fraction_pod(f"candidate-{i}", 0.25, run, labels, "250m", "1Gi")
    in_layout = {"key": LAYOUT, "operator": "In", "values": [str(i)]}
    candidate["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [in_layout]}]
            }
        }
    }
    candidate["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    return Layout(i, f"pa-{run}-{i}", nodes, existing, candidate, 0.25)


def _layouts(run: str) -> list[Layout]:
    rng = random.Random(SEED)
    layouts = []
    for i in range(LAYOUTS):
        nodes = [_node(f"pa-{run}-{i}-{j}", i, run, rng) for j in range(rng.randint(1, 3))]
        existing = [p for n in nodes for p in _existing(n, i, run, rng)]
        candidate, fraction = _candidate(i, run, nodes, rng)
        layouts.append(Layout(i, f"pa-{run}-{i}", nodes, existing, candidate, fraction))
    layouts.append(_spread_layout(LAYOUTS, run))
    return layouts


# --- the cluster's answers -------------------------------------------------------------------


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}


def _state(pod: dict[str, Any]) -> str:
    if pod["spec"].get("nodeName"):
        return "bound"
    scheduled = _conditions(pod).get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return "unschedulable"
    return "undecided"


def _settle(stack: GpuStack, selector: str, expected: int, timeout: float) -> list[Any]:
    """The pods of ``selector`` once each is bound or Unschedulable (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        pods: list[Any] = stack.items("Pod", selector=selector)
        decided = [p for p in pods if _state(p) != "undecided"]
        if (len(pods) == expected and len(decided) == expected) or time.monotonic() > deadline:
            return pods
        time.sleep(1.0)


def _wait_nodes_ready(stack: GpuStack, run: str, expected: int) -> None:
    def ready() -> bool | None:
        ok = 0
        for node in stack.items("Node", selector=f"{RUN}={run}"):
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            ok += conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints
        return True if ok == expected else None

    stack.wait(ready, f"{expected} layout nodes Ready", timeout=120)


def _planner_answers(
    layouts: list[Layout], nodes: list[Any], pods: list[Any], reservations: list[Any]
) -> dict[int, tuple[str, str, dict[str, str | None], Any, Any]]:
    """Per layout: the planner's node ("" = nowhere), its reason, each node's predicate answer."""
    answers = {}
    for layout in layouts:
        mine = [n for n in nodes if n["metadata"]["labels"].get(LAYOUT) == str(layout.index)]
        names = {n["metadata"]["name"] for n in mine}
        placed = [p for p in pods if p["metadata"]["namespace"] == layout.namespace]
        placed += [r for r in reservations if r["spec"].get("nodeName") in names]
        inventory = build_inventory(
            mine, placed, cluster="agreement", default_gpu_memory_mib=GPU_MEMORY_MIB
        )
        facts = cluster_facts(mine, placed)
        candidate = {**layout.candidate}
        candidate["metadata"] = {**candidate["metadata"], "namespace": layout.namespace}
        pod = pod_facts(candidate)
        rule = node_rule(pod, facts, spread=False)
        state = inventory.state
        workload = WorkloadRef(
            cluster="agreement", namespace=layout.namespace, owner_kind="Pod", owner_name="c"
        )
        base = {
            "workload": workload,
            "fraction_before": None,
            "fraction_after": layout.fraction,
            "gpu_before": "",
        }
        plan = move_or_scale_up(state, "", layout.fraction, base, state.free, None, rule)
        reasons = {n: rule(n) for n in sorted(names)}
        answers[layout.index] = (
            inventory.gpu_node(plan.gpu_after),
            plan.reason,
            reasons,
            pod,
            facts,
        )
    return answers


@pytest.mark.timeout(420)
def test_the_planner_places_fraction_pods_where_kai_does(
    gpu_stack: GpuStack, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    run = uuid.uuid4().hex[:6]
    layouts = _layouts(run)
    core = client.CoreV1Api(gpu_stack.api)
    node_count = sum(len(layout.nodes) for layout in layouts)
    existing_count = sum(len(layout.existing) for layout in layouts)
    try:
        for layout in layouts:
            gpu_stack.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": layout.namespace}}
            )
            for node in layout.nodes:
                gpu_stack.create(node)
        _wait_nodes_ready(gpu_stack, run, node_count)
        for layout in layouts:
            for pod in layout.existing:
                gpu_stack.create(pod, layout.namespace)
        existing = _settle(gpu_stack, f"{RUN}={run},{ROLE}=existing", existing_count, SETTLE_S)
        for pod in existing:  # what KAI could not place stays out of both answers
            if _state(pod) != "bound":
                core.delete_namespaced_pod(
                    pod["metadata"]["name"], pod["metadata"]["namespace"], grace_period_seconds=0
                )
        setup_s = time.monotonic() - started

        nodes = gpu_stack.items("Node", selector=f"{RUN}={run}")
        pods = [p for p in gpu_stack.items("Pod", selector=f"{RUN}={run}") if _state(p) == "bound"]
        answers = _planner_answers(layouts, nodes, pods, gpu_stack.items("Pod", RESERVATION_NS))

        for layout in layouts:
            gpu_stack.create(layout.candidate, layout.namespace)
        candidates = _settle(gpu_stack, f"{RUN}={run},{ROLE}=candidate", len(layouts), SETTLE_S)
        time.sleep(3)  # a late bind after an early Unschedulable
        candidates = gpu_stack.items("Pod", selector=f"{RUN}={run},{ROLE}=candidate")
    finally:
        for layout in layouts:
            for node in layout.nodes:
                with contextlib.suppress(client.ApiException):
                    core.delete_node(node["metadata"]["name"])
            with contextlib.suppress(client.ApiException):
                core.delete_namespace(layout.namespace)

    by_layout = {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in candidates}
    outcomes = []
    for layout in layouts:
        planner_node, reason, node_reasons, pod_facts_, facts = answers[layout.index]
        pod = by_layout[layout.index]
        state = _state(pod)
        scheduled = _conditions(pod).get("PodScheduled") or {}
        kai_node = pod["spec"].get("nodeName") or ""
        spread_refuses = bool(
            kai_node
            and pod_facts_.spread
            and node_rule(pod_facts_, facts, spread=True)(kai_node) is not None
        )
        outcomes.append(
            Outcome(
                layout,
                planner_node,
                reason,
                kai_node,
                state,
                str(scheduled.get("message") or ""),
                node_reasons,
                spread_refuses,
            )
        )
    figures = _figures(outcomes, node_count, existing_count, time.monotonic() - started, setup_s)
    _report(figures, outcomes, Path(request.config.rootpath))

    assert figures["layouts"] >= 50
    assert figures["undecided"] == 0, "KAI decided every candidate within the bounded wait"
    assert figures["fits_somewhere_agreement"] >= 0.95, figures
    assert figures["same_node_agreement"] >= 0.8, figures
    assert figures["kube_scheduler_spread_would_refuse"] >= 1, "KAI ignored the spread layout"


# --- figures ---------------------------------------------------------------------------------


def _figures(
    outcomes: list[Outcome], nodes: int, existing: int, wall_s: float, setup_s: float
) -> dict[str, Any]:
    n = len(outcomes)
    decided = [o for o in outcomes if o.kai_state != "undecided"]
    somewhere = sum(bool(o.planner_node) == bool(o.kai_node) for o in decided)
    same = sum(o.planner_node == o.kai_node for o in decided)
    kinds = Counter(
        "both place" if o.planner_node and o.kai_node else
        "both refuse" if not o.planner_node and not o.kai_node else
        "only KAI places" if o.kai_node else "only the planner places"
        for o in decided
    )  # fmt: skip
    refusals = Counter(
        _category(why) for o in outcomes for why in o.node_reasons.values() if why is not None
    )
    return {
        "layouts": n,
        "nodes": nodes,
        "existing_pods": existing,
        "undecided": n - len(decided),
        "outcomes": dict(kinds),
        "fits_somewhere_agreement": somewhere / n if n else 0.0,
        "same_node_agreement": same / n if n else 0.0,
        "kube_scheduler_spread_would_refuse": sum(o.spread_refuses for o in outcomes),
        "node_refusals_by_predicate": dict(refusals.most_common()),
        "nodes_admitting_but_no_gpu_room": sum(
            not o.planner_node and all(w is None for w in o.node_reasons.values()) for o in outcomes
        ),
        "wall_s": round(wall_s, 1),
        "setup_s": round(setup_s, 1),
    }


def _category(reason: str) -> str:
    """The predicate a node refusal names (its text after "node <name>: ")."""
    text = reason.split(": ", 1)[1]
    if "anti-affinity" in text:
        return "pod anti-affinity"
    if text.startswith("insufficient"):
        return " ".join(text.split()[:2])
    for name in ("taint", "nodeSelector", "required node affinity", "pod affinity"):
        if text.startswith(name):
            return name
    return text.split(" (")[0]


def _report(figures: dict[str, Any], outcomes: list[Outcome], root: Path) -> None:
    print("\nplanner vs KAI-Scheduler:", json.dumps(figures))
    disagreements = []
    for o in outcomes:
        if o.planner_node == o.kai_node:
            continue
        kind = "same answer, other node" if o.planner_node and o.kai_node else "DISAGREE"
        line = {
            "layout": o.layout.index,
            "kind": kind,
            "planner": o.planner_node or "nowhere",
            "kai": o.kai_node or o.kai_state,
            "planner_reason": o.planner_reason,
            "kai_message": o.kai_message[:300],
            "node_predicates": o.node_reasons,
        }
        disagreements.append(line)
        print(json.dumps(line))
    out = root / ".pytest_cache" / "planner-kai-agreement.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"figures": figures, "differences": disagreements}, indent=1))
