"""A tenant's engine under shared isolation: the policy it sizes with, and its state.

Under ``--isolation shared`` each workload's engine sizes its own *need*: the policy's fraction
without per-pod memory headroom (:data:`SHARED_HEADROOM`: the card's one pooled headroom
replaces it) and shared isolation's resize budget (:func:`shared_policy`). :class:`TenantSizer`
keeps, beside the engine's state, the jump statistic and the peak profile the card planner
reads (:class:`TenantState`). The cards are
:class:`~fracpilot_libs.analysis.shared_packing.SharedCluster`'s. Pure: no clock, no I/O.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.forecast import jump_after
from fracpilot_libs.sizing.isolation_policies import MODE_RESIZE_BUDGET as MODE_RESIZE_BUDGET
from fracpilot_libs.sizing.isolation_policies import with_resize_budget as with_resize_budget
from fracpilot_libs.sizing.peak_profile import NO_PROFILE, in_window, profile_period, with_peak
from fracpilot_libs.sizing.state import WorkloadState

# The policy fields a shared-isolation engine sizes with: no per-pod memory headroom (the
# card's pooled headroom replaces it).
SHARED_HEADROOM = {"memory_margin": 0.0, "memory_min_headroom": 0.0}


# Shared isolation's: one below the target of 4, room for the memory upsizes the budget never
# withholds (without per-pod headroom a workload's new memory peak is an upsize; with 4, the
# GenAI trace averaged 4.05 a workload-day). Resizes are counted whole: 3.5 would mean 3.
SHARED_RESIZE_BUDGET = 3.0


def shared_policy(policy: Policy) -> Policy:
    """``policy`` as a tenant's engine uses it under shared isolation: no per-pod headroom,
    and shared isolation's resize budget unless it sets one."""
    return with_resize_budget(policy.model_copy(update=SHARED_HEADROOM), SHARED_RESIZE_BUDGET)


@dataclass
class TenantState:
    """A workload's engine state, its jump statistic and its peak profile (updated in place,
    for speed)."""

    engine: WorkloadState = field(default_factory=WorkloadState)
    jump: float = 0.0
    first_seen: float | None = None
    # memory peak per period of the shared clock (fracpilot_libs.sizing.peak_profile, as the
    # decision service keeps it), the periods of the memory window only
    profile: array[float] = field(default_factory=lambda: NO_PROFILE)

    def peak_profile(self, now: float, policy: Policy) -> tuple[tuple[int, float], ...]:
        """The profile over the memory window before ``now``, oldest period first: exact, as
        every sample is seen on the clock all tenants share (the engine's slots start where
        a workload's samples fell, so a profile read from them counts each slot's peak in the
        two periods it overlaps)."""
        return in_window(self.profile, now, policy)


@dataclass(frozen=True)
class TenantSizer:
    """The engine under ``policy`` (as :func:`shared_policy` makes it), keeping each workload's
    jump statistic beside its state (:func:`fracpilot_libs.sizing.forecast.jump_after`)."""

    policy: Policy
    name: str = "fracpilot"

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> TenantState:
        return TenantState()

    def step(self, state: TenantState, sample: UsageSample) -> tuple[TenantState, float | None]:
        now = sample.timestamp.timestamp()
        share = sample.memory_share
        state.jump = jump_after(state.jump, state.engine, share, now, self.policy)
        if state.first_seen is None:
            state.first_seen = now
        state.profile = with_peak(state.profile, share, now, profile_period(self.policy))
        state.engine, decision = decide(state.engine, sample, self.policy)
        return state, decision.new_fraction if decision else None
