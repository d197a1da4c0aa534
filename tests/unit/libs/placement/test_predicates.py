"""kube-scheduler's filters as fracpilot models them (fracpilot_libs.placement.predicates).

Each case is a behaviour of kube-scheduler's own plugins (v1.35): the comments name the rule.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.placement.planner import (
    ClusterState,
    Gpu,
    Placement,
    plan_pod,
    plan_workload,
)
from fracpilot_libs.placement.predicates import node_fits, node_ok_for, node_rule
from fracpilot_libs.placement.quantities import Resources, quantity
from fracpilot_libs.placement.scheduling_facts import (
    ClusterFacts,
    NodeFacts,
    PodFacts,
    Taint,
    cluster_facts,
    node_facts,
    pod_facts,
    pod_requests,
)

GIB = 2**30


def raw_node(
    name: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    cpu: str = "8",
    memory: str = "32Gi",
    pods: str = "110",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], **spec},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}},
    }


def raw_pod(
    name: str = "p",
    namespace: str = "ns",
    node: str = "",
    labels: dict[str, str] | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [{"name": "main", "resources": {"requests": requests}}],
            **spec,
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


def fits(pod: dict[str, Any], node: dict[str, Any], *others: Any, extra: Any = ()) -> str | None:
    """node_fits for a raw pod on a raw node, with ``others`` (raw pods) already placed."""
    facts = cluster_facts([node, *extra], others)
    return node_fits(pod_facts(pod), facts.nodes[node["metadata"]["name"]], facts)


def affinity(**kinds: Any) -> dict[str, Any]:
    return {"affinity": kinds}


def required_nodes(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


# --- quantities and requests -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2", "2"), ("1Gi", str(GIB)), ("1e3", "1000"), ("1.5k", "1500")],
)
def test_quantities(text: str, value: str) -> None:
    assert quantity(text) == quantity(value)


def test_quantities_as_the_placeholders_copy_them() -> None:
    assert quantity("500m") == Decimal("0.5")
    assert quantity("2Gi") == 2 * 1024**3
    assert quantity("1e3") == 1000
    assert quantity(2) == 2
    assert quantity("1.5k") == 1500


def test_a_bad_quantity_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity("lots")


def test_the_request_is_the_larger_of_the_containers_sum_and_each_init_container() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == Resources(cpu_milli=2100, memory=GIB)


def test_sidecars_run_beside_the_containers_and_later_init_containers() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "1200m"}}},  # runs beside the sidecar: 1700m
        ],
    }
    assert pod_requests(spec).cpu_milli == 1700


def test_a_limit_without_a_request_is_the_request() -> None:
    spec = {"containers": [{"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}
    assert pod_requests(spec) == Resources(cpu_milli=2000, memory=GIB)


# --- taints ----------------------------------------------------------------------------------


def test_an_untolerated_noschedule_taint_refuses_the_node() -> None:
    node = raw_node("gpu-2", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])
    assert fits(raw_pod(), node) == "node gpu-2: taint gpu=reserved:NoSchedule not tolerated"


def test_noexecute_refuses_and_prefer_noschedule_does_not() -> None:
    execute = raw_node("n", taints=[{"key": "k", "effect": "NoExecute"}])
    prefer = raw_node("n", taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    assert fits(raw_pod(), execute) == "node n: taint k:NoExecute not tolerated"
    assert fits(raw_pod(), prefer) is None


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "reserved"}, True),  # no operator: Equal; no effect: any
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # no key with Exists: every taint
        ({"key": "gpu", "operator": "Equal", "value": "other"}, False),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "Gt", "value": "1"}, False),  # alpha, off by default
    ],
)
def test_tolerations_match_as_kube_scheduler_matches_them(
    toleration: dict[str, str], tolerated: bool
) -> None:
    node = raw_node("n", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])
    assert (fits(raw_pod(tolerations=[toleration]), node) is None) is tolerated


def test_a_cordoned_node_takes_only_pods_tolerating_it() -> None:
    node = raw_node("n", unschedulable=True)
    assert fits(raw_pod(), node) == "node n: cordoned (spec.unschedulable)"
    tolerating = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    assert fits(raw_pod(tolerations=tolerating), node) is None


# --- node selector and node affinity ------------------------------------------------------------


def test_node_selector_needs_every_label() -> None:
    node = raw_node("n", labels={"pool": "train", "zone": "a"})
    assert fits(raw_pod(nodeSelector={"pool": "train", "zone": "a"}), node) is None
    assert fits(raw_pod(nodeSelector={"pool": "infer"}), node) == (
        "node n: nodeSelector pool=infer not matched (node has pool=train)"
    )
    assert "node has no ssd" in str(fits(raw_pod(nodeSelector={"ssd": "true"}), node))


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("missing", "NotIn", "b"), True),  # NotIn matches a node without the label
        (expr("zone", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("tier", "Gt", "2"), True),
        (expr("tier", "Gt", "3"), False),
        (expr("tier", "Lt", "4"), True),
        (expr("zone", "Gt", "1"), False),  # not an integer: no match
        (expr("missing", "Lt", "9"), False),
    ],
)
def test_match_expressions(expression: dict[str, Any], matches: bool) -> None:
    node = raw_node("n", labels={"zone": "a", "tier": "3"})
    pod = raw_pod(**affinity(**required_nodes({"matchExpressions": [expression]})))
    assert (fits(pod, node) is None) is matches


def test_terms_are_ored_and_expressions_anded() -> None:
    node = raw_node("n", labels={"zone": "a", "pool": "train"})
    both = {"matchExpressions": [expr("zone", "In", "a"), expr("pool", "In", "infer")]}
    either = [
        {"matchExpressions": [expr("zone", "In", "b")]},
        {"matchExpressions": [expr("pool", "In", "train")]},
    ]
    refused = fits(raw_pod(**affinity(**required_nodes(both))), node)
    assert refused == (
        "node n: required node affinity: no term matches (pool In [infer] (node has pool=train))"
    )
    assert fits(raw_pod(**affinity(**required_nodes(*either))), node) is None


def test_an_empty_term_or_no_terms_match_nothing() -> None:
    node = raw_node("n")
    assert fits(raw_pod(**affinity(**required_nodes({}))), node) is not None
    assert fits(raw_pod(**affinity(**required_nodes())), node) is not None


def test_match_fields_pick_a_node_by_name() -> None:
    field = {"matchFields": [expr("metadata.name", "In", "n1")]}
    pod = raw_pod(**affinity(**required_nodes(field)))
    assert fits(pod, raw_node("n1")) is None
    assert "field metadata.name In [n1]" in str(fits(pod, raw_node("n2")))


def test_node_selector_and_affinity_both_apply() -> None:
    node = raw_node("n", labels={"zone": "a"})
    pod = raw_pod(
        nodeSelector={"zone": "a"},
        **affinity(**required_nodes({"matchExpressions": [expr("zone", "In", "b")]})),
    )
    assert "required node affinity" in str(fits(pod, node))


# --- resources -------------------------------------------------------------------------------


def test_resources_count_the_pods_already_there() -> None:
    node = raw_node("n", cpu="4", memory="8Gi")
    there = raw_pod("old", node="n", cpu="3", memory="2Gi")
    assert fits(raw_pod(cpu="1", memory="6Gi"), node, there) is None  # exactly full fits
    assert fits(raw_pod(cpu="1500m"), node, there) == (
        "node n: insufficient cpu (asks 1500m, 3000m of 4000m requested already)"
    )
    assert "insufficient memory" in str(fits(raw_pod(memory="7Gi"), node, there))


def test_terminal_pods_do_not_count_and_terminating_ones_do() -> None:
    node = raw_node("n", cpu="4")
    done = {**raw_pod("done", node="n", cpu="4"), "status": {"phase": "Succeeded"}}
    assert fits(raw_pod(cpu="4"), node, done) is None
    leaving = raw_pod("leaving", node="n", cpu="4")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert "insufficient cpu" in str(fits(raw_pod(cpu="1"), node, leaving))


def test_the_pod_count_is_a_limit_even_for_a_pod_asking_nothing() -> None:
    node = raw_node("n", pods="1")
    assert fits(raw_pod(), node, raw_pod("old", node="n")) == (
        "node n: too many pods (1 of 1 allowed)"
    )


def test_a_resource_the_node_does_not_report_is_not_checked() -> None:
    node = raw_node("n")
    node["status"]["allocatable"] = {}
    assert node_facts(node).reported == frozenset()
    assert fits(raw_pod(cpu="64", memory="1Ti"), node) is None


# --- inter-pod affinity ------------------------------------------------------------------------

HOST, ZONE = "kubernetes.io/hostname", "zone"


def pod_term(key: str, **labels: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key}


def anti(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def near(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def test_anti_affinity_refuses_the_domain_with_a_matching_pod() -> None:
    n1, n2 = raw_node("n1", {"zone": "a"}), raw_node("n2", {"zone": "a"})
    db = raw_pod("db", node="n1", labels={"app": "db"})
    by_host = raw_pod(**affinity(**anti(pod_term(HOST, app="db"))))
    by_zone = raw_pod(**affinity(**anti(pod_term(ZONE, app="db"))))
    assert fits(by_host, n2, db, extra=[n1]) is None
    assert fits(by_zone, n2, db, extra=[n1]) == (
        "node n2: pod anti-affinity (app=db by zone): pod ns/db is in the same zone=a"
    )


def test_anti_affinity_looks_in_the_pods_own_namespace_unless_told() -> None:
    node = raw_node("n")
    other_ns = raw_pod("db", namespace="other", node="n", labels={"app": "db"})
    mine = raw_pod(**affinity(**anti(pod_term(HOST, app="db"))))
    assert fits(mine, node, other_ns) is None
    everywhere = {**pod_term(HOST, app="db"), "namespaceSelector": {}}
    assert fits(raw_pod(**affinity(**anti(everywhere))), node, other_ns) is not None
    listed = {**pod_term(HOST, app="db"), "namespaces": ["other"]}
    assert fits(raw_pod(**affinity(**anti(listed))), node, other_ns) is not None


def test_existing_pods_anti_affinity_keeps_the_pod_away() -> None:
    node = raw_node("n")
    loner = raw_pod("loner", node="n", **affinity(**anti(pod_term(HOST, team="solo"))))
    assert fits(raw_pod(labels={"team": "other"}), node, loner) is None
    assert fits(raw_pod(labels={"team": "solo"}), node, loner) == (
        "node n: pod ns/loner on n has anti-affinity to it "
        "(team=solo by kubernetes.io/hostname: same kubernetes.io/hostname=n)"
    )


def test_affinity_needs_a_matching_pod_in_the_domain() -> None:
    n1, n2 = raw_node("n1", {"zone": "a"}), raw_node("n2", {"zone": "b"})
    db = raw_pod("db", node="n1", labels={"app": "db"})
    pod = raw_pod(**affinity(**near(pod_term(ZONE, app="db"))))
    assert fits(pod, n1, db, extra=[n2]) is None
    assert fits(pod, n2, db, extra=[n1]) == (
        "node n2: pod affinity (app=db by zone): no matching pod in zone=b"
    )
    no_zone = raw_node("n3")
    assert "node has no label zone" in str(fits(pod, no_zone, db, extra=[n1]))


def test_the_first_pod_of_a_group_may_go_where_none_is_yet() -> None:
    node = raw_node("n", {"zone": "a"})
    first = raw_pod(labels={"app": "db"}, **affinity(**near(pod_term(ZONE, app="db"))))
    assert fits(first, node) is None
    stranger = raw_pod(labels={"app": "web"}, **affinity(**near(pod_term(ZONE, app="db"))))
    assert fits(stranger, node) is not None


# --- topology spread -------------------------------------------------------------------------


def spread(key: str, max_skew: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": max_skew,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
                **extra,
            }
        ]
    }


def test_spread_refuses_a_domain_that_would_be_too_far_ahead() -> None:
    a, b = raw_node("a1", {"zone": "a"}), raw_node("b1", {"zone": "b"})
    webs = [raw_pod(f"w{i}", node="a1", labels={"app": "web"}) for i in range(2)]
    pod = raw_pod(labels={"app": "web"}, **spread(ZONE))
    facts = cluster_facts([a, b], webs)
    assert node_fits(pod_facts(pod), facts.nodes["b1"], facts) is None
    assert node_fits(pod_facts(pod), facts.nodes["a1"], facts) == (
        "node a1: topology spread on zone: skew 3 > maxSkew 1 (zone=a has 2 matching, the fewest 0)"
    )
    assert node_fits(pod_facts(pod), facts.nodes["a1"], facts, spread=False) is None


def test_spread_ignores_schedule_anyway_and_needs_the_key_on_the_node() -> None:
    node = raw_node("n")
    anyway = raw_pod(**spread(ZONE, whenUnsatisfiable="ScheduleAnyway"))
    assert pod_facts(anyway).spread == ()
    assert fits(raw_pod(**spread(ZONE)), node) == "node n: topology spread: node has no label zone"


def test_min_domains_counts_missing_domains_as_empty() -> None:
    a = raw_node("a1", {"zone": "a"})
    web = raw_pod("w", node="a1", labels={"app": "web"})
    pod = raw_pod(labels={"app": "web"}, **spread(ZONE, max_skew=1, minDomains=2))
    assert "skew 2 > maxSkew 1" in str(fits(pod, a, web))
    assert fits(raw_pod(labels={"app": "web"}, **spread(ZONE)), a, web) is None


def test_spread_counts_only_nodes_matching_the_pods_node_affinity() -> None:
    a = raw_node("a1", {"zone": "a", "pool": "x"})
    b = raw_node("b1", {"zone": "b", "pool": "y"})
    web = raw_pod("w", node="a1", labels={"app": "web"})
    pod = raw_pod(labels={"app": "web"}, nodeSelector={"pool": "x"}, **spread(ZONE))
    assert fits(pod, a, web, extra=[b]) is None  # zone b is not a domain for this pod


# --- the rule the planner gets -----------------------------------------------------------------


def test_the_rule_leaves_the_pod_itself_out() -> None:
    node = raw_node("n", cpu="4")
    me = raw_pod("me", node="n", cpu="3")
    facts = cluster_facts([node], [me])
    assert node_rule(pod_facts(me), facts)("n") is None  # its own 3 CPUs are freed
    assert node_rule(pod_facts(me), facts)("gone") == "node gone: not known"


WL = WorkloadRef(cluster="c", namespace="ns", owner_kind="Deployment", owner_name="chat")


def two_gpus() -> ClusterState:
    return ClusterState(
        gpus=(
            Gpu(uuid="GPU-a", node="a", memory_bytes=GIB),
            Gpu(uuid="GPU-b", node="b", memory_bytes=GIB),
            Gpu(uuid="GPU-c", node="c", memory_bytes=GIB),
        ),
        placements=(
            Placement(workload=WL, pod="p0", gpu_uuid="GPU-a", fraction=0.5),
            Placement(workload=WL, pod="p1", gpu_uuid="GPU-a", fraction=0.5),
        ),
    )


def test_the_planner_skips_refused_nodes_and_says_why_when_none_is_left() -> None:
    state = two_gpus()
    refusals = {"b": "node b: taint gpu=reserved:NoSchedule not tolerated"}
    plan = plan_pod(state, state.placements[0], 0.75, node_ok=refusals.get)
    assert (plan.kind, plan.gpu_after) == (PlanKind.RECREATE_ELSEWHERE, "GPU-c")
    assert "1 node(s) with room refused it" in plan.reason
    refusals["c"] = "node c: nodeSelector pool=x not matched (node has no pool)"
    plan = plan_pod(state, state.placements[0], 0.75, node_ok=refusals.get)
    assert plan.kind is PlanKind.SCALE_UP
    assert plan.reason == (
        "0.75 fits nowhere the pod may go: node b: taint gpu=reserved:NoSchedule not "
        "tolerated; node c: nodeSelector pool=x not matched (node has no pool); capacity must "
        "be added before the pod moves"
    )


def test_a_fit_on_its_own_gpu_does_not_ask_unless_the_pod_is_recreated() -> None:
    state = two_gpus()
    no = {"a": "node a: taint t:NoSchedule not tolerated"}
    assert plan_pod(state, state.placements[0], 0.25, node_ok=no.get).kind is PlanKind.IN_PLACE
    plan = plan_pod(state, state.placements[0], 0.25, in_place=False, node_ok=no.get)
    assert (plan.kind, plan.gpu_after) == (PlanKind.RECREATE_ELSEWHERE, "GPU-b")
    assert plan.reason.startswith("its own GPU GPU-a holds 0.25, but node a: taint")


def test_replicas_with_anti_affinity_are_planned_onto_different_nodes() -> None:
    other = WL.model_copy(update={"owner_name": "other"})
    state = ClusterState(
        gpus=tuple(
            Gpu(uuid=f"GPU-{g}", node=g[0], memory_bytes=GIB) for g in ("a", "b1", "b2", "c")
        ),
        placements=(
            Placement(workload=other, pod="o", gpu_uuid="GPU-a", fraction=0.5),
            Placement(workload=WL, pod="p0", gpu_uuid="GPU-a", fraction=0.25),
            Placement(workload=WL, pod="p1", gpu_uuid="GPU-a", fraction=0.25),
        ),
    )
    one_per_node = affinity(**anti(pod_term(HOST, app="chat")))
    pods = [raw_pod(f"p{i}", node="a", labels={"app": "chat"}, **one_per_node) for i in range(2)]
    facts = cluster_facts([raw_node(n) for n in "abc"], pods)
    mine = state.placements[1:]
    anywhere = plan_workload(state, WL, mine, 0.75)
    assert [s.gpu_after for s in anywhere.steps] == ["GPU-b1", "GPU-b2"]
    apart = plan_workload(state, WL, mine, 0.75, node_ok_for=node_ok_for(facts))
    assert [s.gpu_after for s in apart.steps] == ["GPU-b1", "GPU-c"]


# --- properties ------------------------------------------------------------------------------

labels_st = st.dictionaries(st.sampled_from(["zone", "pool", "tier"]), st.sampled_from("ab12"))
taint_st = st.builds(
    Taint,
    key=st.sampled_from(["gpu", "team", "spot"]),
    value=st.sampled_from(["", "x", "y"]),
    effect=st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
)


@settings(max_examples=200, deadline=None)
@given(
    labels=labels_st,
    taints=st.lists(taint_st.filter(lambda t: t.effect == "PreferNoSchedule"), max_size=2),
    cpu=st.integers(0, 4000),
    memory=st.integers(0, 8 * GIB),
)
def test_an_unconstrained_pod_fits_a_node_with_room(
    labels: dict[str, str], taints: list[Taint], cpu: int, memory: int
) -> None:
    node = NodeFacts("n", labels, tuple(taints), Resources(4000, 8 * GIB, 0))
    pod = PodFacts("ns", "p", requests=Resources(cpu, memory))
    assert node_fits(pod, node, ClusterFacts({"n": node}, {})) is None


@settings(max_examples=200, deadline=None)
@given(labels=labels_st, taints=st.lists(taint_st, max_size=2), blocking=taint_st)
def test_an_untolerated_blocking_taint_never_fits(
    labels: dict[str, str], taints: list[Taint], blocking: Taint
) -> None:
    blocking = Taint(blocking.key, blocking.value, "NoSchedule")
    node = NodeFacts("n", labels, (*taints, blocking), Resources(4000, GIB, 0))
    assert node_fits(PodFacts("ns", "p"), node, ClusterFacts({"n": node}, {})) is not None


@settings(max_examples=150, deadline=None)
@given(
    free=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=2, max_size=5),
    refused=st.lists(st.booleans(), min_size=5, max_size=5),
    new=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
)
def test_the_planner_never_recreates_onto_a_refused_node(
    free: list[float], refused: list[bool], new: float
) -> None:
    gpus = tuple(Gpu(uuid=f"GPU-{i}", node=f"n{i}", memory_bytes=GIB) for i in range(len(free)))
    holders = tuple(
        Placement(
            workload=WL.model_copy(update={"owner_name": f"w{i}"}),
            pod=f"w{i}",
            gpu_uuid=f"GPU-{i}",
            fraction=1 - f,
        )
        for i, f in enumerate(free)
        if f < 1
    )
    mine = Placement(workload=WL, pod="me", gpu_uuid="GPU-0", fraction=0.25)
    state = ClusterState(gpus=gpus, placements=(*holders, mine))
    no = {f"n{i}": f"node n{i}: refused" for i, r in enumerate(refused) if r}
    plan = plan_pod(state, mine, new, in_place=False, node_ok=no.get)
    if plan.kind is PlanKind.RECREATE_ELSEWHERE:
        assert state.gpu(plan.gpu_after) is not None
        assert f"n{plan.gpu_after.removeprefix('GPU-')}" not in no
