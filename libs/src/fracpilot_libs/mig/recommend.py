"""The smallest MIG profile that fits a workload's need.

Memory is hard: the profile's instance memory must hold the memory need (an instance cannot
borrow memory; past it is an out-of-memory error). Compute is the profile's share of the card,
its compute slices of the card's (7; the A30's 4), and must cover the compute need. The
candidates form a chain in which each profile holds at least the memory and compute of the one
before (on an A100 80GB 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; media-extension
profiles are never picked), so "smallest" is the first that fits both. A compute need above a
whole card is capped at the whole card, as the engine caps a fraction at 1. A memory need above
the largest profile fits no profile: the workload needs the card with MIG disabled (its full
memory), or a bigger card.
"""

from __future__ import annotations

from dataclasses import dataclass

from fracpilot_libs.mig.profiles import MigCard, MigProfile

EPS = 1e-9  # float noise: a compute need this close to a share is at it, not above


@dataclass(frozen=True, slots=True)
class MigNeed:
    """What a workload needs of a GPU, in this package's own terms."""

    key: str  # who needs it (a workload key); carried through to layouts
    memory_bytes: int  # hard
    compute_share: float  # share of one whole card's compute

    def __post_init__(self) -> None:
        if self.memory_bytes < 0:
            raise ValueError(f"memory_bytes {self.memory_bytes} is negative")
        if not self.compute_share >= 0:  # also rejects NaN
            raise ValueError(f"compute_share {self.compute_share} is not a share >= 0")


@dataclass(frozen=True, slots=True)
class Recommendation:
    need: MigNeed
    card: MigCard
    profile: MigProfile | None  # None: no profile holds the memory need
    driver: str  # "memory", "compute" or "both": what chose the profile (or ruled them out)

    @property
    def fits(self) -> bool:
        return self.profile is not None

    @property
    def reason(self) -> str:
        need = self.need
        gib = need.memory_bytes / 1024**3
        if self.profile is None:
            largest = self.card.largest
            return (
                f"memory need {gib:.2f} GiB is above {largest.name} "
                f"({largest.memory_mib / 1024:.2f} GiB): a whole {self.card.name} without MIG"
            )
        p = self.profile
        return (
            f"{p.name}: {p.memory_mib / 1024:.2f} GiB >= {gib:.2f} GiB memory, "
            f"{p.compute_slices}/{self.card.compute_slices} = {p.compute_share:.3f} >= "
            f"{need.compute_share:.3f} compute"
            f" (sized by {self.driver})"
        )


def memory_fits(profile: MigProfile, memory_bytes: int) -> bool:
    return memory_bytes <= profile.memory_bytes


def compute_fits(profile: MigProfile, compute_share: float) -> bool:
    return min(compute_share, 1.0) <= profile.compute_share + EPS


def recommend(need: MigNeed, card: MigCard) -> Recommendation:
    """The smallest profile of ``card`` that holds ``need``."""
    by_memory = next((p for p in card.candidates if memory_fits(p, need.memory_bytes)), None)
    by_compute = next(p for p in card.candidates if compute_fits(p, need.compute_share))
    if by_memory is None:
        return Recommendation(need, card, None, "memory")
    order = card.candidates.index
    chosen = max(by_memory, by_compute, key=order)
    driver = "compute" if chosen != by_memory else "memory" if chosen != by_compute else "both"
    return Recommendation(need, card, chosen, driver)
