"""Packing MIG instances onto GPUs under MIG's placement rules, and checking a packing.

A layout is a list of GPUs, each with the instances placed on it (a profile and the memory slice
it starts at), or held whole with MIG disabled for a workload no profile holds. :func:`pack` is
first-fit decreasing: instances largest first (memory slices, then compute slices), each on the
first GPU with a valid start slot whose memory slices are all free, at the lowest such slot,
within the profile's instance count, the card's instances and compute slices; a new GPU when
none has room. Every placement it makes passes :func:`problems_of`, which checks a GPU from
scratch (the property tests run it on random packings).

:func:`instances_for_peak` sizes a static set of instances for workloads that come and go: MIG
is reconfigured only when a GPU is idle, so the instances stay while workloads change, and a
workload may use any instance at least as large as its profile (the candidates form a chain).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fracpilot_libs.mig.profiles import MigCard, MigProfile


@dataclass(frozen=True, slots=True)
class Placement:
    profile: MigProfile
    start: int  # the first memory slice
    label: str = ""  # whom it is for (a workload key), "" when it serves several in turn


@dataclass
class GpuLayout:
    """One GPU: its MIG instances, or ``whole`` (a label) when MIG is disabled for a workload
    that needs the whole card."""

    placements: list[Placement] = field(default_factory=list)
    whole: str | None = None

    @property
    def mig_enabled(self) -> bool:
        return self.whole is None

    def counts(self) -> dict[str, int]:
        """Instances per profile name, in placement order (what mig-parted's mig-devices is)."""
        out: dict[str, int] = {}
        for p in sorted(self.placements, key=lambda p: p.start):
            out[p.profile.name] = out.get(p.profile.name, 0) + 1
        return out

    def used_slots(self) -> set[int]:
        return {s for p in self.placements for s in p.profile.slots(p.start)}

    def compute_slices(self) -> int:
        return sum(p.profile.compute_slices for p in self.placements)

    def memory_mib(self) -> int:
        return sum(p.profile.memory_mib for p in self.placements)

    def start_for(self, profile: MigProfile, card: MigCard) -> int | None:
        """The lowest valid start where ``profile`` fits beside what is placed, or None."""
        if self.whole is not None:
            return None
        if len(self.placements) >= card.max_instances:
            return None
        if sum(p.profile == profile for p in self.placements) >= profile.max_instances:
            return None
        if self.compute_slices() + profile.compute_slices > card.compute_slices:
            return None
        used = self.used_slots()
        for start in profile.starts:
            if used.isdisjoint(profile.slots(start)):
                return start
        return None


def problems_of(gpu: GpuLayout, card: MigCard) -> list[str]:
    """Why ``gpu`` could not be created on ``card`` ([] when it could): unknown profiles,
    invalid start slots, slices past the card or shared, too many instances of a profile or in
    all, more compute slices or memory than the card has."""
    if gpu.whole is not None:
        return ["a whole GPU holds no MIG instances"] if gpu.placements else []
    out: list[str] = []
    seen: dict[int, Placement] = {}
    for p in gpu.placements:
        if p.profile not in card.profiles:
            out.append(f"{p.profile.name} is not a {card.name} profile")
        if p.start not in p.profile.starts:
            out.append(f"{p.profile.name} cannot start at memory slice {p.start}")
        for s in p.profile.slots(p.start):
            if not 0 <= s < card.memory_slices:
                out.append(f"{p.profile.name}@{p.start} runs past memory slice {s}")
            elif s in seen:
                other = seen[s]
                out.append(
                    f"{p.profile.name}@{p.start} overlaps {other.profile.name}@{other.start} "
                    f"at memory slice {s}"
                )
            else:
                seen[s] = p
    for name, n in gpu.counts().items():
        limit = card.profile(name).max_instances if _known(card, name) else 0
        if n > limit:
            out.append(f"{n} x {name}: at most {limit} on a {card.name}")
    if len(gpu.placements) > card.max_instances:
        out.append(f"{len(gpu.placements)} instances: at most {card.max_instances}")
    if gpu.compute_slices() > card.compute_slices:
        out.append(f"{gpu.compute_slices()} compute slices: the card has {card.compute_slices}")
    if gpu.memory_mib() > card.largest.memory_mib:
        out.append(f"{gpu.memory_mib()} MiB of instances: the card has {card.largest.memory_mib}")
    return out


def _known(card: MigCard, name: str) -> bool:
    return any(p.name == name for p in card.profiles)


def pack(
    instances: Iterable[tuple[str, MigProfile]],
    card: MigCard,
    whole: Sequence[str] = (),
) -> list[GpuLayout]:
    """GPUs holding ``instances`` ((label, profile) pairs), first-fit decreasing, then one GPU
    with MIG disabled per label of ``whole``."""
    ordered = sorted(
        instances,
        key=lambda i: (-i[1].memory_slices, -i[1].compute_slices, i[1].name, i[0]),
    )
    gpus: list[GpuLayout] = []
    for label, profile in ordered:
        if profile not in card.profiles:
            raise ValueError(f"{profile.name} is not a {card.name} profile")
        for gpu in gpus:
            start = gpu.start_for(profile, card)
            if start is not None:
                gpu.placements.append(Placement(profile, start, label))
                break
        else:
            gpu = GpuLayout()
            start = gpu.start_for(profile, card)
            if start is None:  # an empty card holds any of its profiles
                raise AssertionError(f"{profile.name} does not fit an empty {card.name}")
            gpu.placements.append(Placement(profile, start, label))
            gpus.append(gpu)
    gpus.extend(GpuLayout(whole=label) for label in whole)
    return gpus


@dataclass(frozen=True, slots=True)
class Span:
    """A workload present from ``start`` until ``end`` (unix seconds, end excluded) that needs
    ``profile`` (None: the whole card)."""

    start: float
    end: float
    profile: MigProfile | None


def peak_count(spans: Iterable[tuple[float, float]]) -> int:
    """The most spans present at once (an end at t comes before a start at t)."""
    events = sorted(e for a, b in spans for e in ((a, 1), (b, -1)))
    present = peak = 0
    for _, step in events:
        present += step
        peak = max(peak, present)
    return peak


def instances_for_peak(spans: Sequence[Span], card: MigCard) -> tuple[dict[str, int], int]:
    """The fewest instances of each profile that hold the workloads present at any moment, and
    the whole GPUs (MIG disabled) for those no profile holds.

    With profiles in chain order, workloads present at a moment fit the instances exactly when,
    for every profile k, those needing k or larger are no more than the instances of k or larger
    (Hall's condition for nested choices). So with D_k the peak count of workloads needing k or
    larger, D_k - D_(k+1) instances of k suffice, and none can be left out.
    """
    chain = card.candidates
    order = {p: i for i, p in enumerate(chain)}
    peaks = [
        peak_count(
            (s.start, s.end) for s in spans if s.profile is not None and order[s.profile] >= k
        )
        for k in range(len(chain))
    ]
    peaks.append(0)
    counts = {p.name: peaks[k] - peaks[k + 1] for k, p in enumerate(chain)}
    whole = peak_count((s.start, s.end) for s in spans if s.profile is None)
    return {n: c for n, c in counts.items() if c}, whole
