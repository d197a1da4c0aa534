"""The fraction cluster of the packed replay: identical cards and the workloads on them.

:class:`ReplayCluster` changes only through the actuator's planners: a decision through
:func:`~fracpilot_libs.placement.planner.plan_workload`, consolidation through
:func:`~fracpilot_libs.placement.consolidation.consolidation_plan`, within the replay's rate
limit (:data:`MAX_MOVES_PER_CHECK`) and, under enforced isolation, each workload's move budget.
The replay loop that drives it is :func:`fracpilot_libs.analysis.packing_replay.replay_packed`.
Pure: the replay sets the clock (:attr:`ReplayCluster.now`).
"""

from __future__ import annotations

from fracpilot_libs.contracts import PlanKind, WorkloadRef
from fracpilot_libs.placement.consolidation import SAFE_TO_EVICT, consolidation_plan
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep, apply_consolidation
from fracpilot_libs.placement.planner import (
    ClusterState,
    Placement,
    ResizePlan,
    add_node,
    apply_pod_plan,
    move_or_scale_up,
    plan_workload,
)

_DAY_S = 24 * 3600.0


# The consolidation rate limit of the replay: moves per check (the planner's ``max_moves``).
# With 1, each check empties at most one card of one tenant; a card of two waits until one
# of them leaves or moves. Chosen on half the GenAI trace's pods (docs/sizing.md): with no
# limit, enforced isolation saved 1.2 points fewer card-hours there at 0.7 more moves per
# workload-day (budgets spent on cards of two tenants early on).
MAX_MOVES_PER_CHECK = 1


