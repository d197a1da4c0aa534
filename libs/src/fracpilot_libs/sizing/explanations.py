"""The numbers behind a decision, in words: the tail of every decision's explanation.

Kept apart from :mod:`fracpilot_libs.sizing.engine` (which calls it) so that the engine's
rules and their wording change separately.
"""

from __future__ import annotations

from fracpilot_libs.contracts import ComputeSizing, Policy
from fracpilot_libs.sizing.grids import grid_name
from fracpilot_libs.sizing.headroom import headroom_rule
from fracpilot_libs.sizing.kv_memory import PoolSource, gib
from fracpilot_libs.sizing.need import Need


def kv_rule(
    sized: tuple[float, float, float] | None,
    note: str,
    total_bytes: int,
    memory_peak: float,
    source: PoolSource = PoolSource.UNKNOWN,
) -> str:
    """How a preallocating LLM server's memory was sized (:mod:`fracpilot_libs.sizing.
    kv_memory`), with its numbers; "" for any other workload.

    ``sized``: (fixed part, KV pool, minimum pool or -1) in bytes as the last sample applied
    the KV rule; ``note``: that sample's reason (or why the rule did not apply); ``source``:
    how its pool was known (unknown: a state written before the source was kept, "known").
    The peak KV usage is the one the window's memory peak stands for."""
    if sized is None:
        if not note:
            return ""
        why = note.removeprefix("memory in use: ")
        return f"memory of an LLM server by its memory in use ({why}); "
    fixed, pool, low = sized
    how = "known" if source is PoolSource.UNKNOWN else source.value
    peak_kv = memory_peak * total_bytes - fixed
    if pool <= 0:
        usage = "no KV pool"
    elif peak_kv > pool * (1 + 1e-6):
        usage = (
            f"a window peak of {gib(memory_peak * total_bytes)}, above the fixed part and "
            f"the whole {gib(pool)} pool (sized by memory in use before the pool was known)"
        )
    elif low >= 0 and peak_kv <= low * (1 + 1e-6):
        usage = f"the minimum pool {gib(low)} (one longest sequence) of the {gib(pool)} pool"
        low = -2.0  # said already
    else:
        usage = f"peak KV usage {max(peak_kv, 0.0) / pool:.0%} of the {gib(pool)} pool"
    floor = {-2.0: "", -1.0: "; minimum pool unknown"}.get(low, f"; minimum pool {gib(low)}")
    learning = note.split("; ", 1)[1] if "; " in note else ""  # e.g. conflicting facts
    return f"memory by the KV cache (pool {how}): fixed part {gib(fixed)} + {usage}{floor}; " + (
        f"{learning}; " if learning else ""
    )


def numbers(need: Need, policy: Policy, current: float, target: float, kv: str = "") -> str:
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
        f"{compute}; {kv}last "
        f"{policy.compute_upsize_confirmations} samples >= {need.recent_compute:.2f} -> "
        f"{need.recent_need:.3f}; memory peak over {policy.memory_window_s / 3600:g} h = "
        f"{need.memory_peak:.3f} of the device + {headroom_rule(policy)} = "
        f"{need.memory_need:.3f}; the larger need rounded up "
        f"to {grid_name(policy)} within [{policy.min_fraction:g}, {policy.max_fraction:g}] "
        f"= {target:g} (was {current:g}); expected utilization after the change: compute "
        f"{need.compute_percentile / target:.0%}, memory {need.memory_peak / target:.0%} of "
        f"the fraction."
    )
