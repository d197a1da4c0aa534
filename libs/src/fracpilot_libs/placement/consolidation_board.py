"""The cluster as a consolidation plan's moves change it (:class:`Board`): who holds how much
of which card, kept sorted by free share, the scheduler's facts beside it, every change
journalled so that a candidate that cannot be emptied is undone. Pure; used by
:func:`~fracpilot_libs.placement.consolidation.consolidation_plan` only."""

from __future__ import annotations

import bisect

from fracpilot_libs.placement.planner import EPSILON, ClusterState, FitRule, Gpu, Placement
from fracpilot_libs.placement.predicates import node_fits
from fracpilot_libs.placement.scheduling_facts import ClusterFacts, PodFacts


class Board:
    """Who holds how much of which card, kept sorted by free share so that the best fit is a
    bisection away, and the scheduler's facts kept beside it; every change is journalled so a
    candidate that cannot be emptied is undone."""

    def __init__(
        self, state: ClusterState, facts: ClusterFacts | None, spread: bool, fit: FitRule | None
    ) -> None:
        self.gpus: dict[str, Gpu] = {g.uuid: g for g in state.gpus}
        self.node_gpus: dict[str, list[str]] = {}
        for g in state.gpus:
            self.node_gpus.setdefault(g.node, []).append(g.uuid)
        self.placements: dict[str, Placement] = {}  # as they were: workload and pod name
        self.where: dict[str, str] = {}  # pod key -> card
        self.fraction: dict[str, float] = {}
        self.tenants: dict[str, dict[str, float]] = {u: {} for u in self.gpus}
        self.node_tenants: dict[str, int] = dict.fromkeys(self.node_gpus, 0)
        for p in state.placements:
            if p.gpu_uuid in self.gpus:
                key = p.pod_key
                self.placements[key] = p
                self.where[key] = p.gpu_uuid
                self.fraction[key] = p.fraction
                self.tenants[p.gpu_uuid][key] = p.fraction
                self.node_tenants[self.gpus[p.gpu_uuid].node] += 1
        self.free: dict[str, float] = {u: 1.0 - sum(t.values()) for u, t in self.tenants.items()}
        self.order: list[tuple[float, str]] = sorted((f, u) for u, f in self.free.items())
        self.journal: list[tuple[str, str, float]] = []  # (pod, card before, fraction before)
        self.all_gpus = state.gpus
        self.fit = fit
        self._state: ClusterState | None = None
        self.spread = spread
        self.facts = facts
        self.pod_facts: dict[str, PodFacts] = {}
        self.pods_on: dict[str, tuple[PodFacts, ...]] = {}
        self.facts_node: dict[str, str] = {}  # pod key -> the node its facts are under
        self.anti_affinity_anywhere = False
        if facts is not None:
            self.pods_on = dict(facts.pods_on_nodes)
            for node, pods in facts.pods_on_nodes.items():
                for pf in pods:
                    self.pod_facts[pf.key] = pf
                    self.facts_node[pf.key] = node
                    self.anti_affinity_anywhere |= bool(pf.anti_affinity)

    # -- reading

    def node_of(self, uuid: str) -> str:
        return self.gpus[uuid].node

    def on_node(self, node: str) -> list[str]:
        return [k for u in self.node_gpus.get(node, ()) for k in self.tenants[u]]

    def state(self) -> ClusterState:
        """The cluster as a :class:`ClusterState` (for a backend's fit rule), rebuilt on demand."""
        if self._state is None:
            self._state = ClusterState(
                gpus=self.all_gpus,
                placements=tuple(self._placement(k, u) for k, u in self.where.items()),
            )
        return self._state

    def _placement(self, key: str, uuid: str) -> Placement:
        was = self.placements[key]
        if was.gpu_uuid == uuid and was.fraction == self.fraction[key]:
            return was
        # what the backend recorded for the pod is not what it holds after a step: a planned
        # share, as apply_pod_plan leaves it
        update = {"gpu_uuid": uuid, "fraction": self.fraction[key], "memory_mib": None}
        return was.model_copy(update={**update, "cores": None})

    def holds(self, uuid: str, fraction: float, key: str) -> bool:
        """The backend's fit rule for a pod off the board (evicted) onto this card."""
        if self.fit is not None:
            return self.fit(self.state(), uuid, fraction, key)
        return self.free[uuid] + EPSILON >= fraction

    def node_refusal(self, key: str, node: str) -> str | None:
        """kube-scheduler's verdict on the pod (off the board) going to the node."""
        if self.facts is None:
            return None
        pod = self.pod_facts[key]
        facts = self.facts.nodes.get(node)
        if facts is None:
            return f"node {node}: not known"
        if not (pod.affinity or pod.anti_affinity or pod.spread or self.anti_affinity_anywhere):
            # Without inter-pod terms or spread, only the node's own pods count (resources):
            # the same verdict on a view holding just them, without a copy of the cluster.
            pods = {node: self.pods_on.get(node, ())}
            return node_fits(pod, facts, ClusterFacts(self.facts.nodes, pods), spread=self.spread)
        view = ClusterFacts(self.facts.nodes, self.pods_on, self.facts.namespace_labels)
        return node_fits(pod, facts, view, spread=self.spread)

    # -- changing

    def put(self, key: str, uuid: str, fraction: float, journal: bool = True) -> None:
        """The pod on card ``uuid`` at ``fraction`` ("" = off the board: evicted)."""
        before = self.where.get(key, "")
        if journal:
            self.journal.append((key, before, self.fraction[key]))
        self._state = None
        if before:
            del self.tenants[before][key]
            self._refresh(before)
            if before != uuid:
                self.node_tenants[self.node_of(before)] -= 1
        self.fraction[key] = fraction
        if uuid:
            self.where[key] = uuid
            self.tenants[uuid][key] = fraction
            self._refresh(uuid)
            if before != uuid:
                self.node_tenants[self.node_of(uuid)] += 1
        else:
            del self.where[key]
        if key in self.pod_facts:
            old = self.facts_node.get(key, "")
            new = self.node_of(uuid) if uuid else ""
            if old != new:
                if old:
                    self.pods_on[old] = tuple(p for p in self.pods_on[old] if p.key != key)
                if new:
                    self.pods_on[new] = (*self.pods_on.get(new, ()), self.pod_facts[key])
                self.facts_node[key] = new

    def _refresh(self, uuid: str) -> None:
        old = (self.free[uuid], uuid)
        del self.order[bisect.bisect_left(self.order, old)]
        # a sum over the card's tenants, not a running total: no float drift, and an empty
        # card is exactly 1.0 free
        free = 1.0 - sum(self.tenants[uuid].values())
        self.free[uuid] = free
        bisect.insort(self.order, (free, uuid))

    def rollback(self, mark: int) -> None:
        while len(self.journal) > mark:
            key, uuid, fraction = self.journal.pop()
            self.put(key, uuid, fraction, journal=False)
