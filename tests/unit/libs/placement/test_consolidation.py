"""The consolidation planner (fracpilot_libs.placement.consolidation): which pods move so that whole
nodes, then whole cards, come free, and never a move that breaks a predicate, a PDB, a gang, an
autoscaler opt-out or a card's budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.hami.placement import hami_fit
from fracpilot_libs.placement.card_budget import TenantForecast
from fracpilot_libs.placement.consolidation import (
    DO_NOT_DISRUPT,
    SAFE_TO_EVICT,
    SCALE_DOWN_DISABLED,
    consolidation_plan,
)
from fracpilot_libs.placement.consolidation_limits import (
    CardBudget,
    DisruptionBudget,
    Gang,
    pooled_card_budget,
)
from fracpilot_libs.placement.consolidation_steps import (
    Candidate,
    ConsolidationPlan,
    StepKind,
    apply_consolidation,
)
from fracpilot_libs.placement.planner import ClusterState, Gpu, Placement, apply_pod_plan
from fracpilot_libs.placement.predicates import node_rule
from fracpilot_libs.placement.quantities import Resources
from fracpilot_libs.placement.scheduling_facts import (
    ClusterFacts,
    LabelSelector,
    NodeFacts,
    PodAffinityTerm,
    PodFacts,
    Taint,
    Toleration,
    pods_by_node,
)

GIB = 2**30
EPS = 1e-9
Layout = Mapping[str, Mapping[str, list[tuple[str, float]]]]  # node -> card -> [(pod, share)]


def cluster(layout: Layout) -> ClusterState:
    gpus, placements = [], []
    for node, cards in layout.items():
        for uuid, pods in cards.items():
            gpus.append(Gpu(uuid=uuid, node=node, memory_bytes=80 * GIB))
            for pod, fraction in pods:
                ref = WorkloadRef(namespace="ns", owner_name=pod)
                placements.append(
                    Placement(workload=ref, pod=pod, gpu_uuid=uuid, fraction=fraction)
                )
    return ClusterState(gpus=tuple(gpus), placements=tuple(placements))


def facts_for(
    state: ClusterState,
    taints: Mapping[str, tuple[Taint, ...]] | None = None,
    tolerations: Mapping[str, tuple[Toleration, ...]] | None = None,
) -> ClusterFacts:
    node_of = {g.uuid: g.node for g in state.gpus}
    nodes = {
        n: NodeFacts(name=n, labels={"kubernetes.io/hostname": n}, taints=(taints or {}).get(n, ()))
        for n in state.nodes
    }
    pods = [
        PodFacts(
            namespace="ns",
            name=p.pod,
            node=node_of[p.gpu_uuid],
            tolerations=(tolerations or {}).get(p.pod, ()),
        )
        for p in state.placements
    ]
    return ClusterFacts(nodes, pods_by_node(pods))


TWO_NODES: Layout = {"n1": {"g1": [("a", 0.25)]}, "n2": {"g2": [("b", 0.25)]}}


def moved(plan: ConsolidationPlan) -> list[tuple[str, str]]:
    return [(s.placement.pod, s.to_gpu) for s in plan.moves]


# --- hand-made cases ---------------------------------------------------------------------------


def test_two_nodes_one_pod_each_one_move_frees_a_node() -> None:
    state = cluster(TWO_NODES)
    plan = consolidation_plan(state, max_moves=10, facts=facts_for(state))
    assert moved(plan) == [("a", "g2")]  # n1 comes first by name; b's card is the best fit
    assert plan.freed_nodes == ("n1",)
    assert plan.emptied_gpus == ("g1",)
    assert plan.cards_freed == 1
    assert plan.gpus_on_freed_nodes == 1
    (step,) = plan.steps
    assert (step.from_node, step.to_node, step.frees, step.frees_name) == (
        "n1",
        "n2",
        Candidate.NODE,
        "n1",
    )
    after = apply_consolidation(state, plan)
    assert {p.pod: p.gpu_uuid for p in after.placements} == {"a": "g2", "b": "g2"}
    # n2 received a pod, so it is no candidate; g2 neither
    assert {r.name for r in plan.refused} == {"n2", "g2"}
    assert plan.summary().startswith("would free 1 GPU(s) and 1 node(s) (1 GPUs on them)")


def test_the_move_is_the_planners_recreate_step() -> None:
    state = cluster(TWO_NODES)
    (step,) = consolidation_plan(state, max_moves=10).steps
    resize = step.as_resize_plan()
    assert (resize.kind.value, resize.gpu_before, resize.gpu_after, resize.pod) == (
        "recreate_elsewhere",
        "g1",
        "g2",
        "a",
    )
    assert resize.fraction_before == resize.fraction_after == 0.25
    assert apply_pod_plan(state, resize).placements[0].gpu_uuid == "g2"


def test_a_node_with_scale_down_disabled_is_not_emptied() -> None:
    state = cluster(TWO_NODES)
    notes = {"n1": {SCALE_DOWN_DISABLED: "true"}}
    plan = consolidation_plan(state, max_moves=10, node_annotations=notes)
    assert moved(plan) == [("b", "g1")]  # the other node is emptied onto it instead
    assert plan.freed_nodes == ("n2",)
    both = {"n1": {SCALE_DOWN_DISABLED: "true"}, "n2": {SCALE_DOWN_DISABLED: "true"}}
    plan = consolidation_plan(state, max_moves=10, node_annotations=both)
    assert plan.steps == ()
    assert plan.freed_nodes == ()
    assert plan.cards_freed == 0
    assert all(SCALE_DOWN_DISABLED in r.reason for r in plan.refused)
    assert {r.name for r in plan.refused} == {"n1", "n2", "g1", "g2"}  # its cards stay too
    # any other value is no opt-out (cluster-autoscaler compares with "true")
    plan = consolidation_plan(
        state, max_moves=10, node_annotations={"n1": {SCALE_DOWN_DISABLED: "yes"}}
    )
    assert plan.freed_nodes == ("n1",)


def test_karpenter_do_not_disrupt_on_node_or_pod() -> None:
    state = cluster(TWO_NODES)
    plan = consolidation_plan(
        state, max_moves=10, node_annotations={"n1": {DO_NOT_DISRUPT: "true"}}
    )
    assert moved(plan) == [("b", "g1")]
    plan = consolidation_plan(
        state,
        max_moves=10,
        pod_annotations={"ns/a": {DO_NOT_DISRUPT: "true"}, "ns/b": {DO_NOT_DISRUPT: "true"}},
    )
    assert plan.steps == ()
    assert all(DO_NOT_DISRUPT in r.reason for r in plan.refused)


def test_a_pod_not_safe_to_evict_stays() -> None:
    state = cluster(TWO_NODES)
    plan = consolidation_plan(
        state, max_moves=10, pod_annotations={"ns/a": {SAFE_TO_EVICT: "false"}}
    )
    assert moved(plan) == [("b", "g1")]
    refused = {r.name: r.reason for r in plan.refused}
    assert "ns/a is annotated cluster-autoscaler.kubernetes.io/safe-to-evict=false" in refused["n1"]
    plan = consolidation_plan(
        state,
        max_moves=10,
        pod_annotations={"ns/a": {SAFE_TO_EVICT: "false"}, "ns/b": {SAFE_TO_EVICT: "false"}},
    )
    assert plan.steps == ()


def test_a_pdb_allowing_no_disruption_moves_nothing() -> None:
    state = cluster(TWO_NODES)
    pdb = DisruptionBudget("ns/web", allowed=0, pods=frozenset({"ns/a", "ns/b"}))
    plan = consolidation_plan(state, max_moves=10, disruption_budgets=[pdb])
    assert plan.steps == ()
    assert plan.freed_nodes == ()
    assert all("PodDisruptionBudget ns/web allows 0" in r.reason for r in plan.refused)


def test_a_pdb_allowing_one_gets_one_eviction_per_plan() -> None:
    layout = {f"n{i}": {f"g{i}": [(f"p{i}", 0.2)]} for i in range(1, 4)}
    state = cluster(layout)
    pdb = DisruptionBudget("ns/web", allowed=1, pods=frozenset({"ns/p1", "ns/p2", "ns/p3"}))
    plan = consolidation_plan(state, max_moves=10, disruption_budgets=[pdb])
    assert len(plan.moves) == 1
    assert plan.freed_nodes == ("n1",)
    without = consolidation_plan(state, max_moves=10)
    assert len(without.moves) == 2
    assert without.freed_nodes == ("n1", "n3")


def test_a_gang_at_min_member_is_not_taken_below_it() -> None:
    state = cluster(TWO_NODES)
    at_min = Gang("ns/train", min_member=2, running=2, pods=frozenset({"ns/a", "ns/b"}))
    plan = consolidation_plan(state, max_moves=10, gangs=[at_min])
    assert plan.steps == ()
    assert all("PodGroup ns/train runs 2 of minMember 2" in r.reason for r in plan.refused)
    one_spare = Gang("ns/train", min_member=2, running=3, pods=frozenset({"ns/a", "ns/b"}))
    assert len(consolidation_plan(state, max_moves=10, gangs=[one_spare]).moves) == 1
    own = Gang("ns/a", min_member=1, running=1, pods=frozenset({"ns/a"}))  # a pod's own group
    assert len(consolidation_plan(state, max_moves=10, gangs=[own]).moves) == 1


def test_a_tainted_target_is_refused() -> None:
    state = cluster(TWO_NODES)
    taint = Taint("dedicated", "infer", "NoSchedule")
    facts = facts_for(state, taints={"n2": (taint,)})
    plan = consolidation_plan(state, max_moves=10, facts=facts)
    # a cannot go to n2; b (already on the tainted node) may go to n1
    assert moved(plan) == [("b", "g1")]
    assert plan.freed_nodes == ("n2",)
    refused = {r.name: r.reason for r in plan.refused}
    assert "no card it may go to holds it" in refused["n1"]
    tolerated = facts_for(
        state,
        taints={"n2": (taint,)},
        tolerations={"a": (Toleration("dedicated", "Equal", "infer", "NoSchedule"),)},
    )
    assert moved(consolidation_plan(state, max_moves=10, facts=tolerated)) == [("a", "g2")]


def test_a_selector_or_resources_that_do_not_fit_refuse_the_target() -> None:
    state = cluster(TWO_NODES)
    base = facts_for(state)
    nodes = {
        "n1": NodeFacts("n1", labels={"pool": "a"}),
        "n2": NodeFacts("n2", labels={"pool": "b"}, allocatable=Resources(cpu_milli=1000)),
    }
    pods = [
        PodFacts("ns", "a", node="n1", requests=Resources(cpu_milli=800)),
        PodFacts("ns", "b", node="n2", node_selector={"pool": "b"}, requests=Resources(500)),
    ]
    del base
    plan = consolidation_plan(state, max_moves=10, facts=ClusterFacts(nodes, pods_by_node(pods)))
    # a asks 800m where b holds 500m of 1000m; b's selector keeps it on pool b
    assert plan.steps == ()
    reasons = " ".join(r.reason for r in plan.refused)
    assert "insufficient cpu" in reasons or "no card it may go to" in reasons


def test_a_pod_without_facts_is_not_moved() -> None:
    state = cluster(TWO_NODES)
    nodes = {n: NodeFacts(n) for n in ("n1", "n2")}
    facts = ClusterFacts(nodes, pods_by_node([PodFacts("ns", "b", node="n2")]))
    plan = consolidation_plan(state, max_moves=10, facts=facts)
    assert moved(plan) == [("b", "g1")]
    assert "ns/a has no scheduling facts" in {r.name: r.reason for r in plan.refused}["n1"]


def test_whole_nodes_before_single_cards() -> None:
    # n1: two cards, each a small tenant; n2: one card with one tenant, room on n1's cards.
    layout = {
        "n1": {"g1a": [("x", 0.5)], "g1b": [("y", 0.25)]},
        "n2": {"g2": [("z", 0.25)]},
    }
    state = cluster(layout)
    plan = consolidation_plan(state, max_moves=10)
    kinds = [s.frees for s in plan.steps]
    assert kinds == [Candidate.NODE, Candidate.GPU]
    assert moved(plan) == [("z", "g1a"), ("y", "g1a")]  # z frees n2, then y frees g1b
    assert plan.freed_nodes == ("n2",)
    assert plan.emptied_gpus == ("g1b", "g2")
    assert plan.cards_freed == 2


def test_a_node_is_emptied_whole_or_not_at_all() -> None:
    # n1 holds 0.6 and 0.6: only one fits on n2 (kept: scale-down disabled), so n1 is not
    # touched at all, and the move tried for it is undone
    layout = {"n1": {"g1a": [("p", 0.6)], "g1b": [("q", 0.6)]}, "n2": {"g2": [("r", 0.4)]}}
    state = cluster(layout)
    notes = {"n2": {SCALE_DOWN_DISABLED: "true"}}
    plan = consolidation_plan(state, max_moves=10, node_annotations=notes)
    refused = {r.name: r.reason for r in plan.refused}
    assert "pod ns/q (0.6) cannot move: no card it may go to holds it" in refused["n1"]
    # the cards are candidates too, one at a time: p's card is emptied onto g2, then q's
    # card cannot be (g2 is full)
    assert moved(plan) == [("p", "g2")]
    assert plan.freed_nodes == ()
    assert plan.emptied_gpus == ("g1a",)


def test_the_move_limit_holds() -> None:
    state = cluster(TWO_NODES)
    plan = consolidation_plan(state, max_moves=0)
    assert plan.steps == ()
    assert all("0 left of this plan's limit of 0" in r.reason for r in plan.refused)


def test_no_move_back_onto_the_card_being_freed() -> None:
    # emptying g1: a goes to g2, the fullest card that holds it; then the fullest card that
    # holds b is g1 itself, once b is gone: the scheduler would put b back, so g1 is refused
    layout = {"n1": {"g1": [("a", 0.2), ("b", 0.1)], "g2": [("c", 0.75)]}}
    state = cluster(layout)
    plan = consolidation_plan(
        state, max_moves=10, pod_annotations={"ns/c": {SAFE_TO_EVICT: "false"}}
    )
    refused = {r.name: r.reason for r in plan.refused}
    assert "would put it back on g1, the card being freed" in refused["g1"]
    assert plan.steps == ()


def test_an_idle_card_is_no_target_for_a_card() -> None:
    layout = {"n1": {"g0": [], "g1": [("a", 0.6)], "g2": [("b", 0.6)]}}
    plan = consolidation_plan(cluster(layout), max_moves=10)
    assert plan.steps == ()
    assert "the best fit is an idle card (g0)" in {r.name: r.reason for r in plan.refused}["g1"]


def test_hami_fit_rule_counts_slots() -> None:
    # a HAMi card with one slot, taken: the share fits but HAMi's rule refuses it
    layout: Layout = {"n1": {"g1": [("a", 0.25)]}, "n2": {"g2": [("b", 0.25)]}}
    state = cluster(layout)
    gpus = tuple(g.model_copy(update={"slots": 1}) for g in state.gpus)
    state = state.model_copy(update={"gpus": gpus})
    assert consolidation_plan(state, max_moves=10, fit=hami_fit()).steps == ()
    gpus = tuple(g.model_copy(update={"slots": 4}) for g in state.gpus)
    roomy = state.model_copy(update={"gpus": gpus})
    assert moved(consolidation_plan(roomy, max_moves=10, fit=hami_fit())) == [("a", "g2")]


def test_shared_isolation_shrinks_the_target_to_its_budget_first() -> None:
    # b holds 0.7 but its budgeted share is 0.5: a (0.4) fits only once b shrinks in place
    layout = {"n1": {"g1": [("a", 0.4)]}, "n2": {"g2": [("b", 0.7)]}}
    state = cluster(layout)

    def budget(uuid: str, tenants: Mapping[str, float]) -> Mapping[str, float] | None:
        del uuid
        shares = {"ns/a": 0.4, "ns/b": 0.5}
        return {k: shares[k] for k in tenants} if sum(shares[k] for k in tenants) <= 1 else None

    plan = consolidation_plan(state, max_moves=10, card_budget=budget)
    assert [(s.kind, s.placement.pod, s.fraction, s.to_gpu) for s in plan.steps] == [
        (StepKind.SHRINK, "b", 0.5, "g2"),
        (StepKind.MOVE, "a", 0.4, "g2"),
    ]
    assert plan.steps[0].as_resize_plan().kind.value == "in_place"
    assert len(plan.moves) == 1
    assert plan.freed_nodes == ("n1",)
    assert consolidation_plan(state, max_moves=10).steps == ()  # without budgets: no room


def test_pooled_card_budget_uses_card_budget_rules() -> None:
    forecasts = {
        "ns/a": TenantForecast(memory_peak=0.3, memory_jump=0.1, compute=0.2),
        "ns/b": TenantForecast(memory_peak=0.3, memory_jump=0.1, compute=0.2),
    }
    budget = pooled_card_budget(forecasts)
    shares = budget("g", {"ns/a": 0.5, "ns/b": 0.5})
    assert shares is not None
    assert sum(shares.values()) <= 1.0 + EPS
    assert all(s >= 0.3 for s in shares.values())  # each at least its own peak
    big = TenantForecast(memory_peak=0.7, memory_jump=0.2, compute=0.5)
    assert pooled_card_budget({"ns/a": big, "ns/b": big})("g", {"ns/a": 1, "ns/b": 1}) is None


# --- properties on random layouts ----------------------------------------------------------------

APP = LabelSelector(match_labels=(("app", "x"),))


@dataclass(frozen=True)
class Case:
    state: ClusterState
    facts: ClusterFacts | None
    node_notes: dict[str, dict[str, str]]
    pod_notes: dict[str, dict[str, str]]
    budgets: tuple[DisruptionBudget, ...]
    gangs: tuple[Gang, ...]
    max_moves: int
    card_budget: CardBudget | None


@st.composite
def cases(draw: st.DrawFn, *, rules: bool = True) -> Case:
    """A random cluster; with ``rules``, random facts, opt-outs, PDBs, gangs, limits and
    budgets too."""
    node_count = draw(st.integers(2, 5))
    gpus = [
        Gpu(uuid=f"g{n}-{i}", node=f"n{n}", memory_bytes=80 * GIB)
        for n in range(node_count)
        for i in range(draw(st.integers(1, 3)))
    ]
    used = dict.fromkeys((g.uuid for g in gpus), 0.0)
    placements = []
    for i in range(draw(st.integers(1, 14))):
        fraction = draw(st.integers(5, 60)) / 100
        room = [u for u, s in used.items() if s + fraction <= 1.0 + EPS]
        if room:
            uuid = draw(st.sampled_from(room))
            used[uuid] += fraction
            ref = WorkloadRef(namespace="ns", owner_name=f"w{i}")
            placements.append(
                Placement(workload=ref, pod=f"p{i}", gpu_uuid=uuid, fraction=fraction)
            )
    state = ClusterState(gpus=tuple(gpus), placements=tuple(placements))
    keys = [p.pod_key for p in placements]
    if not rules:
        return Case(state, None, {}, {}, (), (), 1000, None)
    node_of = {g.uuid: g.node for g in gpus}
    nodes = {}
    for n in state.nodes:
        taints = (Taint("dedicated", "x", "NoSchedule"),) if draw(st.booleans()) else ()
        nodes[n] = NodeFacts(
            name=n,
            labels={"kubernetes.io/hostname": n, "zone": draw(st.sampled_from("ab"))},
            taints=taints,
            allocatable=Resources(cpu_milli=draw(st.integers(2, 16)) * 1000),
        )
    pod_facts = []
    for p in placements:
        anti = draw(st.integers(0, 5)) == 0
        pod_facts.append(
            PodFacts(
                namespace="ns",
                name=p.pod,
                labels={"app": "x"} if draw(st.booleans()) else {},
                node=node_of[p.gpu_uuid],
                node_selector={"zone": "a"} if draw(st.integers(0, 4)) == 0 else {},
                tolerations=(Toleration("dedicated", "Exists"),) if draw(st.booleans()) else (),
                requests=Resources(cpu_milli=draw(st.integers(0, 4)) * 500),
                anti_affinity=(
                    (PodAffinityTerm("kubernetes.io/hostname", APP, frozenset({"ns"})),)
                    if anti
                    else ()
                ),
            )
        )
    facts = ClusterFacts(nodes, pods_by_node(pod_facts)) if draw(st.booleans()) else None
    node_notes = {
        n: {draw(st.sampled_from([SCALE_DOWN_DISABLED, DO_NOT_DISRUPT])): "true"}
        for n in state.nodes
        if draw(st.integers(0, 5)) == 0
    }
    pod_notes = {}
    for key in keys:
        if draw(st.integers(0, 7)) == 0:
            pod_notes[key] = {SAFE_TO_EVICT: "false"}
        elif draw(st.integers(0, 7)) == 0:
            pod_notes[key] = {DO_NOT_DISRUPT: "true"}
    subsets = st.frozensets(st.sampled_from(keys), min_size=1) if keys else st.just(frozenset())
    budgets = tuple(
        DisruptionBudget(f"ns/pdb{i}", draw(st.integers(0, 2)), draw(subsets))
        for i in range(draw(st.integers(0, 2)))
    )
    gangs = []
    if len(keys) >= 2 and draw(st.booleans()):
        members = draw(st.frozensets(st.sampled_from(keys), min_size=2))
        gangs.append(Gang("ns/pg", draw(st.integers(1, len(members))), len(members), members))
    card_budget = None
    if draw(st.booleans()):
        forecasts = {}
        for p in placements:
            peak = draw(st.integers(1, 100)) / 100 * p.fraction
            forecasts[p.pod_key] = TenantForecast(
                memory_peak=peak, memory_jump=peak / 4, compute=peak / 2
            )
        card_budget = pooled_card_budget(forecasts)
    return Case(
        state,
        facts,
        node_notes,
        pod_notes,
        budgets,
        tuple(gangs),
        draw(st.integers(0, 12)),
        card_budget,
    )


def plan_for(case: Case) -> ConsolidationPlan:
    return consolidation_plan(
        case.state,
        max_moves=case.max_moves,
        facts=case.facts,
        node_annotations=case.node_notes,
        pod_annotations=case.pod_notes,
        disruption_budgets=case.budgets,
        gangs=case.gangs,
        card_budget=case.card_budget,
    )


def tenants(state: ClusterState, uuid: str) -> dict[str, float]:
    return {p.pod_key: p.fraction for p in state.placements if p.gpu_uuid == uuid}


@settings(max_examples=400, deadline=None)
@given(cases())
def test_no_move_breaks_a_rule_and_no_card_goes_over(case: Case) -> None:
    plan = plan_for(case)
    state, facts = case.state, case.facts
    node_of = {g.uuid: g.node for g in state.gpus}
    moves = plan.moves
    assert len(moves) <= case.max_moves
    moved_keys = [s.pod_key for s in moves]
    assert len(moved_keys) == len(set(moved_keys))  # one move per pod per plan
    for b in case.budgets:
        assert sum(k in b.pods for k in moved_keys) <= max(0, b.allowed)
    for g in case.gangs:
        if g.min_member > 1:
            assert g.running - sum(k in g.pods for k in moved_keys) >= g.min_member
    # nodes first: every step that frees a node comes before every step that frees a card
    kinds = [s.frees for s in plan.steps]
    assert kinds == sorted(kinds, key=lambda k: k is Candidate.GPU)
    freed_so_far: set[str] = set()
    pending_shrinks: dict[str, float] = {}  # pod -> fraction before its shrink, this move
    for step in plan.steps:
        key = step.pod_key
        if step.kind is StepKind.SHRINK:  # in place: no eviction, so any pod may shrink
            assert step.fraction < step.placement.fraction
            pending_shrinks[key] = step.placement.fraction
            state = apply_pod_plan(state, step.as_resize_plan())
            continue
        assert case.pod_notes.get(key, {}).get(SAFE_TO_EVICT) != "false"
        assert case.pod_notes.get(key, {}).get(DO_NOT_DISRUPT) != "true"
        source_node = node_of[step.placement.gpu_uuid]
        for note in (SCALE_DOWN_DISABLED, DO_NOT_DISRUPT):
            assert case.node_notes.get(source_node, {}).get(note) != "true"
        tainted = set(freed_so_far)
        if step.frees is Candidate.NODE:
            tainted.add(step.frees_name)
            freed_so_far_next = step.frees_name
        else:
            freed_so_far_next = ""
        # the scheduler's choice: the fullest card that holds it where the predicates allow
        rule = None
        if facts is not None:
            pod = next(p for ps in facts.pods_on_nodes.values() for p in ps if p.key == key)
            rule = node_rule(pod, facts)
        allowed = [
            g
            for g in state.gpus
            if g.node not in tainted
            and (rule is None or rule(g.node) is None)
            and state.free(g.uuid, excluding_pod=key) + EPS >= step.fraction
        ]
        best = min(allowed, key=lambda g: (state.free(g.uuid, excluding_pod=key), g.uuid))
        assert step.to_gpu == best.uuid
        assert step.to_gpu != step.placement.gpu_uuid
        if case.card_budget is not None:
            before = {**tenants(state, step.to_gpu), **pending_shrinks}
            before = {k: v for k, v in before.items() if k in tenants(state, step.to_gpu)}
            shares = case.card_budget(step.to_gpu, {**before, key: step.fraction})
            assert shares is not None
            for shrunk in pending_shrinks:
                assert tenants(state, step.to_gpu)[shrunk] >= shares[shrunk] - EPS
        pending_shrinks = {}
        state = apply_pod_plan(state, step.as_resize_plan())
        if facts is not None:
            facts = facts.moved({key: node_of[step.to_gpu]})
        assert sum(tenants(state, step.to_gpu).values()) <= 1.0 + EPS
        if freed_so_far_next and not any(
            node_of[p.gpu_uuid] == freed_so_far_next for p in state.placements
        ):
            freed_so_far.add(freed_so_far_next)
    final = apply_consolidation(case.state, plan)
    assert final == state
    for g in final.gpus:
        assert sum(tenants(final, g.uuid).values()) <= 1.0 + EPS
    for uuid in plan.emptied_gpus:
        assert tenants(case.state, uuid)
        assert not tenants(final, uuid)
    for node in plan.freed_nodes:
        assert not any(node_of[p.gpu_uuid] == node for p in final.placements)
    # every candidate in the plan is emptied whole
    for step in plan.steps:
        if step.frees is Candidate.GPU:
            assert not tenants(final, step.frees_name)
        else:
            assert step.frees_name in plan.freed_nodes
    in_use = {p.gpu_uuid for p in case.state.placements}
    assert plan.cards_freed == len(in_use) - len({p.gpu_uuid for p in final.placements})
    # every candidate the plan leaves says why
    refused = {(r.candidate, r.name) for r in plan.refused}
    for node in {node_of[u] for u in in_use}:
        assert node in plan.freed_nodes or (Candidate.NODE, node) in refused
    for uuid in in_use:
        on_freed = node_of[uuid] in plan.freed_nodes
        assert uuid in plan.emptied_gpus or on_freed or (Candidate.GPU, uuid) in refused


def emptiable_nodes(state: ClusterState) -> set[str]:
    """The nodes whose pods (largest first) each have a scheduler's choice on another node
    that holds GPU pods, from the layout as it is: an independent, plain reading of the rule."""
    out = set()
    for node in state.nodes:
        s = state
        ok = True
        pods = sorted(
            (p for p in s.placements if s.gpu(p.gpu_uuid).node == node),  # type: ignore[union-attr]
            key=lambda p: (-p.fraction, p.pod_key),
        )
        if not pods:
            continue
        for p in pods:
            holding = [
                g
                for g in s.gpus
                if g.node != node and s.free(g.uuid, excluding_pod=p.pod_key) + EPS >= p.fraction
            ]
            if not holding:
                ok = False
                break
            best = min(holding, key=lambda g: (s.free(g.uuid), g.uuid))
            if not any(
                s.gpu(q.gpu_uuid).node == best.node  # type: ignore[union-attr]
                for q in s.placements
                if q.pod_key != p.pod_key
            ):
                ok = False  # the best fit is an idle node: nothing would be freed
                break
            s = ClusterState(
                gpus=s.gpus,
                placements=tuple(
                    q.model_copy(update={"gpu_uuid": best.uuid}) if q.pod_key == p.pod_key else q
                    for q in s.placements
                ),
            )
        if ok:
            out.add(node)
    return out


@settings(max_examples=300, deadline=None)
@given(cases(rules=False))
def test_a_node_is_freed_whenever_one_can_be(case: Case) -> None:
    plan = plan_for(case)
    if emptiable_nodes(case.state):
        assert plan.freed_nodes
    # and the plan's node candidates are those it reports freed
    assert {s.frees_name for s in plan.steps if s.frees is Candidate.NODE} <= set(plan.freed_nodes)
