"""The simulated cluster-autoscaler of the demo's node group (pure): an empty node goes after
the unneeded time, not soon after a scale-up, never below the group's minimum; names are not
given again."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from fracpilot_actuator.simulated.autoscaler import (
    NodeGroup,
    grown,
    next_node,
    scale_down,
)
from fracpilot_actuator.simulated.cluster import seed_cluster
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.placement.planner import ClusterState, add_node

T = datetime(2026, 3, 2, tzinfo=UTC)
GIB = 1024**3


def three_nodes_one_busy() -> ClusterState:
    """sim-node-0 holds a pod; sim-node-1 and sim-node-2 are empty."""
    pod = (WorkloadRef(cluster="demo", namespace="inference", owner_name="chat"), 0.5)
    return seed_cluster(3, 2, 80 * GIB, [pod])


def test_an_empty_node_goes_only_after_the_unneeded_time() -> None:
    state, group = three_nodes_one_busy(), NodeGroup(min_nodes=1, unneeded_s=600)
    first = scale_down(state, group, T)
    assert first.removed == ()
    assert set(first.group.empty_since) == {"sim-node-1", "sim-node-2"}
    early = scale_down(first.state, first.group, T + timedelta(seconds=599))
    assert early.removed == ()
    due = scale_down(early.state, early.group, T + timedelta(seconds=600))
    assert due.removed == ("sim-node-1", "sim-node-2")
    assert {g.node for g in due.state.gpus} == {"sim-node-0"}
    assert due.group.removed == ("sim-node-1", "sim-node-2")
    assert due.group.empty_since == {}


def test_a_node_that_holds_a_pod_again_starts_over() -> None:
    state, group = three_nodes_one_busy(), NodeGroup(unneeded_s=600)
    seen = scale_down(state, group, T).group
    chat = state.placements[0]
    moved = chat.model_copy(update={"gpu_uuid": "GPU-sim-node-1-0"})
    busy = state.model_copy(update={"placements": (moved,)})
    later = scale_down(busy, seen, T + timedelta(seconds=300))
    assert "sim-node-1" not in later.group.empty_since  # it held a pod meanwhile
    assert later.group.empty_since["sim-node-0"] == T + timedelta(seconds=300)
    back = state  # the pod goes back to node 0: node 1 waits anew
    again = scale_down(back, later.group, T + timedelta(seconds=700))
    assert again.removed == ("sim-node-2",)  # empty since T; node 1 only since now
    assert again.group.empty_since == {"sim-node-1": T + timedelta(seconds=700)}


def test_no_scale_down_soon_after_a_scale_up_and_never_below_the_minimum() -> None:
    state = three_nodes_one_busy()
    group = grown(NodeGroup(min_nodes=2, unneeded_s=0, delay_after_add_s=600), "sim-node-2", T)
    assert scale_down(state, group, T + timedelta(seconds=599)).removed == ()
    after = scale_down(state, group, T + timedelta(seconds=600))
    assert len(after.removed) == 1  # three nodes, two kept
    assert len({g.node for g in after.state.gpus}) == 2


def test_a_new_node_is_named_past_every_node_the_group_had() -> None:
    state = three_nodes_one_busy()
    group = replace(NodeGroup(), removed=("sim-node-3", "sim-node-7"))
    assert next_node(state, group) == "sim-node-8"
    assert next_node(add_node(ClusterState(), "gpu-a", 1, GIB), NodeGroup()) == "sim-node-0"


def test_the_group_is_kept_as_json() -> None:
    group = scale_down(three_nodes_one_busy(), grown(NodeGroup(), "sim-node-2", T), T).group
    assert NodeGroup.from_json(group.as_json()) == group
    assert NodeGroup.from_json({}) == NodeGroup()
