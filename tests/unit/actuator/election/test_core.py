"""Leader election's pure part: the decision, one elector's rounds on a store, and a simulation
of racing electors (never two leaders at any instant)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_actuator.election.core import (
    Attempt,
    ElectionCore,
    ElectionTiming,
    LeaseAction,
    LeaseConflictError,
    LeaseRecord,
    Reason,
    RoundOutcome,
    decide_lease,
)
from fracpilot_actuator.election.lease_stores import MemoryLeaseStore

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def held(holder: str, renewed: float, duration: int = 15, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, at(renewed), duration, transitions, at(renewed - 100))


# --- decide --------------------------------------------------------------------------------------


def test_no_lease_is_created_with_me_as_holder() -> None:
    d = decide_lease(None, "a", at(0), 15)
    assert (d.action, d.reason) == (LeaseAction.ACQUIRE, Reason.NO_LEASE)
    assert d.record == LeaseRecord("a", at(0), 15, 0, at(0))


def test_my_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    d = decide_lease(held("a", renewed=0), "a", at(4), 15)
    assert (d.action, d.reason) == (LeaseAction.RENEW, Reason.HELD_BY_ME)
    assert d.record == LeaseRecord("a", at(4), 15, 3, at(-100))


def test_my_lease_is_renewed_even_after_it_expired() -> None:
    # Nobody took it over (that would have changed the holder): renewing is still safe.
    assert decide_lease(held("a", renewed=0), "a", at(60), 15).action is LeaseAction.RENEW


def test_a_fresh_lease_of_another_means_standing_by_until_it_expires() -> None:
    d = decide_lease(held("b", renewed=0), "a", at(14.999), 15)
    assert (d.action, d.reason, d.record) == (LeaseAction.STAND_BY, Reason.HELD_BY_OTHER, None)
    assert (d.holder, d.expires_at) == ("b", at(15))
    assert "held by b" in d.detail


def test_an_expired_lease_is_taken_over_at_its_expiry_exactly() -> None:
    d = decide_lease(held("b", renewed=0), "a", at(15), 15)
    assert (d.action, d.reason, d.holder) == (LeaseAction.ACQUIRE, Reason.EXPIRED, "b")
    assert d.record == LeaseRecord("a", at(15), 15, 4, at(15))


def test_the_holders_lease_duration_counts_not_mine() -> None:
    lease = held("b", renewed=0, duration=30)
    assert decide_lease(lease, "a", at(20), 15).action is LeaseAction.STAND_BY
    assert decide_lease(lease, "a", at(30), 15).record == LeaseRecord("a", at(30), 15, 4, at(30))


def test_a_released_lease_is_taken_over_at_once() -> None:
    released = LeaseRecord("", at(10), 15, 3, at(0))
    d = decide_lease(released, "a", at(10), 15)
    assert (d.action, d.reason) == (LeaseAction.ACQUIRE, Reason.RELEASED)
    assert d.record == LeaseRecord("a", at(10), 15, 4, at(10))


def test_a_holder_without_renew_time_has_expired() -> None:
    d = decide_lease(LeaseRecord("b", None, 15, 1), "a", at(0), 15)
    assert (d.action, d.reason) == (LeaseAction.ACQUIRE, Reason.EXPIRED)


def test_an_empty_identity_is_refused() -> None:
    with pytest.raises(ValueError, match="identity"):
        decide_lease(None, "", at(0), 15)


leases = st.one_of(
    st.none(),
    st.builds(
        LeaseRecord,
        holder=st.sampled_from(["", "a", "b"]),
        renew_time=st.one_of(st.none(), st.integers(-100, 100).map(at)),
        lease_duration_s=st.integers(0, 60),
        transitions=st.integers(0, 1000),
        acquire_time=st.one_of(st.none(), st.integers(-200, 0).map(at)),
    ),
)


@given(leases, st.integers(-100, 200).map(at))
def test_stand_by_exactly_while_another_holds_an_unexpired_lease(
    lease: LeaseRecord | None, now: datetime
) -> None:
    d = decide_lease(lease, "a", now, 15)
    expires = lease.expires_at() if lease else None
    other_holds = lease is not None and lease.holder not in ("", "a")
    standing_by = other_holds and expires is not None and now < expires
    assert (d.action is LeaseAction.STAND_BY) == standing_by
    if d.record is not None:
        assert (d.record.holder, d.record.renew_time, d.record.lease_duration_s) == ("a", now, 15)
        before = lease.transitions if lease else 0
        changes_hands = lease is not None and lease.holder != "a"
        assert d.record.transitions == before + changes_hands


def test_timing_defaults_and_validation() -> None:
    t = ElectionTiming()
    assert (t.lease_duration_s, t.renew_deadline_s, t.renew_period_s, t.retry_period_s) == (
        15,
        10.0,
        5.0,
        2.0,
    )
    for bad in (
        {"renew_deadline_s": 16.0},  # would outlive the lease: two leaders
        {"renew_period_s": 10.0},
        {"retry_period_s": 0.0},
        {"lease_duration_s": 0, "renew_deadline_s": 0.5, "renew_period_s": 0.1},
    ):
        with pytest.raises(ValueError, match=r"need|at least"):
            ElectionTiming(**bad)  # type: ignore[arg-type]


# --- ElectionCore on a store ---------------------------------------------------------------------

FAST = ElectionTiming(lease_duration_s=15, renew_deadline_s=10, renew_period_s=5, retry_period_s=2)


def test_rounds_acquire_renew_and_stand_by() -> None:
    store = MemoryLeaseStore()
    a, b = ElectionCore(store, "a", FAST), ElectionCore(store, "b", FAST)
    first = a.round(at(0))
    assert (first.outcome, first.leading_until) == (RoundOutcome.ACQUIRED, at(10))
    assert a.is_leader(at(9.999))
    assert not a.is_leader(at(10))
    assert b.round(at(1)).outcome is RoundOutcome.STANDING_BY
    assert a.round(at(5)).outcome is RoundOutcome.RENEWED
    assert a.is_leader(at(14))
    # a stops renewing (dies): b takes over once the lease has run out, not before.
    assert b.round(at(19.999)).outcome is RoundOutcome.STANDING_BY
    taken = b.round(at(20))
    assert (taken.outcome, taken.decision.reason) == (RoundOutcome.ACQUIRED, Reason.EXPIRED)
    record = store.get()
    assert record is not None
    assert (record[0].holder, record[0].transitions) == ("b", 1)
    # a comes back: it sees b's lease and gives up at once, before its own deadline would.
    a.leading_until = at(100)  # as if a's clock had stalled
    assert a.round(at(21)).outcome is RoundOutcome.STANDING_BY
    assert not a.is_leader(at(21))


class RacingStore(MemoryLeaseStore):
    """Lets a competitor write between an elector's read and its write, once."""

    def __init__(self, competitor: str, at_time: datetime) -> None:
        super().__init__()
        self.competitor, self.at_time = competitor, at_time
        self.raced = False

    def _race(self) -> None:
        if not self.raced:
            self.raced = True
            ElectionCore(MemoryLeaseStoreView(self), self.competitor, FAST).round(self.at_time)

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        self._race()
        return super().create(record)

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        self._race()
        return super().update(record, version)


