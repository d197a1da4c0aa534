"""The fractions a GPU-sharing backend represents exactly, and rounding a need onto them.

The engine sizes to a grid (``Policy.grid``) so that what it decides is what the pod gets:

- **KAI** takes any ``gpu-fraction`` in (0, 1) but hands it to the container as ``GPU_PORTION``
  formatted ``%.2f`` (the binder's ``cache.go``, kai-scheduler/KAI-Scheduler v0.17; 0.125
  becomes "0.12") and rounds fractions up to 0.01 when fitting; ``gpu-memory`` is in MiB,
  which a fraction of the device's memory maps to.
- **HAMi** takes whole percents (``nvidia.com/gpumem-percentage``, ``nvidia.com/gpucores``;
  the fit in Project-HAMi/HAMi v2.10 ``nvidia/device.go`` adds them up per GPU to 100).
- **MIG** has fixed profiles: a level per profile (:func:`profile_level`), built from the MIG
  profile tables (:mod:`fracpilot_libs.mig.profiles`) and set as ``grid_levels``.

So the ``backend`` grid is hundredths: exact on KAI and on HAMi alike (the decision does not
know which backend a workload's pods use; the actuator does, and needs no rounding of its own).
See /work/shared/reference/kai-hami-semantics.md for the upstream facts.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from fracpilot_libs.contracts import BACKEND_GRID_STEPS, GpuSharing, GridKind, Policy

EPS = 1e-9  # float noise: 0.375000001 is 0.375


@dataclass(frozen=True, slots=True)
class Grid:
    """Multiples of ``1/steps``, or, when ``levels`` is set, those fractions only (ascending)."""

    steps: int = BACKEND_GRID_STEPS
    levels: tuple[float, ...] = ()

    def round_up(self, value: float) -> float:
        """The smallest fraction on the grid at or above ``value`` (levels: the largest level
        when ``value`` is above them all)."""
        if self.levels:
            i = bisect_left(self.levels, value - EPS)
            return self.levels[min(i, len(self.levels) - 1)]
        return math.ceil(value * self.steps - EPS) / self.steps

    def contains(self, value: float) -> bool:
        if self.levels:
            return any(abs(value - level) <= EPS for level in self.levels)
        return abs(value * self.steps - round(value * self.steps)) <= EPS * self.steps


def backend_grid(backend: GpuSharing) -> Grid:
    """The grid a backend represents exactly (both are hundredths; see the module doc)."""
    if backend is GpuSharing.KAI:  # GPU_PORTION "%.2f"
        return Grid(steps=100)
    return Grid(steps=100)  # HAMi: whole percents of memory and cores


def profile_level(memory_share: float, compute_share: float) -> float:
    """The largest fraction a fixed profile (a MIG instance) holds: the fraction must fit its
    memory share and its compute share of the card alike (1g.10gb on an A100 80GB holds 0.125
    = 10/80, not 1/7)."""
    return min(memory_share, compute_share)


def levels_of_profiles(shares: Iterable[tuple[float, float]]) -> tuple[float, ...]:
    """``grid_levels`` for fixed profiles given as (memory share, compute share) of the card;
    the hook the MIG profile tables feed (``Policy(grid="levels", grid_levels=...)``)."""
    return tuple(sorted({round(profile_level(m, c), 6) for m, c in shares}))


# The engine asks for a policy's grid and band on every sample: both are derived from the
# policy's grid fields (and ``downsize_min_change``) by value, and memoized by those values, so
# equal policies share them and nothing depends on which policy object asks. Bounded: a service
# resolves few policies, but may see many revisions over its life.


@lru_cache(maxsize=256)
def _grid(kind: GridKind, steps: int, levels: tuple[float, ...]) -> Grid:
    if kind is GridKind.LEVELS:
        return Grid(levels=levels)
    if kind is GridKind.STEPS:
        return Grid(steps=steps)
    return Grid(steps=BACKEND_GRID_STEPS)


@lru_cache(maxsize=256)
def _band(kind: GridKind, steps: int, levels: tuple[float, ...], min_change: float) -> float:
    grid = _grid(kind, steps, levels)
    if grid.levels:  # the smallest gap, as Policy.step says it (the first level counts from 0)
        finest = min(b - a for a, b in pairwise((0.0, *grid.levels)))
    else:
        finest = 1.0 / grid.steps
    return max(finest, min_change)


def grid_of(policy: Policy) -> Grid:
    """The policy's grid."""
    return _grid(policy.grid, policy.grid_steps, policy.grid_levels)


def downsize_band(policy: Policy) -> float:
    """How far below the fraction a need must be to downsize: ``downsize_min_change`` and at
    least one grid step (so a fine grid does not mean frequent resizes)."""
    return _band(policy.grid, policy.grid_steps, policy.grid_levels, policy.downsize_min_change)


def grid_name(policy: Policy) -> str:
    """The grid as explanations say it: "1/8", "hundredths (the backend's)", "levels ..."."""
    if policy.grid is GridKind.LEVELS:
        return "the levels " + ", ".join(f"{level:g}" for level in policy.grid_levels)
    if policy.grid is GridKind.STEPS:
        return f"1/{policy.grid_steps}"
    return "hundredths (what KAI and HAMi represent exactly)"