class ReplayCluster:
    """Identical cards and the workloads on them, changed only through the planners: a
    decision through :func:`~fracpilot_libs.placement.planner.plan_workload`, consolidation
    through :func:`~fracpilot_libs.placement.consolidation.consolidation_plan` (the
    actuator's), at each :meth:`consolidate`."""

    def __init__(
        self,
        memory_bytes: int,
        gpus: int | None,
        consolidate: bool = True,
        gpus_per_node: int = 1,
    ) -> None:
        if gpus_per_node < 1 or (gpus is not None and gpus % gpus_per_node):
            raise ValueError("gpus_per_node must be at least 1 and divide the pinned gpus")
        self.memory_bytes = memory_bytes
        self.consolidate_cards = consolidate
        self.pinned = gpus is not None
        self.gpus_per_node = gpus_per_node
        self.state = ClusterState()
        self._node_of: dict[str, str] = {}
        for _ in range((gpus or 0) // gpus_per_node):
            self._add_node()
        self.card_of: dict[str, str] = {}  # workload key -> GPU uuid
        # the consolidation planner's moves (no decision of the moved workload asked for them)
        self.neighbour_moves = 0
        # At most this many moves per workload in any 24 h (enforced isolation): a workload
        # that has made them is protected from consolidation; a move a resize needs (it fits
        # nowhere else) is counted, never withheld. None: no budget.
        self.move_budget: float | None = None
        self.now = 0.0  # the replay's instant (the move budget's clock)
        self.move_times: dict[str, list[float]] = {}
        self.changed = False  # a card lost share since the last consolidation check
        self.max_moves = MAX_MOVES_PER_CHECK

    def _add_node(self) -> None:
        """A node of ``gpus_per_node`` cards (one card: the node is the card)."""
        # Zero-padded so that the planner's tie-break on uuid follows the order cards came in.
        n = len(self.state.gpus) // self.gpus_per_node
        node = f"card-{n:05d}" if self.gpus_per_node == 1 else f"node-{n:05d}"
        before = len(self.state.gpus)
        self.state = add_node(self.state, node, self.gpus_per_node, self.memory_bytes)
        self._node_of.update((g.uuid, node) for g in self.state.gpus[before:])

    def node_of(self, card: str) -> str:
        return self._node_of[card]

    def place(self, workload: WorkloadRef, pod: str, fraction: float) -> bool:
        """Put an arriving workload on the best-fitting card; False when none holds it."""
        plan = self._best_fit(workload, fraction)
        if plan.kind is PlanKind.SCALE_UP:
            if self.pinned:
                return False
            self._add_node()
            plan = self._best_fit(workload, fraction)
        placement = Placement(
            workload=workload, pod=pod, gpu_uuid=plan.gpu_after, fraction=fraction
        )
        self.state = self.state.model_copy(
            update={"placements": (*self.state.placements, placement)}
        )
        self.card_of[workload.key] = plan.gpu_after
        return True

    def _best_fit(self, workload: WorkloadRef, fraction: float) -> ResizePlan:
        base = {"workload": workload, "fraction_before": None, "fraction_after": fraction}
        return move_or_scale_up(self.state, "", fraction, base, self.state.free)

    def resize(self, workload: WorkloadRef, fraction: float) -> PlanKind:
        """The planner's plan for a new fraction, carried out: ``in_place``,
        ``recreate_elsewhere`` (onto a new card when none fits and cards may be added), or
        ``scale_up`` when it fits nowhere on pinned cards (refused: nothing changes)."""
        pods = tuple(p for p in self.state.placements if p.workload.key == workload.key)
        step = plan_workload(self.state, workload, pods, fraction).steps[0]
        if step.kind is PlanKind.SCALE_UP:
            if self.pinned:
                return PlanKind.SCALE_UP
            self._add_node()
            step = plan_workload(self.state, workload, pods, fraction).steps[0]
        self.state = apply_pod_plan(self.state, step)
        if step.kind is PlanKind.RECREATE_ELSEWHERE:
            self._moved(workload.key)
        self.card_of[workload.key] = step.gpu_after
        self.changed = True
        return step.kind

    def release(self, workload: WorkloadRef) -> None:
        """The workload leaves its card."""
        placements = tuple(p for p in self.state.placements if p.workload.key != workload.key)
        self.state = self.state.model_copy(update={"placements": placements})
        self.card_of.pop(workload.key)
        self.changed = True

    def consolidate(self) -> tuple[ConsolidationStep, ...]:
        """The consolidation planner's plan for the cluster as it is, carried out (when
        consolidating, and something changed since the last check, or the last check made
        all the moves the rate limit allows): its moves empty whole cards, each a recreate
        counted in :attr:`neighbour_moves`; a workload with no move
        left in its budget is a pod that may not be evicted."""
        if not self.consolidate_cards or not self.changed:
            return ()
        self.changed = False
        protected = {
            p.pod_key: {SAFE_TO_EVICT: "false"}
            for p in self.state.placements
            if not self._may_move(p.workload.key)
        }
        plan = consolidation_plan(
            self.state,
            max_moves=self.max_moves,
            pod_annotations=protected,
        )
        self.state = apply_consolidation(self.state, plan)
        # a plan cut short by the rate limit may have more to free: check again next instant
        self.changed = len(plan.moves) >= self.max_moves
        for step in plan.moves:
            self.card_of[step.placement.workload.key] = step.to_gpu
            self.neighbour_moves += 1
            self._moved(step.placement.workload.key)
        return plan.steps

    def _may_move(self, key: str) -> bool:
        """Whether one more move keeps the workload within the move budget (always, without)."""
        if self.move_budget is None:
            return True
        recent = [t for t in self.move_times.get(key, ()) if self.now - t < _DAY_S]
        self.move_times[key] = recent
        return len(recent) + 1 <= self.move_budget + 1e-9

    def _moved(self, key: str) -> None:
        if self.move_budget is not None:
            self.move_times.setdefault(key, []).append(self.now)

    def cards_in_use(self) -> int:
        return len(set(self.card_of.values()))

    def overcommitted(self) -> list[str]:
        """Cards whose fractions sum above 1.0 (the planner never leaves one)."""
        return [g.uuid for g in self.state.gpus if self.state.used(g.uuid) > 1.0 + 1e-9]
