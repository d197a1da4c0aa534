"""Packed replay where each pod's memory is capped (``--isolation enforced``: HAMi, or KAI with
HAMi-core limits): a pod above its own cap is killed, so headroom is per pod, learned online.

:class:`PopulationSizer` runs the engine with a learned memory headroom
(:mod:`fracpilot_libs.sizing.headroom`) and gives each workload still warming up the
*population prior*: a quantile of the jump statistics of the workloads that have history
(:func:`fracpilot_libs.sizing.forecast.population_prior`), instead of the uniform rule. Once a
workload has ``warmup`` seconds of history it uses its own statistics.

The population is what the sizer has seen so far, so it means what it says only when all
workloads are replayed together in time order (the packed replay,
:func:`fracpilot_libs.analysis.packing_replay.replay_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fracpilot_libs.analysis.tenant_sizing import with_resize_budget
from fracpilot_libs.contracts import MemoryHeadroom, MemoryHeadroomMode, Policy, UsageSample
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.forecast import population_prior
from fracpilot_libs.sizing.state import WorkloadState

# The learned headroom an enforced-isolation engine uses when the policy sets none (tuned on
# half the GenAI trace's pods: docs/sizing.md). A 4 h warm-up on the population's prior: with
# 2 h, pods whose own jumps were still small overran (0.011% on the tuning half).
ENFORCED_HEADROOM = MemoryHeadroom(
    mode=MemoryHeadroomMode.LEARNED, factor=1.0, floor=0.05, cap=0.25, warmup=4 * 3600.0
)
PRIOR_QUANTILE = 0.75  # of the population's jump statistics
# Moves per workload in any 24 h under enforced isolation: a consolidation beyond it waits; a
# move a resize needs (the new fraction fits on no card in place) is counted, never withheld.
ENFORCED_MOVE_BUDGET: float | None = 2.0


def enforced_policy(policy: Policy) -> Policy:
    """``policy`` with the learned headroom of enforced isolation and the modes' resize
    budget, unless it sets its own."""
    if "memory_headroom" not in policy.model_fields_set:
        policy = policy.model_copy(update={"memory_headroom": ENFORCED_HEADROOM})
    return with_resize_budget(policy)


@dataclass
class PopulationSizer:
    """The engine under ``policy``, each workload warming up with the population's prior."""

    policy: Policy
    name: str = "fracpilot"
    quantile: float = PRIOR_QUANTILE
    # workload key -> (first seen, jump statistic), as last stepped
    population: dict[str, tuple[float, float]] = field(default_factory=dict)
    _prior_at: float | None = None
    _prior: float | None = None

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> WorkloadState:
        return WorkloadState()

    def prior(self, now: float) -> float | None:
        """The population prior at ``now`` (once per instant: every workload of an instant
        sees the same); None while no workload has history (the uniform rule then)."""
        if self._prior_at != now:
            warm = self.policy.memory_headroom.warmup
            jumps = [j for first, j in self.population.values() if now - first >= warm]
            self._prior = population_prior(jumps, self.quantile) if jumps else None
            self._prior_at = now
        return self._prior

    def step(self, state: WorkloadState, sample: UsageSample) -> tuple[WorkloadState, float | None]:
        now = sample.timestamp.timestamp()
        state, decision = decide(state, sample, self.policy, memory_prior=self.prior(now))
        first = state.first_seen if state.first_seen is not None else now
        self.population[sample.workload.key] = (first, state.memory_jump)
        return state, decision.new_fraction if decision else None
