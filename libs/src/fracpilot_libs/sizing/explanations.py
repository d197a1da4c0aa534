"""The numbers behind a decision, in words: the tail of every decision's explanation.

Kept apart from :mod:`fracpilot_libs.sizing.engine` (which calls it) so that the engine's
rules and their wording change separately.
"""

from __future__ import annotations

from fracpilot_libs.contracts import ComputeSizing, Policy
from fracpilot_libs.sizing.grids import grid_name
from fracpilot_libs.sizing.headroom import headroom_rule
from fracpilot_libs.sizing.need import Need


def numbers(need: Need, policy: Policy, current: float, target: float) -> str:
    half_life = f"half-life {policy.compute_half_life_s / 3600:g} h"
    if policy.compute_sizing is ComputeSizing.SOFT:
        compute = (
            f"compute (soft, {half_life}): at most {policy.compute_delay_budget:.0%} of the work "
            f"above {need.compute_percentile:.2f} GPU"
        )
    else:
        compute = (
            f"compute p{policy.compute_percentile:g} ({half_life}) = "
            f"{need.compute_percentile:.2f} GPU / target utilization "
            f"{policy.target_utilization:g} = {need.compute_need:.3f}"
        )
    return (
        f"{compute}; last "
        f"{policy.compute_upsize_confirmations} samples >= {need.recent_compute:.2f} -> "
        f"{need.recent_need:.3f}; memory peak over {policy.memory_window_s / 3600:g} h = "
        f"{need.memory_peak:.3f} of the device + {headroom_rule(policy)} = "
        f"{need.memory_need:.3f}; the larger need rounded up "
        f"to {grid_name(policy)} within [{policy.min_fraction:g}, {policy.max_fraction:g}] "
        f"= {target:g} (was {current:g}); expected utilization after the change: compute "
        f"{need.compute_percentile / target:.0%}, memory {need.memory_peak / target:.0%} of "
        f"the fraction."
    )
