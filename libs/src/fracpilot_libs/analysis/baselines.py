"""Sizers that replay can compare: the engine itself, and the baselines it must beat.

A sizer says which fraction a workload holds at its first sample, starts a per-workload state
and, for each sample, returns the new state and a new fraction (or None to keep the current
one). The engine sizer is pure; the VPA baseline updates its per-workload histograms in place,
for speed.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Protocol

from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.sizing.engine import clamp_to_policy, decide
from fracpilot_libs.sizing.histogram import bucket_of, histogram_percentile
from fracpilot_libs.sizing.state import BUCKETS, WorkloadState


class Sizer(Protocol):
    @property
    def name(self) -> str: ...

    def initial(self, requested: float | None) -> float:
        """The fraction held at the first sample, given the trace's requested one."""
        ...

    def start(self) -> Any: ...

    def step(self, state: Any, sample: UsageSample) -> tuple[Any, float | None]: ...


@dataclass(frozen=True)
class EngineSizer:
    """The decision engine under a policy."""

    policy: Policy = field(default_factory=Policy)
    name: str = "fracpilot"

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> WorkloadState:
        return WorkloadState()

    def step(self, state: WorkloadState, sample: UsageSample) -> tuple[WorkloadState, float | None]:
        state, decision = decide(state, sample, self.policy)
        return state, decision.new_fraction if decision else None


@dataclass(frozen=True)
class StaticSizer:
    """Holds one fraction from the first sample on, whatever was requested (1.0: whole GPUs)."""

    fraction: float = 1.0
    name: str = "whole"

    def initial(self, requested: float | None) -> float:
        return self.fraction

    def start(self) -> None:
        return None

    def step(self, state: None, sample: UsageSample) -> tuple[None, float | None]:
        return None, self.fraction


@dataclass
class _VpaState:
    compute: array[float] = field(default_factory=lambda: array("d", bytes(8 * BUCKETS)))
    memory: array[float] = field(default_factory=lambda: array("d", bytes(8 * BUCKETS)))
    total: float = 0.0
    ref: float | None = None


@dataclass(frozen=True)
class VpaSizer:
    """A VPA-style recommender on the same grid: decaying histograms (24 h half-life) of
    compute and memory, target p90 + 15%, and a change only when the current fraction is
    outside [p50 + 15%, p95 + 15%], as the VPA updater acts only outside its bounds."""

    grid: Policy = field(default_factory=Policy)
    half_life_s: float = 24 * 3600.0
    margin: float = 0.15
    name: str = "vpa"

    def initial(self, requested: float | None) -> float:
        return requested or 1.0

    def start(self) -> _VpaState:
        return _VpaState()

    def step(self, state: _VpaState, sample: UsageSample) -> tuple[_VpaState, float | None]:
        now = sample.timestamp.timestamp()
        if state.ref is None:
            state.ref = now
        weight = 2.0 ** ((now - state.ref) / self.half_life_s)
        state.compute[bucket_of(sample.compute)] += weight
        state.memory[bucket_of(sample.memory_share)] += weight
        state.total += weight

        def bound(pct: float) -> float:
            c = histogram_percentile(state.compute, state.total, pct)
            m = histogram_percentile(state.memory, state.total, pct)
            return clamp_to_policy(max(c, m) * (1 + self.margin), self.grid)

        current = sample.allocated_fraction or 1.0
        if bound(50) <= current <= bound(95):
            return state, None
        return state, bound(90)


def baseline_from_spec(spec: str, policy: Policy) -> Sizer:
    """A baseline by name: ``whole`` (whole GPUs), ``vpa`` (VPA-style, on the policy's grid)
    or ``static:F`` (the fraction F for every workload, 0 < F <= 1, on no particular grid).
    Raises ValueError on anything else."""
    name, _, arg = spec.strip().partition(":")
    name = name.lower()
    if name == "whole" and not arg:
        return StaticSizer(1.0, name="whole")
    if name == "vpa" and not arg:
        return VpaSizer(grid=policy)
    if name == "static" and arg:
        try:
            fraction = float(arg)
        except ValueError:
            raise ValueError(f"static:{arg}: {arg!r} is not a number") from None
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise ValueError(f"static:{arg}: the fraction must be in (0, 1]")
        return StaticSizer(fraction, name=f"static:{fraction:g}")
    raise ValueError(f"unknown baseline {spec!r}: use whole, vpa or static:F (0 < F <= 1)")
