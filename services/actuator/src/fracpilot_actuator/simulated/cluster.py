"""A simulated GPU cluster backend, for the demo: nodes, GPUs and pods held in NATS KV.

It executes the planner's plans the way a real cluster would end up: in place changes the
pod's fraction on its GPU, a recreate moves the pod (with a new name) to another GPU, and a
scale-up adds a node first and then moves the pod onto it. It also publishes each workload's
``Allocation`` to the allocations bucket, which ingest and the CLI read. The Kubernetes
backend arrives with its own issue; this one stays for the demo.

The nodes form one autoscaled node group (:mod:`.autoscaler`, a simulated cluster-autoscaler):
a scale-up adds a node, and a node left empty (by consolidation, :mod:`.consolidation`) is
removed after a while.

The state is one KV value holding the cluster, the node group and the ids of the decisions
executed on it (the last :data:`APPLIED_KEPT`), written together: an actuator that crashed
after executing a decision but before recording it done sees on its next attempt that the
cluster already carries it, and does not execute it again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime

from fracpilot_actuator.simulated.autoscaler import NodeGroup, grown, next_node, scale_down
from fracpilot_libs.contracts import PlanKind, WorkloadRef, utcnow
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.placement.planner import (
    ClusterState,
    Placement,
    ResizePlan,
    add_node,
    allocation_for,
    apply_plan,
    fits,
)

log = logging.getLogger(__name__)
STATE_KEY = "simulated-cluster"
GIB = 1024**3
APPLIED_KEPT = 10_000  # decision ids remembered in the state (far beyond any redelivery)


def seed_cluster(
    nodes: int, gpus_per_node: int, memory_bytes: int, pods: list[tuple[WorkloadRef, float]]
) -> ClusterState:
    """Nodes named ``sim-node-N`` and the given pods placed first-fit in order."""
    state = ClusterState()
    for n in range(nodes):
        state = add_node(state, f"sim-node-{n}", gpus_per_node, memory_bytes)
    placements: list[Placement] = []
    for workload, fraction in pods:
        partial = state.model_copy(update={"placements": tuple(placements)})
        gpu = next((g for g in partial.gpus if fits(partial, g.uuid, fraction, workload)), None)
        if gpu is None:
            raise ValueError(f"seed pods do not fit: {workload.display} at {fraction:g}")
        placements.append(
            Placement(
                workload=workload,
                pod=f"{workload.owner_name}-0",
                gpu_uuid=gpu.uuid,
                fraction=fraction,
            )
        )
    return state.model_copy(update={"placements": tuple(placements)})


def parse_seed_pods(spec: str, cluster: str) -> list[tuple[WorkloadRef, float]]:
    """``ns/name=0.5,ns/other=0.25`` -> workloads with their starting fractions."""
    pods = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        ref, _, fraction = item.partition("=")
        namespace, _, name = ref.partition("/")
        if not (namespace and name and fraction):
            raise ValueError(f"seed pod {item!r} is not namespace/name=fraction")
        pods.append(
            (WorkloadRef(cluster=cluster, namespace=namespace, owner_name=name), float(fraction))
        )
    return pods


class SimulatedCluster:
    def __init__(
        self, state_kv: KvBucket, allocation_kv: KvBucket, gpus_per_node: int, gpu_memory_bytes: int
    ) -> None:
        self._state_kv = state_kv
        self._allocation_kv = allocation_kv
        self._gpus_per_node = gpus_per_node
        self._gpu_memory = gpu_memory_bytes
        self.state = ClusterState()
        self.group = NodeGroup()
        self.applied: list[str] = []  # decision ids executed, oldest first

    def has_applied(self, decision_id: str) -> bool:
        return decision_id in self.applied

    async def load_or_seed(self, seed: ClusterState) -> None:
        entry = await self._state_kv.get(STATE_KEY)
        if entry is not None:
            body = json.loads(entry.value or b"{}")
            if "cluster" in body:
                self.state = ClusterState.model_validate(body["cluster"])
                self.applied = [str(i) for i in body.get("applied", [])]
                self.group = NodeGroup.from_json(body.get("node_group", {}))
            else:  # written before the state carried the executed decisions
                self.state = ClusterState.model_validate(body)
            log.info("simulated cluster restored", extra={"gpus": len(self.state.gpus)})
        else:
            self.state = seed
            await self._save(None)
            log.info(
                "simulated cluster seeded",
                extra={"gpus": len(seed.gpus), "pods": len(seed.placements)},
            )
        for placement in self.state.placements:
            await self._publish_allocation(placement.workload)

    async def execute(
        self,
        plan: ResizePlan,
        new_pod: str,
        decision_id: str = "",
        now: datetime | None = None,
    ) -> ResizePlan:
        """Carry out the plan; a scale-up returns the plan as executed, with its target GPU.

        ``decision_id`` is recorded in the same write as the change; ``now``: the simulation's
        clock (a scale-up holds the node group's scale-down off for a while after it)."""
        if plan.kind is PlanKind.NONE:
            return plan
        executed = plan
        if plan.kind is PlanKind.SCALE_UP:
            node = next_node(self.state, self.group)
            self.group = grown(self.group, node, now)
            self.state = add_node(self.state, node, self._gpus_per_node, self._gpu_memory)
            target = next(g for g in self.state.gpus if g.node == node)
            executed = plan.model_copy(
                update={
                    "gpu_after": target.uuid,
                    "reason": f"{plan.reason}; added node {node} with {self._gpus_per_node} GPUs",
                }
            )
        pod = None if executed.kind is PlanKind.IN_PLACE else new_pod
        self.state = apply_plan(self.state, executed, pod)
        if decision_id:
            self.applied = [*self.applied[-(APPLIED_KEPT - 1) :], decision_id]
        await self._save(executed.workload)
        return executed

    async def replace_state(self, state: ClusterState, moved: Iterable[WorkloadRef]) -> None:
        """The cluster after consolidation's moves; the moved workloads' allocations published."""
        self.state = state
        await self._save(None)
        for workload in moved:
            await self._publish_allocation(workload)

    async def autoscale(self, now: datetime) -> tuple[str, ...]:
        """The simulated autoscaler's scale-down at ``now`` (simulated): the nodes removed."""
        result = scale_down(self.state, self.group, now)
        changed = result.group != self.group or result.removed
        self.state, self.group = result.state, result.group
        if changed:
            await self._save(None)
        for node in result.removed:
            log.info("simulated autoscaler removed an empty node", extra={"node": node})
        return result.removed

    async def _save(self, changed: WorkloadRef | None) -> None:
        body = {
            "cluster": self.state.model_dump(mode="json"),
            "applied": self.applied,
            "node_group": self.group.as_json(),
        }
        await self._state_kv.put(STATE_KEY, json.dumps(body).encode())
        if changed is not None:
            await self._publish_allocation(changed)

    async def _publish_allocation(self, workload: WorkloadRef) -> None:
        placement = self.state.placement(workload)
        gpu = self.state.gpu(placement.gpu_uuid) if placement else None
        if placement is None or gpu is None:
            return
        allocation = allocation_for(workload, placement.pod, gpu, placement.fraction, utcnow())
        await self._allocation_kv.put(subjects.kv_key(workload), allocation.to_json())
