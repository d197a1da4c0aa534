"""The numbers behind a decision (:class:`Need`): what the engine sizes, the explanations word
and the outlook reads.

A module of its own so that the engine and its explanations both import it and neither imports
the other.
"""

from __future__ import annotations

from typing import NamedTuple

from fracpilot_libs.contracts import ReasonCode


class Need(NamedTuple):
    """The numbers behind a decision (a named tuple: built on every sample, and a frozen
    dataclass costs four times as much to build)."""

    # The compute level that sizes compute, share of a GPU: the policy percentile, or (soft)
    # the level above which only the delay budget of the compute work lies.
    compute_percentile: float
    compute_need: float  # percentile: that / target utilization; soft: that level
    recent_compute: float  # the lowest of the last confirmation samples
    recent_need: float  # percentile: that / target utilization; soft: that
    memory_peak: float  # share of the device over the memory window
    memory_need: float  # peak plus headroom
    fraction: float  # the larger need on the grid, clamped

    @property
    def driver(self) -> ReasonCode:
        if self.memory_need >= max(self.compute_need, self.recent_need):
            return ReasonCode.MEMORY_HIGH
        return ReasonCode.COMPUTE_HIGH
