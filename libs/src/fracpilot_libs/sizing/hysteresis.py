"""When the engine may change a fraction: the hysteresis of the sizing rules.

Which way a need moves a fraction (up at once, down only by the downsize band), the request
still pending within the cooldown, how long a downsize must wait (downsize hold, history,
signal hold, cooldown), the application's queue (growing, busy) and the resize budget.
:mod:`fracpilot_libs.sizing.engine` decides with them and :mod:`fracpilot_libs.sizing.outlook`
tells operators by the same rules. Pure; time is passed in.
"""

from __future__ import annotations

from itertools import pairwise

from fracpilot_libs.contracts import Direction, Policy
from fracpilot_libs.sizing.grids import EPS, downsize_band
from fracpilot_libs.sizing.state import WorkloadState

DAY_S = 24 * 3600.0  # the resize budget's window
_UP, _DOWN = Direction.UP, Direction.DOWN  # module constants: cheaper than enum lookups


def sizing_direction(target: float, current: float, policy: Policy) -> Direction | None:
    """Which way a workload holding ``current`` should move to ``target``: up when the target is
    above it, down only when ``downsize_band`` (and a grid step) below, else None (stay)."""
    if target > current + EPS:
        return _UP
    if target <= current - downsize_band(policy) + EPS:
        return _DOWN
    return None


def pending_request(state: WorkloadState, now: float, policy: Policy) -> float | None:
    """The fraction this engine asked for within the cooldown (the actuator may not have
    applied it yet), else None."""
    if (
        state.decided_fraction is not None
        and state.decided_at is not None
        and now - state.decided_at < policy.cooldown_s
    ):
        return state.decided_fraction
    return None


def repeats_pending_request(
    state: WorkloadState, target: float, now: float, policy: Policy
) -> bool:
    """The actuator may lag: do not repeat the same request within the cooldown."""
    return pending_request(state, now, policy) == target


def downsize_wait(
    state: WorkloadState, policy: Policy, now: float, below_since: float
) -> tuple[str, float]:
    """How long a downsize must still wait at ``now`` (engine seconds; 0 or less: it may
    happen), and what for: the downsize hold, the history, a signal hold or the cooldown (the
    longest wait decides). ``below_since``: when the need first fell a full step below."""
    first = state.first_seen if state.first_seen is not None else now
    name, longest = "downsize hold", policy.downsize_hold_s - (now - below_since)
    history = policy.min_history_s - (now - first)
    if history > longest:
        name, longest = "history", history
    if state.hold_until is not None and state.hold_until - now > longest:
        name, longest = "signal hold", state.hold_until - now
    if state.last_change_at is not None:
        cooldown = policy.cooldown_s - (now - state.last_change_at)
        if cooldown > longest:
            name, longest = "cooldown", cooldown
    return name, longest


def may_downsize(state: WorkloadState, policy: Policy, now: float, below_since: float) -> bool:
    if state.first_seen is None or queue_busy(state, policy):
        return False
    return downsize_wait(state, policy, now, below_since)[1] <= 0


def queue_growing(state: WorkloadState, policy: Policy) -> bool:
    """The application's queue grew over the last ``queue_growth_samples`` samples: never
    shorter from one to the next, and longer at the end."""
    w = state.recent_waiting
    if len(w) <= policy.queue_growth_samples or w[-1] <= w[0]:
        return False
    return all(a <= b for a, b in pairwise(w))


def queue_busy(state: WorkloadState, policy: Policy) -> bool:
    """Requests wait (vLLM's queue is non-empty) or the KV cache is nearly full: the
    application is short of the GPU now, whatever the utilization says."""
    waiting = state.recent_waiting
    kv = state.kv_cache_usage
    return bool(waiting and waiting[-1] > 0) or (kv is not None and kv >= policy.kv_cache_busy)


def within_resize_budget(state: WorkloadState, policy: Policy, now: float) -> bool:
    """Whether one more resize keeps the workload within ``resize_budget_per_day`` over the
    last 24 h (always, without a budget)."""
    budget = policy.resize_budget_per_day
    if budget is None:
        return True
    recent = sum(1 for t in state.resize_times if now - t < DAY_S)
    return recent + 1 <= budget + EPS
