"""Leader election's pure core: the Lease as read, my identity and the time in; what to do out.

- :func:`decide_lease`: *acquire*, *renew* or *stand by*, with the reason and the record to
  write;
- :class:`ElectionCore` runs one elector's rounds against a :class:`LeaseStore`: read,
  decide, write with optimistic concurrency (a write carries the version it read; a conflict
  means another elector wrote first, so it reads again). It takes the time as an argument and
  never sleeps, so a simulation can interleave several cores on one store and one clock.

The stores are in :mod:`fracpilot_actuator.election.lease_stores`, the asyncio elector in
:mod:`fracpilot_actuator.election.elector`; why two leaders never overlap is told there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "fracpilot-actuator"


# --- the pure decision ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    """The part of a Lease's spec that leader election reads and writes.

    ``holder`` is empty when nobody holds the Lease (never taken, or released).
    """

    holder: str
    renew_time: datetime | None
    lease_duration_s: int
    transitions: int = 0
    acquire_time: datetime | None = None

    def expires_at(self) -> datetime | None:
        """When another elector may take the Lease over (None: it may now)."""
        if not self.holder or self.renew_time is None:
            return None
        return self.renew_time + timedelta(seconds=self.lease_duration_s)


class LeaseAction(StrEnum):
    ACQUIRE = "acquire"
    RENEW = "renew"
    STAND_BY = "stand_by"


class Reason(StrEnum):
    NO_LEASE = "no_lease"  # the Lease does not exist yet
    RELEASED = "released"  # the Lease exists and nobody holds it
    HELD_BY_ME = "held_by_me"
    EXPIRED = "expired"  # its holder did not renew it in time
    HELD_BY_OTHER = "held_by_other"


@dataclass(frozen=True)
class LeaseDecision:
    action: LeaseAction
    reason: Reason
    detail: str
    record: LeaseRecord | None  # what to write (acquire, renew); None to stand by
    holder: str = ""  # who holds the Lease as read
    expires_at: datetime | None = None  # standing by: when the holder's Lease runs out


def decide_lease(
    current: LeaseRecord | None, identity: str, now: datetime, lease_duration_s: int
) -> LeaseDecision:
    """What an elector named ``identity`` does at ``now`` with the Lease it read."""
    if not identity:
        raise ValueError("an elector needs a non-empty identity")

    def mine(transitions: int, acquired: datetime) -> LeaseRecord:
        return LeaseRecord(identity, now, lease_duration_s, transitions, acquired)

    if current is None:
        return LeaseDecision(
            LeaseAction.ACQUIRE, Reason.NO_LEASE, "no lease yet: create it", mine(0, now)
        )
    if current.holder == identity:
        return LeaseDecision(
            LeaseAction.RENEW,
            Reason.HELD_BY_ME,
            "held by me: renew",
            mine(current.transitions, current.acquire_time or now),
            holder=identity,
        )
    if not current.holder:
        return LeaseDecision(
            LeaseAction.ACQUIRE,
            Reason.RELEASED,
            "released: take it over",
            mine(current.transitions + 1, now),
        )
    expires = current.expires_at()  # None: a holder that never renewed
    if expires is not None and now < expires:
        return LeaseDecision(
            LeaseAction.STAND_BY,
            Reason.HELD_BY_OTHER,
            f"held by {current.holder} until {expires.isoformat()}",
            None,
            holder=current.holder,
            expires_at=expires,
        )
    return LeaseDecision(
        LeaseAction.ACQUIRE,
        Reason.EXPIRED,
        f"{current.holder} did not renew since {current.renew_time}: take it over",
        mine(current.transitions + 1, now),
        holder=current.holder,
    )


# --- stores --------------------------------------------------------------------------------------


class LeaseConflictError(Exception):
    """The Lease changed since it was read (409): another elector wrote first."""


class LeaseStore(Protocol):
    """One Lease with optimistic concurrency; versions are opaque strings."""

    def get(self) -> tuple[LeaseRecord, str] | None:
        """The record and its version, or None when there is no Lease."""
        ...

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        """Create the Lease; raises :class:`LeaseConflictError` when it exists already."""
        ...

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        """Write if the Lease is still at ``version``; else raise :class:`LeaseConflictError`."""
        ...


# --- one elector's rounds ------------------------------------------------------------------------


@dataclass(frozen=True)
class ElectionTiming:
    """Seconds. The holder renews every ``renew_period_s`` and gives up leading when it has not
    renewed for ``renew_deadline_s``; the others retry every ``retry_period_s`` and take the
    Lease over ``lease_duration_s`` after its last renewal."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    renew_period_s: float = 5.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.lease_duration_s < 1:
            raise ValueError("lease_duration_s must be at least 1 (the Lease counts seconds)")
        if not 0 < self.renew_period_s < self.renew_deadline_s <= self.lease_duration_s:
            raise ValueError(
                "need 0 < renew_period_s < renew_deadline_s <= lease_duration_s, got "
                f"{self.renew_period_s}, {self.renew_deadline_s}, {self.lease_duration_s}"
            )
        if not 0 < self.retry_period_s < self.renew_deadline_s:
            raise ValueError("need 0 < retry_period_s < renew_deadline_s")


