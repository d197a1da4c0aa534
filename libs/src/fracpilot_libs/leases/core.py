"""Partition leases' pure core: what one decision replica does with its leases, decided from the
lease bucket as read, the time (passed in) and the lease duration. No I/O, no clock: the
adapter, :mod:`fracpilot_libs.leases.ownership`, reads and writes the bucket and the clock.

- :func:`view_of`: the bucket's keys as members and partition owners;
- :func:`plan_round`: a rebalance round's writes: the stale leases of this replica to free,
  the partitions to hand over and those to claim (:func:`fracpilot_libs.leases.balance.moves_for`
  on the view with the freed leases left out);
- :class:`LeaseBook`: the leases this replica holds, their revisions and until when each is
  trusted, and which to give up after a renewal round;
- :class:`LeaseTiming`: the renewal period, the trust, the wait for a write's ack, the pause
  before the next renewal.

Why two replicas never act on one partition. A replica trusts a lease until ``TRUST`` of the
lease after it *sent* the write that created or renewed it; the server stores that write later
and keeps the key ``lease_s`` after storing it, and another replica can create the key only
once it is gone (compare-and-set). So the holder stops trusting at least ``(1 - TRUST) *
lease_s`` before anyone else may claim, provided the replicas' clocks run at the same rate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from fracpilot_libs.leases.balance import Moves, moves_for

MEMBER = "member."
PARTITION = "partition."
TRUST = 0.75  # share of the lease a replica trusts its own lease for after renewing it
RETRY_S = 0.5  # between renewals while one goes unanswered (a KV leader moving)


def member_key(replica: str) -> str:
    return f"{MEMBER}{replica}"


def partition_key(partition: int) -> str:
    return f"{PARTITION}{partition}"


def lease_io_timeout(lease_s: float) -> float:
    """How long a lease write waits for its ack: ``lease_s / 10``, at least 1 s (a loaded
    machine), at most nats-py's 5 s. A write sent while the bucket has no leader is never
    answered: the wait is how late the replica notices the new one. With nats-py's 5 s one
    unanswered renewal of a 10 s lease ran past its trust (renewed at 0, again at 2.5,
    unanswered until 7.5); with 1 s a renewal is tried every 1.5 s while none is answered."""
    return min(5.0, max(1.0, lease_s / 10))


@dataclass(frozen=True)
class LeaseTiming:
    """Seconds. The bucket keeps a key ``lease_s`` after its last write (its TTL)."""

    lease_s: float

    @property
    def renew_s(self) -> float:
        """Members and leases are rewritten this often."""
        return self.lease_s / 4

    @property
    def trust_s(self) -> float:
        """A lease is trusted this long after the write that created or renewed it was sent."""
        return TRUST * self.lease_s

    @property
    def io_timeout_s(self) -> float:
        return lease_io_timeout(self.lease_s)

    def pause_after_renewal(self, began: float, now: float, *, answered: bool) -> float:
        """Until the next renewal: ``renew_s`` after this one began (one that waited for its
        ack still leaves the next inside the trust), ``RETRY_S`` while one goes unanswered."""
        if not answered:
            return min(RETRY_S, self.renew_s)
        return max(0.0, self.renew_s - (now - began))


# --- the bucket as read ------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """The bucket as one round read it."""

    members: frozenset[str]
    owners: dict[int, str]  # partition -> replica holding its lease
    revisions: dict[int, int]  # partition -> revision of its lease


def view_of(entries: Iterable[tuple[str, bytes, int]]) -> View:
    """The members and leases among ``(key, value, revision)``; other keys are ignored."""
    members: set[str] = set()
    owners: dict[int, str] = {}
    revisions: dict[int, int] = {}
    for key, value, revision in entries:
        if key.startswith(MEMBER):
            members.add(key[len(MEMBER) :])
        elif key.startswith(PARTITION):
            with contextlib.suppress(ValueError):
                p = int(key[len(PARTITION) :])
                owners[p] = value.decode()
                revisions[p] = revision
    return View(frozenset(members), owners, revisions)


@dataclass(frozen=True)
class RoundPlan:
    """One rebalance round of one replica, in the order to carry it out."""

    free: dict[int, int]  # leases naming this replica that it no longer acts on: at revision
    moves: Moves  # computed with the freed leases counted as gone
    replicas: int  # live replicas, this one included

    @property
    def release(self) -> list[int]:
        """Hand over (checkpoint, acknowledge, delete the lease), in order."""
        return sorted(self.moves.release)

    @property
    def claim(self) -> list[int]:
        """Create the lease, in order."""
        return sorted(self.moves.claim)


def plan_round(me: str, partitions: int, view: View, held: Collection[int]) -> RoundPlan:
    """What ``me``, holding ``held``, does with ``view``. A lease naming ``me`` on a partition
    it does not hold (dropped, or a create stored with its ack lost) is freed first: nobody
    consumes that partition, and the round may claim it again."""
    free = {p: view.revisions[p] for p, o in view.owners.items() if o == me and p not in held}
    owners = {p: o for p, o in view.owners.items() if p not in free}
    moves = moves_for(me, partitions, view.members, owners)
    return RoundPlan(free, moves, len(view.members | {me}))


# --- this replica's leases ---------------------------------------------------------------


class Renewal(StrEnum):
    RENEWED = "renewed"
    LOST = "lost"  # someone else holds it, or it ran out
    UNKNOWN = "unknown"  # no answer (NATS trouble): trusted until its deadline


class LeaseBook:
    """The leases this replica holds: each one's revision and until when it is trusted (times
    on the adapter's monotonic clock, passed in). A lease is held from its claim until it is
    forgotten (handed over, lost, no longer trusted); trusted, while held, until ``trust_s``
    after the last write of it that was answered was sent."""

    def __init__(self, timing: LeaseTiming) -> None:
        self.timing = timing
        self._revisions: dict[int, int] = {}
        self._trusted_until: dict[int, float] = {}

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self._revisions)

    def revision(self, partition: int) -> int | None:
        return self._revisions.get(partition)

    def holds(self, partition: int, now: float) -> bool:
        """True while the lease on the partition can be trusted."""
        until = self._trusted_until.get(partition)
        return until is not None and now < until

    def claimed(self, partition: int, revision: int, sent: float) -> None:
        """The create sent at ``sent`` was answered with ``revision``."""
        self._revisions[partition] = revision
        self._trusted_until[partition] = sent + self.timing.trust_s

    def renewed(self, partition: int, revision: int, sent: float) -> None:
        """The renewal sent at ``sent`` was answered with ``revision``. A lease forgotten
        meanwhile (handed over while the renewal was on its way) stays forgotten."""
        if partition in self._revisions:
            self.claimed(partition, revision, sent)

    def forget(self, partition: int) -> int | None:
        """No longer held; the revision it had (None: not held)."""
        self._trusted_until.pop(partition, None)
        return self._revisions.pop(partition, None)

    def lost(self, outcomes: Mapping[int, Renewal]) -> list[int]:
        """After a renewal round: the leases held that it found lost, in order."""
        return sorted(p for p, o in outcomes.items() if o is Renewal.LOST and p in self._revisions)

    def untrusted(self, now: float) -> list[int]:
        """The leases held but no longer trusted at ``now``, in order."""
        return sorted(p for p in self._revisions if not self.holds(p, now))
