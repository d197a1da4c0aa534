"""The pipeline under load on a three-node JetStream cluster (R3) while nodes fail (issue 17).

The services run as processes, as in :mod:`chaos.test_pipeline_chaos`, over three
nats-server processes on loopback (``support.nats_cluster.SecuredCluster``: the chart's
identities and TLS, routes over mutual TLS, as the chart's default). Before the fault one node is
made the leader of every usage partition stream and every KV bucket; then, while samples
flow: (1) that node is SIGKILLed and restarted on its store, (2) it is frozen (SIGSTOP) for
longer than an election takes, then thawed, (3) all three nodes are restarted one by one,
each once the others have caught up (a Helm upgrade), (4) two decision replicas, each
connected to a different node, share the partitions and one is SIGKILLed: the other takes
them all. Each time: no sample lost, no decision applied twice, no checkpoint lost, the
invariants of :mod:`chaos.invariants` hold, and every service answers ready within
``READY_WITHIN_S`` of the node's return. ``FRACPILOT_CHAOS_LONG=1`` runs longer loads and
longer faults.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from chaos.cluster_pipeline import (
    LONG,
    PARTITIONS,
    ClusterPipeline,
    gather_leadership,
    leader_of,
    wait_streams_current,
)
from chaos.faults import READY_WITHIN_S, FaultRun, ScenarioFigures
from fracpilot_cli.demo import DemoConfig
from fracpilot_libs.nats import subjects

pytestmark = pytest.mark.chaos

IDENTITIES = ("ingest", "decision", "actuator", "operator")

SIM_HOURS = 40 if LONG else 14  # 8 workloads at 2400x: 320 samples/s for ~60 s (~20 s)
DOWN_S = 10.0 if LONG else 3.0
FROZEN_S = 15.0 if LONG else 8.0  # nats-server elects a new leader after 4-9 s
# The default partition lease. A fault of the KV leader can outlast the trust (3/4 of it):
# the replica then drops its partitions and claims them again (RELIABILITY.md, issue 17).
LEASE_S = 10.0

Fault = Callable[[ClusterPipeline], Awaitable[None]]


async def run(
    tmp_path: Path,
    chaos_figures: list[ScenarioFigures],
    title: str,
    fault: Fault,
    *,
    sim_hours: int = SIM_HOURS,
    decision_nodes: tuple[str, ...] = (),
    lease_s: float = LEASE_S,
) -> ClusterPipeline:
    config = DemoConfig(workloads=8, sim_hours=sim_hours, speed=2400, log_dir=tmp_path)
    figures = ScenarioFigures(
        title,
        f"{config.workloads} simulated workloads, {config.expected_samples} samples at "
        f"{config.speed * config.workloads / config.step_s:.0f}/s; 3 nodes, R3, "
        f"{PARTITIONS} partitions",
    )
    chaos_figures.append(figures)
    pipeline = ClusterPipeline(
        tmp_path,
        config,
        figures,
        decision_nodes=decision_nodes,
        extra_env={"FRACPILOT_PARTITION_LEASE_S": str(lease_s)},
    )
    started = time.monotonic()
    try:
        await pipeline.start()
        await asyncio.sleep(2.0)  # load flowing, checkpoints written
        fault_start = time.time()
        await fault(pipeline)
        fault_end = time.time()
        findings = await pipeline.finish()
        lacked = {n: pipeline.cluster.violations(n) for n in IDENTITIES}
        figures.extra["decision partitions dropped / claimed"] = partition_moves(pipeline)
        lost = pipeline.lost_checkpoints(await pipeline.checkpoints())
        during, overall = await pipeline.throughput(fault_start, fault_end)
        figures.extra["samples/s during the fault (whole run)"] = f"{during:.0f} ({overall:.0f})"
        figures.extra["checkpoints written before the fault, lost"] = (
            f"{len(pipeline.checkpoints_before)}, {len(lost)}"
        )
    finally:
        figures.wall_s = time.monotonic() - started
        pipeline.cleanup()
    assert findings.breaches == 0, findings.problems
    assert findings.expected_samples == findings.samples == config.expected_samples
    assert findings.decisions > 0
    assert findings.applied > 0
    assert pipeline.checkpoints_before  # read before the fault
    assert lost == [], lost  # each key there after, at the same revision or a later one
    for fault_run in figures.faults:
        assert fault_run.recovery_s <= READY_WITHIN_S, fault_run
    assert lacked == {n: [] for n in IDENTITIES}, "an identity lacked a permission"
    return pipeline


def partition_moves(pipeline: ClusterPipeline) -> str:
    """Partitions the decision replicas dropped (a lease no longer trusted) and claimed, from
    their ``fracpilot_decision_partition_moves_total`` (of the replicas still running)."""
    moves = {"dropped": 0.0, "claimed": 0.0}
    for key, port in pipeline.ports.items():
        if not key.startswith("decision"):
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                for move in moves:
                    if line.startswith(f'fracpilot_decision_partition_moves_total{{move="{move}"'):
                        moves[move] += float(line.rsplit(" ", 1)[1])
    return f"{moves['dropped']:.0f} / {moves['claimed']:.0f}"


async def leader_node(pipeline: ClusterPipeline) -> str:
    """Gather the leadership of every usage partition and KV bucket on one node (the usage
    partition 0's leader); its name."""
    streams = await pipeline.usage_and_kv_streams()
    node = await wait_leader(pipeline, subjects.usage_stream(0))
    led = await gather_leadership(pipeline.reader, pipeline.admin, node, streams)
    pipeline.figures.extra[f"streams led by {node} before the fault"] = f"{len(led)} of "
    pipeline.figures.extra[f"streams led by {node} before the fault"] += str(len(streams))
    assert len(led) == len(streams), sorted(set(streams) - set(led))
    return node


async def wait_leader(pipeline: ClusterPipeline, stream: str) -> str:
    for _ in range(100):
        if leader := await leader_of(pipeline.reader, stream):
            return leader
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{stream} has no leader")


async def test_killing_the_leader_node_loses_nothing(
    tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    async def fault(p: ClusterPipeline) -> None:
        node = p.cluster.node(await leader_node(p))
        await p.before_the_fault()
        node.kill()
        down = time.monotonic()
        await asyncio.sleep(DOWN_S)
        await asyncio.to_thread(p.cluster.restart, node)
        duration = time.monotonic() - down
        recovery = await p.ready_after()
        p.figures.fault(
            FaultRun("SIGKILL + restart", f"leader node {node.name}", duration, recovery)
        )
        p.figures.extra["streams current again after the restart"] = (
            f"{await wait_streams_current(p.reader):.1f} s"
        )

    await run(tmp_path, chaos_figures, "NATS cluster: SIGKILL of the leader node", fault)


async def test_freezing_the_leader_node_beyond_an_election_loses_nothing(
    tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    async def fault(p: ClusterPipeline) -> None:
        node = p.cluster.node(await leader_node(p))
        await p.before_the_fault()
        node.freeze()  # its routes and clients hang: a partitioned machine
        try:
            await asyncio.sleep(FROZEN_S)
        finally:
            node.thaw()
        recovery = await p.ready_after()
        p.figures.fault(FaultRun("SIGSTOP/SIGCONT", f"leader node {node.name}", FROZEN_S, recovery))
        p.figures.extra["streams current again after the thaw"] = (
            f"{await wait_streams_current(p.reader):.1f} s"
        )

    await run(tmp_path, chaos_figures, "NATS cluster: the leader node partitioned", fault)


async def test_a_rolling_restart_of_every_node_loses_nothing(
    tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    async def fault(p: ClusterPipeline) -> None:
        await leader_node(p)
        await p.before_the_fault()
        for node in p.cluster.nodes:
            p.terminate_node(node)
            down = time.monotonic()
            await asyncio.sleep(1.0)
            await asyncio.to_thread(p.cluster.restart, node)
            duration = time.monotonic() - down
            recovery = await p.ready_after()
            p.figures.fault(FaultRun("SIGTERM + restart", node.name, duration, recovery))
            caught_up = await wait_streams_current(p.reader)
            p.figures.extra[f"streams current again after {node.name}"] = f"{caught_up:.1f} s"

    await run(
        tmp_path,
        chaos_figures,
        "NATS cluster: rolling restart of the three nodes",
        fault,
        sim_hours=SIM_HOURS + 10,
    )


async def test_two_decision_replicas_on_different_nodes_share_and_hand_over(
    tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    async def fault(p: ClusterPipeline) -> None:
        owners: dict[int, str] = {}
        for _ in range(100):
            owners = await p.partition_owners()
            if len(owners) == PARTITIONS and len(set(owners.values())) == 2:
                break
            await asyncio.sleep(0.2)
        assert len(set(owners.values())) == 2, owners  # both replicas hold partitions
        p.figures.extra["partitions per replica before the kill"] = sorted(
            list(owners.values()).count(r) for r in set(owners.values())
        )
        await p.before_the_fault()
        dying = p.procs.pop("decision-n0")
        killed_port = p.ports.pop("decision-n0")
        dying.kill()
        down = time.monotonic()
        survivor: set[str] = set()
        for _ in range(300):
            now = await p.partition_owners()
            survivor = set(now.values())
            if len(now) == PARTITIONS and len(survivor) == 1:
                break
            await asyncio.sleep(0.1)
        taken_over = time.monotonic() - down
        assert len(survivor) == 1, survivor
        p.figures.extra["all partitions owned by the survivor after"] = f"{taken_over:.1f} s"
        recovery = await p.ready_after()
        p.figures.fault(
            FaultRun("SIGKILL", f"decision replica on n0 (:{killed_port})", 0.0, recovery)
        )

    await run(
        tmp_path,
        chaos_figures,
        "NATS cluster: two decision replicas on different nodes, one killed",
        fault,
        sim_hours=SIM_HOURS + 10,
        decision_nodes=("n0", "n1"),  # the default lease: the survivor takes over within it
    )