class MemoryLeaseStoreView:
    """The racing store without its race (what the competitor writes through)."""

    def __init__(self, store: MemoryLeaseStore) -> None:
        self.store = store

    def get(self) -> tuple[LeaseRecord, str] | None:
        return self.store.get()

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        return MemoryLeaseStore.create(self.store, record)

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        return MemoryLeaseStore.update(self.store, record, version)


def test_a_lost_race_to_create_rereads_and_stands_by() -> None:
    store = RacingStore("b", at(0))
    result = ElectionCore(store, "a", FAST).round(at(0))
    assert result.outcome is RoundOutcome.STANDING_BY
    assert result.decision.holder == "b"


def test_a_lost_race_for_an_expired_lease_rereads_and_stands_by() -> None:
    store = RacingStore("b", at(30))
    store.raced = True
    ElectionCore(store, "c", FAST).round(at(0))  # c held it and died
    store.raced = False
    a = ElectionCore(store, "a", FAST)
    result = a.round(at(30))
    assert (result.outcome, result.decision.holder) == (RoundOutcome.STANDING_BY, "b")
    assert not a.is_leader(at(30))


def test_a_conflict_while_leading_keeps_the_old_deadline_only() -> None:
    class AlwaysConflicts(MemoryLeaseStore):
        fail = False

        def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
            if self.fail:
                raise LeaseConflictError("moved")
            return super().update(record, version)

    store = AlwaysConflicts()
    a = ElectionCore(store, "a", FAST)
    a.round(at(0))
    store.fail = True
    result = a.round(at(5))
    assert (result.outcome, result.leading_until) == (RoundOutcome.CONFLICT, at(10))


def test_release_hands_the_lease_over_at_once() -> None:
    store = MemoryLeaseStore()
    a, b = ElectionCore(store, "a", FAST), ElectionCore(store, "b", FAST)
    a.round(at(0))
    assert a.release(at(1))
    assert not a.is_leader(at(1))
    record = store.get()
    assert record is not None
    assert (record[0].holder, record[0].renew_time) == ("", at(1))
    taken = b.round(at(1.5))
    assert (taken.outcome, taken.decision.reason) == (RoundOutcome.ACQUIRED, Reason.RELEASED)
    assert not a.release(at(2))  # b holds it now: nothing of a's to release


