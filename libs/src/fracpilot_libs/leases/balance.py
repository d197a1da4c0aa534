"""Which decision replica owns which usage partition: pure functions, no I/O.

Each workload's samples are stored in one of ``partitions`` usage streams, its partition
(:func:`fracpilot_libs.nats.subjects.usage_partition`). Decision replicas share the
partitions: each replica owns some, consumes only those, and keeps only those workloads'
histories. Ownership itself is a lease per partition in NATS KV (:mod:`.ownership`); this
module says what the ownership *should* be, given who is alive and who owns what now:

- **balanced**: every live replica gets ``partitions // replicas`` or one more;
- **minimal movement**: a partition keeps its owner while the owner is alive and within its
  quota; the extra ones go to the replicas holding the most already, so when a replica joins
  only partitions moving to it move, and when one leaves only its partitions move;
- **deterministic**: the same inputs give the same answer on every replica, whatever order
  they list the replicas in, so replicas agree without talking to each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def quotas(partitions: int, members: Iterable[str], holding: Mapping[str, int]) -> dict[str, int]:
    """How many partitions each member should own: ``partitions // n`` or one more, the one
    more going to the members holding the most now (ties by name), which moves the fewest."""
    live = sorted(set(members))
    if not live:
        return {}
    base, extra = divmod(partitions, len(live))
    order = sorted(live, key=lambda m: (-holding.get(m, 0), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}


def rebalance(partitions: int, members: Iterable[str], owners: Mapping[int, str]) -> dict[int, str]:
    """The owner every partition should have (empty when no member is alive).

    ``owners`` maps a partition to its current owner; an owner that is not among ``members``
    counts as gone. Each member keeps its lowest-numbered partitions up to its quota; the
    partitions left over go, in order, to the member furthest below its quota (ties by name).
    """
    live = sorted(set(members))
    if not live:
        return {}
    held: dict[str, list[int]] = {m: [] for m in live}
    for p in range(partitions):
        owner = owners.get(p)
        if owner is not None and owner in held:
            held[owner].append(p)
    quota = quotas(partitions, live, {m: len(ps) for m, ps in held.items()})
    target: dict[int, str] = {}
    count = dict.fromkeys(live, 0)
    for m in live:
        for p in held[m][: quota[m]]:
            target[p] = m
        count[m] = min(len(held[m]), quota[m])
    for p in range(partitions):
        if p in target:
            continue
        m = min((m for m in live if count[m] < quota[m]), key=lambda m: (count[m] - quota[m], m))
        target[p] = m
        count[m] += 1
    return target


@dataclass(frozen=True)
class Moves:
    """What one replica does this round: the partitions it lets go and those it takes."""

    release: frozenset[int]  # owned now, the target gives them to another replica
    claim: frozenset[int]  # free now (no lease), the target gives them to this replica


def moves_for(me: str, partitions: int, members: Iterable[str], owners: Mapping[int, str]) -> Moves:
    """This replica's part of :func:`rebalance`. A partition another replica still holds is
    not claimed: that replica releases it first (or its lease runs out)."""
    target = rebalance(partitions, {*members, me}, owners)
    mine = {p for p, o in owners.items() if o == me and p < partitions}
    release = frozenset(p for p in mine if target.get(p) != me)
    claim = frozenset(p for p, o in target.items() if o == me and p not in owners)
    return Moves(release=release, claim=claim)
