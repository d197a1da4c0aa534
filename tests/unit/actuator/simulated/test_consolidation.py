"""Consolidation on the simulated cluster (pure): the live planner, the opt-in rule, whole
nodes only, the moves-per-hour limit; recommend mode moves nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from fracpilot_actuator.opt_in import Automation
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_actuator.simulated.consolidation import (
    SimulatedRound,
    automation,
    simulated_round,
)
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep
from fracpilot_libs.placement.planner import ClusterState, Placement, add_node

T = datetime(2026, 3, 2, 12, tzinfo=UTC)
GIB = 1024**3
AUTO = {"inference": {"fracpilot.io/mode": "auto"}}


def ref(name: str, namespace: str = "inference") -> WorkloadRef:
    return WorkloadRef(cluster="demo", namespace=namespace, owner_name=name)


def two_half_empty_nodes(namespace: str = "inference") -> ClusterState:
    """sim-node-0: a 0.5 pod on each card; sim-node-1: one 0.25 pod: it fits on node 0."""
    state = add_node(add_node(ClusterState(), "sim-node-0", 2, 80 * GIB), "sim-node-1", 2, 80 * GIB)
    pods = [
        Placement(workload=ref("a"), pod="a-0", gpu_uuid="GPU-sim-node-0-0", fraction=0.5),
        Placement(workload=ref("b"), pod="b-0", gpu_uuid="GPU-sim-node-0-1", fraction=0.5),
        Placement(
            workload=ref("c", namespace), pod="c-0", gpu_uuid="GPU-sim-node-1-0", fraction=0.25
        ),
    ]
    return state.model_copy(update={"placements": tuple(pods)})


def name(step: ConsolidationStep, n: int) -> str:
    return f"{step.placement.workload.owner_name}-moved{n}"


def run(
    state: ClusterState,
    mode: str,
    labels: dict[str, dict[str, str]],
    recent: Sequence[datetime] = (),
) -> SimulatedRound:
    settings = ConsolidationSettings(mode=mode, max_moves_per_hour=4)  # type: ignore[arg-type]
    return simulated_round(
        state, settings, lambda w: automation(w, labels, OptInSettings()), list(recent), T, name
    )


def test_auto_mode_empties_a_node_of_opted_in_pods() -> None:
    done = run(two_half_empty_nodes(), "auto", AUTO)
    assert (done.would.cards_freed, done.would.freed_nodes) == (1, ("sim-node-1",))
    [moved] = done.moved
    assert (moved.step.pod_key, moved.new_pod) == ("inference/c-0", "c-moved0")
    assert done.freed_nodes == ("sim-node-1",)
    [c] = [p for p in done.state.placements if p.workload.owner_name == "c"]
    assert (c.pod, c.gpu_uuid.startswith("GPU-sim-node-0"), c.fraction) == ("c-moved0", True, 0.25)


def test_recommend_mode_and_pods_not_opted_in_move_nothing() -> None:
    state = two_half_empty_nodes()
    recommend = run(state, "recommend", AUTO)
    assert (recommend.moved, recommend.state) == ((), state)
    assert recommend.would.freed_nodes == ("sim-node-1",)  # what it would free is still said
    not_opted_in = run(state, "auto", {})
    assert not_opted_in.moved == ()
    assert not_opted_in.would.freed_nodes == ("sim-node-1",)  # recommend by default: counted
    off = run(state, "auto", {"inference": {"fracpilot.io/mode": "off"}})
    assert off.would.freed_nodes == ()


def test_the_moves_per_hour_limit_holds() -> None:
    recent = [T - timedelta(minutes=m) for m in (1, 10, 20, 30)]
    assert run(two_half_empty_nodes(), "auto", AUTO, recent).moved == ()
    older = [T - timedelta(minutes=61)] * 4
    assert len(run(two_half_empty_nodes(), "auto", AUTO, older).moved) == 1


def test_the_opt_in_rule_reads_the_namespace_labels() -> None:
    assert automation(ref("c"), AUTO, OptInSettings()) is Automation.AUTO
    assert automation(ref("c", "jobs"), AUTO, OptInSettings()) is not Automation.AUTO
