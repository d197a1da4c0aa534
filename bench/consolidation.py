"""Consolidation planning on one core: 10,000 pods on 2,000 GPUs, next to a plain best-fit drain.

Usage: python bench/consolidation.py [--nodes 250] [--gpus-per-node 8] [--pods 10000]
                                     [--repeat 3] [--seed 7]

The cluster is made once, fragmented on purpose: each pod (0.05 to 0.25 of a card) on a random
card that has room. Beside it, what the planner's safety rules read: node facts (three zones, one
node in ten tainted, CPU and memory allocatable), pod facts (requests, one in ten with a zone
selector, the tolerations of the tainted nodes for a third), a PDB per workload of five pods
allowing one disruption, gangs of four (half at ``minMember``), 2% of pods
``safe-to-evict: "false"``, a few nodes with scale-down disabled. Then, best of ``--repeat``:

- ``plain best fit`` (the baseline): cards emptiest first, each tenant to the fullest other card
  in use with room, no rule checked; the floor of any planner that visits these candidates;
- ``planner``: :func:`~fracpilot_libs.placement.consolidation.consolidation_plan` with every
  rule, no move limit (every candidate is tried to the end: the worst case);
- ``planner, predicates only``: no PDB, gang or opt-out, so fewer candidates are refused
  before their moves are searched;
- ``planner, 100 moves``: every rule with a rate limit of 100 moves, as a policy would set it;
- ``planner, card budgets``: shared isolation, each pod's forecast, shrinks allowed.

Each line gives seconds and the ratio to the baseline, and what the plan frees. The target is
under 1 s for the planner with every rule.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.placement.card_budget import TenantForecast
from fracpilot_libs.placement.consolidation import (
    SAFE_TO_EVICT,
    SCALE_DOWN_DISABLED,
    consolidation_plan,
)
from fracpilot_libs.placement.consolidation_limits import DisruptionBudget, Gang, pooled_card_budget
from fracpilot_libs.placement.consolidation_steps import ConsolidationPlan
from fracpilot_libs.placement.planner import ClusterState, Gpu, Placement
from fracpilot_libs.placement.quantities import Resources
from fracpilot_libs.placement.scheduling_facts import (
    ClusterFacts,
    NodeFacts,
    PodFacts,
    Taint,
    Toleration,
    pods_by_node,
)

GIB = 2**30
EPS = 1e-9


@dataclass(frozen=True)
class Fleet:
    state: ClusterState
    facts: ClusterFacts
    node_notes: dict[str, dict[str, str]]
    pod_notes: dict[str, dict[str, str]]
    budgets: tuple[DisruptionBudget, ...]
    gangs: tuple[Gang, ...]
    forecasts: dict[str, TenantForecast]


def make_fleet(nodes: int, per_node: int, pods: int, rng: random.Random) -> Fleet:
    gpus = [
        Gpu(uuid=f"GPU-{n}-{i}", node=f"node-{n}", memory_bytes=80 * GIB)
        for n in range(nodes)
        for i in range(per_node)
    ]
    node_of = {g.uuid: g.node for g in gpus}
    used = dict.fromkeys((g.uuid for g in gpus), 0.0)
    uuids = list(used)
    placements: list[Placement] = []
    for i in range(pods):
        fraction = rng.choice((0.05, 0.1, 0.15, 0.2, 0.25))
        for _ in range(50):
            uuid = rng.choice(uuids)
            if used[uuid] + fraction <= 1.0 + EPS:
                used[uuid] += fraction
                ref = WorkloadRef(namespace="bench", owner_name=f"w{i // 5}")
                placements.append(
                    Placement(workload=ref, pod=f"p{i}", gpu_uuid=uuid, fraction=fraction)
                )
                break
    state = ClusterState(gpus=tuple(gpus), placements=tuple(placements))
    taint = Taint("dedicated", "inference", "NoSchedule")
    node_facts = {
        n: NodeFacts(
            name=n,
            labels={"kubernetes.io/hostname": n, "zone": "abc"[k % 3]},
            taints=(taint,) if k % 10 == 0 else (),
            allocatable=Resources(cpu_milli=96_000, memory=768 * GIB),
        )
        for k, n in enumerate(dict.fromkeys(node_of.values()))
    }
    pod_facts = [
        PodFacts(
            namespace="bench",
            name=p.pod,
            labels={"app": p.workload.owner_name},
            node=node_of[p.gpu_uuid],
            node_selector={"zone": rng.choice("abc")} if rng.random() < 0.1 else {},
            tolerations=(Toleration("dedicated", "Exists"),) if rng.random() < 0.33 else (),
            requests=Resources(cpu_milli=rng.choice((500, 1000, 2000)), memory=8 * GIB),
        )
        for p in placements
    ]
    keys = [p.pod_key for p in placements]
    budgets = tuple(
        DisruptionBudget(f"bench/pdb-{i // 5}", allowed=1, pods=frozenset(keys[i : i + 5]))
        for i in range(0, len(keys), 5)
    )
    gangs = tuple(
        Gang(f"bench/pg-{j}", min_member=4 if j % 2 else 2, running=4, pods=frozenset(members))
        for j, members in enumerate(keys[i : i + 4] for i in range(0, min(len(keys), 400), 4))
    )
    forecasts = {}
    for p in placements:
        peak = p.fraction * rng.uniform(0.4, 1.0)
        forecasts[p.pod_key] = TenantForecast(
            memory_peak=peak, memory_jump=peak * 0.3, compute=peak * 0.6, burst=peak * 0.2
        )
    return Fleet(
        state=state,
        facts=ClusterFacts(node_facts, pods_by_node(pod_facts)),
        node_notes={f"node-{n}": {SCALE_DOWN_DISABLED: "true"} for n in range(0, nodes, 50)},
        pod_notes={k: {SAFE_TO_EVICT: "false"} for k in keys if rng.random() < 0.02},
        budgets=budgets,
        gangs=gangs,
        forecasts=forecasts,
    )


def plain_best_fit(state: ClusterState) -> int:
    """The baseline: cards emptiest first, each tenant (largest first) to the fullest other card
    in use with room, undone when one does not fit; no rule checked. Returns the moves."""
    tenants: dict[str, dict[str, float]] = {g.uuid: {} for g in state.gpus}
    for p in state.placements:
        tenants[p.gpu_uuid][p.pod_key] = p.fraction
    free = {u: 1.0 - sum(t.values()) for u, t in tenants.items()}
    order = sorted((f, u) for u, f in free.items())

    def put(key: str, fraction: float, src: str, dst: str) -> None:
        for uuid, delta in ((src, fraction), (dst, -fraction)):
            del order[bisect.bisect_left(order, (free[uuid], uuid))]
            free[uuid] += delta
            bisect.insort(order, (free[uuid], uuid))
        del tenants[src][key]
        tenants[dst][key] = fraction

    moves = 0
    for card in sorted(
        (u for u in tenants if tenants[u]), key=lambda u: (len(tenants[u]), -free[u])
    ):
        done: list[tuple[str, float, str]] = []
        for key, fraction in sorted(tenants[card].items(), key=lambda kv: -kv[1]):
            i = bisect.bisect_left(order, (fraction - EPS,))
            while i < len(order) and (order[i][1] == card or not tenants[order[i][1]]):
                i += 1
            if i == len(order):
                for k, f, dst in reversed(done):
                    put(k, f, dst, card)
                done = []
                break
            dst = order[i][1]
            put(key, fraction, card, dst)
            done.append((key, fraction, dst))
        moves += len(done)
    return moves


def best_of(repeat: int, run: Callable[[], object]) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    fleet = make_fleet(args.nodes, args.gpus_per_node, args.pods, random.Random(args.seed))
    state = fleet.state
    in_use = len({p.gpu_uuid for p in state.placements})
    print(
        f"{len(state.placements):,} pods on {len(state.gpus):,} GPUs ({in_use:,} in use) on "
        f"{args.nodes} nodes; best of {args.repeat}, one core"
    )

    def planner(
        max_moves: int, budgets: bool = False, rules: bool = True
    ) -> Callable[[], ConsolidationPlan]:
        def run() -> ConsolidationPlan:
            return consolidation_plan(
                state,
                max_moves=max_moves,
                facts=fleet.facts,
                node_annotations=fleet.node_notes if rules else None,
                pod_annotations=fleet.pod_notes if rules else None,
                disruption_budgets=fleet.budgets if rules else (),
                gangs=fleet.gangs if rules else (),
                card_budget=pooled_card_budget(fleet.forecasts) if budgets else None,
                spread=False,
            )

        return run

    base, base_moves = best_of(args.repeat, lambda: plain_best_fit(state))
    print(f"{'run':<28}{'seconds':>9}{'vs plain':>10}{'moves':>8}{'GPUs':>7}{'nodes':>7}")
    print(f"{'plain best fit (baseline)':<28}{base:>9.3f}{1.0:>10.2f}{base_moves:>8}{'':>7}{'':>7}")
    timed = {}
    for name, run in (
        ("planner", planner(len(state.placements))),
        ("planner, predicates only", planner(len(state.placements), rules=False)),
        ("planner, 100 moves", planner(100)),
        ("planner, card budgets", planner(len(state.placements), budgets=True)),
    ):
        seconds, plan = best_of(args.repeat, run)
        assert isinstance(plan, ConsolidationPlan)
        timed[name] = seconds
        print(
            f"{name:<28}{seconds:>9.3f}{seconds / base:>10.2f}{len(plan.moves):>8}"
            f"{plan.cards_freed:>7}{len(plan.freed_nodes):>7}"
        )
    met = timed["planner"] < 1.0
    print(f"target under 1 s (planner, every rule): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