class RoundOutcome(StrEnum):
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    STANDING_BY = "standing_by"
    CONFLICT = "conflict"  # lost two races in a row: try again later


@dataclass(frozen=True)
class Attempt:
    """A decision taken at ``now`` on the Lease at ``version``, not written yet."""

    decision: LeaseDecision
    version: str | None
    now: datetime


@dataclass(frozen=True)
class RoundResult:
    outcome: RoundOutcome
    decision: LeaseDecision
    leading_until: datetime | None  # when the elector stops leading unless it renews first

    @property
    def holds(self) -> bool:
        return self.outcome in (RoundOutcome.ACQUIRED, RoundOutcome.RENEWED)


class ElectionCore:
    """One elector's state and rounds. Not thread-safe: use it from one thread at a time."""

    def __init__(self, store: LeaseStore, identity: str, timing: ElectionTiming) -> None:
        if not identity:
            raise ValueError("an elector needs a non-empty identity")
        self.store = store
        self.identity = identity
        self.timing = timing
        self.leading_until: datetime | None = None
        self.observed: LeaseRecord | None = None
        self._version: str | None = None  # of the Lease as last read or written

    def is_leader(self, now: datetime) -> bool:
        return self.leading_until is not None and now < self.leading_until

    def observe(self, now: datetime) -> Attempt | RoundResult:
        """Read the Lease and decide; standing by ends any leadership at once."""
        found = self.store.get()
        record, version = found if found is not None else (None, None)
        self.observed, self._version = record, version
        decision = decide_lease(record, self.identity, now, self.timing.lease_duration_s)
        if decision.action is LeaseAction.STAND_BY:
            if self.leading_until is not None:
                log.warning("lost the lease", extra={"detail": decision.detail})
            self.leading_until = None
            return RoundResult(RoundOutcome.STANDING_BY, decision, None)
        return Attempt(decision, version, now)

    def commit(self, attempt: Attempt) -> RoundResult:
        """Write what ``attempt`` decided; raises :class:`LeaseConflictError` if the Lease moved."""
        record = attempt.decision.record
        assert record is not None
        if attempt.version is None:
            written, version = self.store.create(record)
        else:
            written, version = self.store.update(record, attempt.version)
        self.observed, self._version = written, version
        # Lead until the deadline counted from the renewTime written (the decision's time).
        self.leading_until = attempt.now + timedelta(seconds=self.timing.renew_deadline_s)
        renewing = attempt.decision.action is LeaseAction.RENEW
        return RoundResult(
            RoundOutcome.RENEWED if renewing else RoundOutcome.ACQUIRED,
            attempt.decision,
            self.leading_until,
        )

    def round(self, now: datetime) -> RoundResult:
        """Read, decide, write; after a conflict read once more (someone else won the race)."""
        for _ in range(2):
            step = self.observe(now)
            if isinstance(step, RoundResult):
                return step
            try:
                return self.commit(step)
            except LeaseConflictError:
                continue
        # Still racing. A leadership already held stays bounded by its own deadline.
        return RoundResult(RoundOutcome.CONFLICT, step.decision, self.leading_until)

    def release(self, now: datetime) -> bool:
        """Stop leading, then hand the Lease back if this elector still holds it.

        Writes an empty holder (the others take it over at their next retry) with the version
        of the last read or write: if the Lease moved since, someone else holds it and there
        is nothing to release. Returns True when the release was written.
        """
        self.leading_until = None
        held = self.observed
        if held is None or held.holder != self.identity or self._version is None:
            return False
        released = replace(held, holder="", renew_time=now)
        try:
            self.observed, self._version = self.store.update(released, self._version)
        except LeaseConflictError:
            return False
        return True
