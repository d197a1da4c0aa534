"""What the engine is about to do with a workload, for operators (``fracpilot status``).

Read from the engine's state alone, with the engine's own rules (:mod:`fracpilot_libs.sizing.
engine`): the direction a need calls for, the request pending within the cooldown and the waits
that hold a downsize back are the engine's functions, not restated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fracpilot_libs.contracts import Direction, Policy
from fracpilot_libs.sizing.engine import (
    EPS,
    downsize_wait,
    need_of,
    pending_request,
    rare_bursts_above,
    sizing_direction,
)
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
    elif direction is Direction.UP and not _rare_bursts_only(state, policy, need, held):
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


def _rare_bursts_only(state: WorkloadState, policy: Policy, need: Need, held: float) -> bool:
    """The fraction is above ``held`` only by the soft level, over rare bursts: no upsize."""
    if max(need.memory_need, need.recent_need) > held + EPS:
        return False
    return rare_bursts_above(state, policy, held)
