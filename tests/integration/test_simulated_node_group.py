"""The demo's cluster on a real nats-server: consolidation (the live planner, auto mode) empties a
node after a downsize, the simulated autoscaler removes it once it has been empty for the
unneeded time (simulated clock), and the reports and moves land on the consolidation stream
where ``status``, ``report`` and the demo read them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from factories import T0, decision
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_actuator.simulated.backend import SimulatedBackend
from fracpilot_actuator.simulated.cluster import STATE_KEY, SimulatedCluster, seed_cluster
from fracpilot_cli.summary import cluster_cards_of
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ConsolidationMode,
    ConsolidationMove,
    ConsolidationReport,
    MoveState,
    Outcome,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import read_stream, reset_nats

pytestmark = pytest.mark.integration
GIB = 1024**3


def ref(name: str) -> WorkloadRef:
    return WorkloadRef(cluster="demo", namespace="inference", owner_name=name)


async def test_consolidation_empties_a_node_and_the_autoscaler_removes_it(nats_url: str) -> None:
    await reset_nats(nats_url)
    bus = Bus("actuator", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=5)
    try:
        await bus.ensure_streams()
        state_kv = await bus.kv(subjects.ACTUATOR_STATE_BUCKET)
        cluster = SimulatedCluster(state_kv, await bus.kv(subjects.ALLOCATION_BUCKET), 2, 80 * GIB)
        # first fit: a and b fill sim-node-0's cards to 0.75, c alone on sim-node-1
        seed = seed_cluster(2, 2, 80 * GIB, [(ref("a"), 0.75), (ref("b"), 0.75), (ref("c"), 0.75)])
        backend = SimulatedBackend(
            cluster,
            lambda: cluster.load_or_seed(seed),
            OptInSettings(),
            {"inference": {"fracpilot.io/mode": "auto"}},
            consolidation=ConsolidationSettings(mode="auto", interval_s=60),
            publish=bus.publish,
            cluster_name="demo",
        )
        await backend.start()
        first = await backend.actuate(
            decision(0.75, 0.2, "c", "d-1", workload=ref("c"), pod="c-0", decided_at=T0),
            dry_run="",
            now=T0,
        )
        assert first.outcome is Outcome.APPLIED
        # c, now 0.2, fits beside a (0.25 free): moved there, and sim-node-1 holds nothing
        [c] = [p for p in cluster.state.placements if p.workload.owner_name == "c"]
        assert cluster.state.gpu(c.gpu_uuid).node == "sim-node-0"  # type: ignore[union-attr]
        assert {g.node for g in cluster.state.gpus} == {"sim-node-0", "sim-node-1"}
        # the unneeded time (10 simulated minutes) later, the next decision's round removes it
        later = T0 + timedelta(minutes=11)
        await backend.actuate(
            decision(0.75, 0.7, "a", "d-2", workload=ref("a"), pod="a-0", decided_at=later),
            dry_run="",
            now=later,
        )
        assert {g.node for g in cluster.state.gpus} == {"sim-node-0"}
        stored = await state_kv.get(STATE_KEY)
        assert stored is not None
        cards = cluster_cards_of(stored.value or b"")
        assert (cards.nodes, cards.nodes_removed) == (1, 1)
        assert json.loads(stored.value or b"")["node_group"]["removed"] == ["sim-node-1"]
    finally:
        await bus.close()

    stream = await read_stream(nats_url, subjects.CONSOLIDATION_STREAM)
    reports = [ConsolidationReport.model_validate_json(d) for s, d in stream if ".report." in s]
    moves = [ConsolidationMove.model_validate_json(d) for s, d in stream if ".move." in s]
    assert reports[0].mode is ConsolidationMode.AUTO
    assert (reports[0].would_free_nodes, reports[0].freed_nodes) == (1, ("sim-node-1",))
    assert [m.state for m in moves] == [MoveState.STARTED, MoveState.VERIFIED, MoveState.FREED]
    assert moves[1].to_node == "sim-node-0"
    assert (moves[2].freed_node, moves[2].freed_gpus) == ("sim-node-1", 2)
