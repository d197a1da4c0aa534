"""Packed replay where each pod's memory is capped (``--isolation enforced``: HAMi, or KAI with
HAMi-core limits): a pod above its own cap is killed, so headroom is per pod, learned online.

:class:`PopulationSizer` runs the engine with a learned memory headroom
(:mod:`fracpilot_libs.sizing.headroom`) and gives each workload still warming up the
*population prior*: a quantile of the jump statistics of the workloads that have history
(:func:`fracpilot_libs.sizing.isolation_policies.engine_prior`), instead of the uniform rule. Once a
workload has ``warmup`` seconds of history it uses its own statistics.

The population is what the sizer has seen so far, so it means what it says only when all
workloads are replayed together in time order (the packed replay,
:func:`fracpilot_libs.analysis.packing_replay.replay_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.isolation_policies import ENFORCED_HEADROOM as ENFORCED_HEADROOM
from fracpilot_libs.sizing.isolation_policies import PRIOR_QUANTILE, engine_prior
from fracpilot_libs.sizing.isolation_policies import enforced_policy as enforced_policy
from fracpilot_libs.sizing.state import WorkloadState

# Moves per workload in any 24 h under enforced isolation: a consolidation beyond it waits; a
# move a resize needs (the new fraction fits on no card in place) is counted, never withheld.
ENFORCED_MOVE_BUDGET: float | None = 2.0


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
            self._prior = engine_prior(self.population.values(), now, self.policy, self.quantile)
            self._prior_at = now
        return self._prior

    def step(self, state: WorkloadState, sample: UsageSample) -> tuple[WorkloadState, float | None]:
        now = sample.timestamp.timestamp()
        state, decision = decide(state, sample, self.policy, memory_prior=self.prior(now))
        first = state.first_seen if state.first_seen is not None else now
        self.population[sample.workload.key] = (first, state.memory_jump)
        return state, decision.new_fraction if decision else None
