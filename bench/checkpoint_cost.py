"""What a checkpoint round costs nats-server, by checkpoint format, R1 and R3.

Usage: python bench/checkpoint_cost.py [--workloads 100000] [--rounds 3]

At 100,000 workloads paced at 15 s, the decision service checkpoints every workload's state
once a minute: 1,667 states a second, one for four samples. This writes that many states,
``--rounds`` full rounds (every state changed, as when every workload is sampled), into the
checkpoint bucket of a fresh nats-server (R1) and of a fresh three-node cluster on loopback
(R3), in each format, and prints the nats-server CPU (all its processes, ``/proc``) per state
and per sample (a quarter of a state), and this process's CPU per state (encoding and
publishing, what the decision service pays):

- ``one JSON a key``: one KV value per workload, plain JSON (before 2026-12-05);
- ``one zlib a key``: one per workload, zlib-compressed JSON;
- ``groups``: the states of a usage slot's workloads in 4 values a slot, compressed together
  (:mod:`fracpilot_libs.sizing.checkpoint_groups`), written by the decision service's own
  :class:`~fracpilot_decision.checkpoints.Checkpointer` (binary states since 2026-12-05);
- ``JSON groups``: the same groups in their first version, a line of JSON a state (before the
  binary states), made here as that version's ``dump_group`` made them.

The states are real: the decision engine's after replaying the public GenAI trace
(``/work/shared/data`` or ``--trace``), sampled every two hours, shuffled and shared out over
the workloads (one state serves about 140 of them, so a group holds the odd twin and compresses
a little better than the live ones would).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import nats
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from pipeline_harness import cpu_seconds, machine_note

from fracpilot_decision.checkpoints import CHECKPOINT_CHUNK, Checkpointer
from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.trace import group_by_workload, read_trace
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.sizing.checkpoint_groups import dump_group, group_key
from fracpilot_libs.sizing.state import WorkloadState, dump_state, state_json
from support.nats_cluster import NatsCluster

TRACE = Path("/work/shared/data/genai_public.csv.gz")
FORMATS = ("one JSON a key", "one zlib a key", "groups", "JSON groups")


def json_group(states: Iterable[tuple[str, WorkloadState]]) -> bytes:
    """A group of the first version (``fracpilot-states 1``), as dump_group wrote it before
    binary states: key, space, JSON, a line a state, compressed at zlib's level 1."""
    lines = [key.encode() + b" " + state_json(state) for key, state in states]
    return zlib.compress(b"fracpilot-states 1\n" + b"\n".join(lines), 1)


def trace_states(path: Path) -> list[WorkloadState]:
    sizer, out = EngineSizer(), []
    for series in group_by_workload(read_trace(path)).values():
        alloc, state = sizer.initial(series[0].requested_fraction), sizer.start()
        for i, point in enumerate(series):
            sample = point.sample.model_copy(update={"allocated_fraction": alloc})
            state, new = sizer.step(state, sample)
            alloc = new if new is not None else alloc
            if i % 120 == 119:
                out.append(state)
    random.Random(1).shuffle(out)
    return out


@contextlib.contextmanager
def servers(nodes: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    if nodes == 1:
        with EmbeddedNats() as server:
            assert server.proc is not None
            yield server.url, (server.proc.pid,)
    else:
        with NatsCluster(nodes) as cluster:
            yield cluster.url, tuple(n.proc.pid for n in cluster.nodes if n.proc is not None)


async def one_round(checkpoints: Checkpointer, fmt: str, states: dict[str, WorkloadState]) -> int:
    """Write every state once in ``fmt``; the values written."""
    if fmt == "groups":
        assert not await checkpoints.write(states, list(states))
        return len({group_key(k) for k in states})
    if fmt == "JSON groups":  # as the Checkpointer wrote them: ~100 states in flight at once
        members: dict[str, list[str]] = {}
        for key in sorted(states):
            members.setdefault(group_key(key) or "", []).append(key)
        batch, in_batch = [], 0
        for group, names in members.items():
            batch.append((group, json_group((k, states[k]) for k in names)))
            in_batch += len(names)
            if in_batch >= CHECKPOINT_CHUNK:
                assert not await checkpoints.kv.put_many(checkpoints.nc, batch, 10.0)
                batch, in_batch = [], 0
        if batch:
            assert not await checkpoints.kv.put_many(checkpoints.nc, batch, 10.0)
        return len(members)
    encode = state_json if fmt == "one JSON a key" else dump_state
    keys = list(states)
    for i in range(0, len(keys), CHECKPOINT_CHUNK):  # as the decision service wrote them
        batch = [(k, encode(states[k])) for k in keys[i : i + CHECKPOINT_CHUNK]]
        assert not await checkpoints.kv.put_many(checkpoints.nc, batch, 10.0)
    return len(keys)


async def measure(
    url: str,
    pids: tuple[int, ...],
    replicas: int,
    fmt: str,
    states: dict[str, WorkloadState],
    rounds: int,
) -> tuple[float, float, int]:
    nc = await nats.connect(servers=url.split(","))
    try:
        checkpoints = Checkpointer(nc, CollectorRegistry(), replicas=replicas)
        await checkpoints.open()
        await one_round(checkpoints, fmt, states)  # the bucket at its steady size first
        await asyncio.sleep(2)
        server0 = sum(map(cpu_seconds, pids))
        own0 = time.process_time()
        values = 0
        for _ in range(rounds):
            values += await one_round(checkpoints, fmt, states)
        await asyncio.sleep(2)  # what the servers still do for it (replication, storing)
        n = rounds * len(states)
        server = (sum(map(cpu_seconds, pids)) - server0) / n * 1e6
        own = (time.process_time() - own0) / n * 1e6
        return server, own, values // rounds
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3], help="1: R1, 3: R3")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS,
                        help="the formats measured (default all)")  # fmt: skip
    args = parser.parse_args()
    print(machine_note())
    protos = trace_states(args.trace)
    states = {
        subjects.kv_key(WorkloadRef(cluster="bench", namespace=f"ns-{i % 50}",
                                    owner_name=f"workload-{i:06d}")): protos[i % len(protos)]
        for i in range(args.workloads)
    }  # fmt: skip
    sizes = {
        "one JSON a key": sum(len(state_json(s)) for s in protos) / len(protos),
        "one zlib a key": sum(len(dump_state(s)) for s in protos) / len(protos),
    }
    groups: dict[str | None, list[str]] = {}
    for key in states:
        groups.setdefault(group_key(key), []).append(key)
    grouped = sum(len(dump_group((k, states[k]) for k in keys)) for keys in groups.values())
    sizes["groups"] = grouped / len(states)
    grouped = sum(len(json_group((k, states[k]) for k in keys)) for keys in groups.values())
    sizes["JSON groups"] = grouped / len(states)
    print(f"{len(protos)} distinct states from the trace, {args.workloads:,} workloads, "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"{'format':16} {'nodes':>5} {'values/round':>12} {'bytes/state':>11} "
          f"{'server us/state':>15} {'us/sample':>9} {'client us/state':>15}")  # fmt: skip
    for nodes in args.nodes:
        for fmt in args.formats:
            with servers(nodes) as (url, pids):
                server, own, values = asyncio.run(
                    measure(url, pids, nodes, fmt, states, args.rounds)
                )
            size = sizes.get(fmt, float("nan"))
            print(f"{fmt:16} {nodes:>5} {values:>12,} {size:>11,.0f} {server:>15.1f} "
                  f"{server / 4:>9.1f} {own:>15.1f}", flush=True)  # fmt: skip
    print(machine_note().replace("at the start", "at the end"))


if __name__ == "__main__":
    main()