def test_release_after_losing_the_lease_writes_nothing() -> None:
    store = MemoryLeaseStore()
    a, b = ElectionCore(store, "a", FAST), ElectionCore(store, "b", FAST)
    a.round(at(0))
    b.round(at(20))  # took the expired lease; a has not read it since
    writes = store.writes
    assert not a.release(at(21))
    assert store.writes == writes
    record = store.get()
    assert record is not None
    assert record[0].holder == "b"


# --- a simulation: racing electors, one store, skewed clocks, arbitrary interleavings ------------


@dataclass
class SimElector:
    core: ElectionCore
    skew_ms: int  # its clock runs this far ahead of the real (store's) time
    pending: Attempt | None = None
    alive: bool = True
    leader_since: list[int] = field(default_factory=list)

    def local(self, t_ms: int) -> datetime:
        return T0 + timedelta(milliseconds=t_ms + self.skew_ms)


# Weighted by repetition: racing reads and writes often, deaths rarely (a dead elector is done).
OPS = (
    ("round",) * 4
    + ("observe",) * 4
    + ("commit",) * 4
    + ("commit_lost", "drop", "crash", "release")
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ElectionTiming, list[int], list[tuple[int, str, int]]]:
    lease_s = draw(st.integers(1, 4))
    deadline_ms = draw(st.integers(2, lease_s * 1000))
    timing = ElectionTiming(
        lease_duration_s=lease_s,
        renew_deadline_s=deadline_ms / 1000,
        renew_period_s=deadline_ms / 2000,
        retry_period_s=deadline_ms / 2000,
    )
    n = draw(st.integers(2, 3))
    margin_ms = lease_s * 1000 - deadline_ms  # the clock skew the design tolerates
    skews = draw(st.lists(st.integers(0, margin_ms), min_size=n, max_size=n))
    # Mostly short gaps (requests racing), sometimes long ones (a lease running out).
    gaps = st.one_of(st.integers(0, 50), st.integers(0, lease_s * 1500))
    steps = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.sampled_from(OPS), gaps), min_size=20, max_size=100
        )
    )
    return timing, skews, steps


def leaders(electors: list[SimElector], t_ms: int) -> list[str]:
    return [e.core.identity for e in electors if e.alive and e.core.is_leader(e.local(t_ms))]


def check_instant(electors: list[SimElector], store: MemoryLeaseStore, t_ms: int) -> None:
    now_leading = leaders(electors, t_ms)
    assert len(now_leading) <= 1, f"two leaders at t={t_ms} ms: {now_leading}"
    if now_leading:  # and the Lease agrees with the leader
        record = store.get()
        assert record is not None
        assert record[0].holder == now_leading[0]


def step(e: SimElector, op: str, t_ms: int) -> None:
    now = e.local(t_ms)
    if op == "round":
        e.pending = None
        e.core.round(now)
    elif op == "observe":
        observed = e.core.observe(now)
        e.pending = observed if isinstance(observed, Attempt) else None
    elif op in ("commit", "commit_lost") and e.pending is not None:
        attempt, e.pending = e.pending, None
        try:
            if op == "commit":
                e.core.commit(attempt)
            else:  # the write lands but the reply is lost: the elector learns nothing
                record = attempt.decision.record
                assert record is not None
                if attempt.version is None:
                    e.core.store.create(record)
                else:
                    e.core.store.update(record, attempt.version)
        except LeaseConflictError:
            pass
    elif op == "drop":  # the request never reached the apiserver
        e.pending = None
    elif op == "crash":
        e.alive = False
    elif op == "release":
        e.core.release(now)
        e.alive = False


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_never_two_leaders_at_any_instant(
    scenario: tuple[ElectionTiming, list[int], list[tuple[int, str, int]]],
) -> None:
    timing, skews, steps = scenario
    store = MemoryLeaseStore()
    electors = [
        SimElector(ElectionCore(store, f"e{i}", timing), skew) for i, skew in enumerate(skews)
    ]
    t_ms = 0
    for index, op, dt_ms in steps:
        # Leadership only starts at a write and only ends with time, so checking right before
        # and after every step checks every instant.
        t_ms += dt_ms
        check_instant(electors, store, t_ms)
        if electors[index].alive:
            step(electors[index], op, t_ms)
        check_instant(electors, store, t_ms)

    # Liveness: once the others are gone, a survivor leads after at most one lease duration.
    survivors = [e for e in electors if e.alive]
    if survivors:
        for other in survivors[1:]:
            other.alive = False
        t_ms += timing.lease_duration_s * 1000 + max(skews)
        survivors[0].core.round(survivors[0].local(t_ms))
        assert leaders(electors, t_ms) == [survivors[0].core.identity]
