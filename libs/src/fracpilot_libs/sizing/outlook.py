"""What the engine is about to do with a workload, for operators (``fracpilot status``).

Read from the engine's state alone, with the engine's own rules (:mod:`fracpilot_libs.sizing.
engine` and :mod:`fracpilot_libs.sizing.hysteresis`): the direction a need calls for, the
request pending within the cooldown and the waits that hold a downsize back are the engine's
functions, not restated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fracpilot_libs.contracts import ComputeSizing, Direction, Policy
from fracpilot_libs.sizing.engine import compute_level_upsizes, need_of
from fracpilot_libs.sizing.grids import EPS
from fracpilot_libs.sizing.hysteresis import downsize_wait, pending_request, sizing_direction
from fracpilot_libs.sizing.need import Need
from fracpilot_libs.sizing.state import WorkloadState


class Outlook(StrEnum):
    NO_HISTORY = "no history"
    STABLE = "stable"
    UPSIZING = "upsizing"  # need above the fraction (confirming), or an upsize asked for
    DOWNSIZING = "downsizing"  # a downsize asked for, or due at the next sample
    WAITING_TO_DOWNSIZE = "waiting to downsize"  # need a step lower, a hold not over yet


@dataclass(frozen=True, slots=True)
class EngineOutlook:
    """The engine's view of one workload at an instant, read from its state alone."""

    outlook: Outlook
    current: float  # the fraction the workload holds
    target: float  # the fraction the engine sizes it to with the history so far
    need: Need
    requested: float | None  # a change asked for within the cooldown, not applied yet
    wait_s: float  # waiting to downsize: engine seconds before a downsize may happen
    held_by: str  # what the wait is for: downsize hold, history, signal hold or cooldown


def describe(
    state: WorkloadState, policy: Policy, now: float, current: float | None = None
) -> EngineOutlook:
    """What :func:`~fracpilot_libs.sizing.engine.decide` would make of this state at ``now``
    (unix seconds, engine time: the samples' timestamps), given usage like the history's.
    ``current`` is the fraction the workload holds when known better than the state (the
    allocations bucket)."""
    need = need_of(state, policy)
    held = current if current is not None else state.current_fraction or policy.max_fraction
    requested = pending_request(state, now, policy)
    if requested is not None and abs(requested - held) <= EPS:
        requested = None  # applied already
    wait_s, held_by = 0.0, ""
    direction = sizing_direction(need.fraction, held, policy)
    if state.samples == 0:
        outlook = Outlook.NO_HISTORY
    elif requested is not None:
        outlook = Outlook.UPSIZING if requested > held else Outlook.DOWNSIZING
    elif direction is Direction.UP and (
        max(need.memory_need, _recent_need_next(state, policy)) > held + EPS
        or compute_level_upsizes(state, need, policy, held)
    ):
        outlook = Outlook.UPSIZING
    elif direction is Direction.DOWN:
        below = state.below_since if state.below_since is not None else now
        held_by, longest = downsize_wait(state, policy, now, below)
        if longest > 0:
            outlook, wait_s = Outlook.WAITING_TO_DOWNSIZE, longest
        else:
            outlook, held_by = Outlook.DOWNSIZING, ""
    else:  # within the band, or only rare bursts above (the engine waits for them)
        outlook = Outlook.STABLE
    return EngineOutlook(outlook, held, need.fraction, need, requested, wait_s, held_by)


def _recent_need_next(state: WorkloadState, policy: Policy) -> float:
    """The need of the samples in a row once the next sample, like the last, is in: the
    confirmation it may complete (the engine upsizes on it at that sample)."""
    recent = state.recent_compute
    window = (*recent, recent[-1])[-policy.compute_upsize_confirmations :] if recent else ()
    if not window or len(window) < policy.compute_upsize_confirmations:
        return 0.0
    low = min(window)
    return low if policy.compute_sizing is ComputeSizing.SOFT else low / policy.target_utilization
