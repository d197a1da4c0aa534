"""The partition leases' pure core: the round plan against ``moves_for``, the lease book's trust,
the renewal pacing, and a simulation of replicas sharing a bucket with a TTL (writes stored
late, acks lost, replicas frozen or killed): never two replicas trusting a lease on one
partition at one instant, and every partition owned once the members have had their rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.leases.balance import moves_for
from fracpilot_libs.leases.core import (
    RETRY_S,
    TRUST,
    LeaseBook,
    LeaseTiming,
    Renewal,
    View,
    member_key,
    partition_key,
    plan_round,
    view_of,
)

LEASE_S = 8.0
REPLICAS = ["r0", "r1", "r2", "r3"]

# --- views ---------------------------------------------------------------------------------


@st.composite
def views(draw: st.DrawFn) -> tuple[int, View]:
    """A partition count and a bucket as read: some members, leases held by members or by
    replicas gone (not members any more)."""
    partitions = draw(st.integers(1, 12))
    members = draw(st.frozensets(st.sampled_from(REPLICAS)))
    owners = draw(
        st.dictionaries(
            st.integers(0, partitions - 1), st.sampled_from([*REPLICAS, "gone"]), max_size=12
        )
    )
    revisions = {p: 100 + p for p in owners}
    return partitions, View(members, owners, revisions)


@given(views(), st.sampled_from(REPLICAS), st.data())
def test_a_round_plan_is_moves_for_with_the_stale_leases_freed(
    pv: tuple[int, View], me: str, data: st.DataObject
) -> None:
    partitions, view = pv
    mine = sorted(p for p, o in view.owners.items() if o == me)
    held = data.draw(st.sets(st.sampled_from(mine)) if mine else st.just(set[int]()))
    plan = plan_round(me, partitions, view, held)
    # Freed: the leases naming me that I do not hold, at the revision read.
    assert plan.free == {p: view.revisions[p] for p in mine if p not in held}
    rest = {p: o for p, o in view.owners.items() if p not in plan.free}
    assert plan.moves == moves_for(me, partitions, view.members, rest)
    # Only leases of mine are handed over, only free partitions claimed; both in order.
    assert set(plan.release) <= held
    assert not set(plan.claim) & set(rest)
    assert plan.release == sorted(plan.release)
    assert plan.claim == sorted(plan.claim)
    assert plan.replicas == len(view.members | {me})


@given(views())
def test_replicas_reading_one_view_never_claim_the_same_partition(pv: tuple[int, View]) -> None:
    """Without stale leases every replica computes the same target, so each free partition is
    claimed by one of them (the create's compare-and-set covers the other cases)."""
    partitions, view = pv
    claimed: dict[int, str] = {}
    for me in sorted(view.members):
        held = {p for p, o in view.owners.items() if o == me}
        for p in plan_round(me, partitions, view, held).claim:
            assert p not in claimed, f"{p} claimed by {claimed.get(p)} and {me}"
            claimed[p] = me


def test_view_of_reads_members_and_leases_and_ignores_other_keys() -> None:
    view = view_of(
        [
            (member_key("a"), b"{}", 1),
            (partition_key(3), b"a", 7),
            ("partition.x", b"b", 8),
            ("other", b"", 9),
        ]
    )
    assert view == View(frozenset({"a"}), {3: "a"}, {3: 7})


# --- the lease book ------------------------------------------------------------------------

events = st.lists(
    st.tuples(
        st.sampled_from(["claim", "renew", "forget", "wait"]),
        st.integers(0, 3),  # partition
        st.floats(0, LEASE_S, allow_nan=False),  # time passing before it
    ),
    max_size=40,
)


@given(events)
def test_a_lease_is_never_trusted_past_trust_of_the_lease_after_its_last_answered_write(
    steps: list[tuple[str, int, float]],
) -> None:
    book = LeaseBook(LeaseTiming(LEASE_S))
    last_sent: dict[int, float] = {}
    now = 0.0
    for action, p, dt in steps:
        now += dt
        if action == "claim" and p not in book.owned:
            book.claimed(p, revision=1, sent=now)
            last_sent[p] = now
        elif action == "renew":
            was_held = p in book.owned
            book.renewed(p, revision=2, sent=now)
            if was_held:
                last_sent[p] = now
            assert (p in book.owned) == was_held  # a renewal never brings a lease back
        elif action == "forget":
            book.forget(p)
            last_sent.pop(p, None)
        for q in range(4):
            for t in (now, now + LEASE_S * TRUST / 2, now + LEASE_S):
                if book.holds(q, t):
                    assert q in book.owned
                    assert t < last_sent[q] + TRUST * LEASE_S
            if q in book.owned:  # trusted right up to the deadline
                assert book.holds(q, last_sent[q] + TRUST * LEASE_S - 1e-6)
        assert book.untrusted(now) == sorted(q for q in book.owned if not book.holds(q, now))


def test_only_held_leases_found_lost_are_given_up() -> None:
    book = LeaseBook(LeaseTiming(LEASE_S))
    book.claimed(0, 1, sent=0.0)
    book.claimed(1, 1, sent=0.0)
    outcomes = {0: Renewal.LOST, 1: Renewal.UNKNOWN, 5: Renewal.LOST}
    assert book.lost(outcomes) == [0]


# --- timing --------------------------------------------------------------------------------


@given(
    st.floats(1.0, 86_400.0),
    st.floats(0, 1e6, allow_nan=False),
    st.floats(0, 1e4, allow_nan=False),
    st.booleans(),
)
def test_the_next_renewal_comes_renew_s_after_the_last_began_or_soon_after_no_answer(
    lease_s: float, began: float, took: float, answered: bool
) -> None:
    timing = LeaseTiming(lease_s)
    pause = timing.pause_after_renewal(began, began + took, answered=answered)
    assert 0 <= pause <= timing.renew_s
    if not answered:
        assert pause <= RETRY_S
    elif took <= timing.renew_s:
        assert abs(took + pause - timing.renew_s) < 1e-6 * max(1.0, timing.renew_s)
    else:
        assert pause == 0


# --- replicas sharing a bucket -------------------------------------------------------------


@dataclass
class Entry:
    value: bytes
    revision: int
    stored: float  # server time the write was stored: the TTL counts from here


@dataclass
class Bucket:
    """A KV bucket with a TTL, as the server keeps it: a key vanishes ``ttl`` after its last
    write was stored; create and update compare-and-set."""

    ttl: float
    entries: dict[str, Entry] = field(default_factory=dict)
    revision: int = 0

    def live(self, now: float) -> dict[str, Entry]:
        self.entries = {k: e for k, e in self.entries.items() if now < e.stored + self.ttl}
        return self.entries

    def put(self, key: str, value: bytes, stored: float) -> int:
        self.revision += 1
        self.entries[key] = Entry(value, self.revision, stored)
        return self.revision

    def create(self, key: str, value: bytes, stored: float) -> int | None:
        return None if key in self.live(stored) else self.put(key, value, stored)

    def update(self, key: str, value: bytes, last: int, stored: float) -> int | None:
        e = self.live(stored).get(key)
        return self.put(key, value, stored) if e and e.revision == last else None

    def delete(self, key: str, last: int | None, now: float) -> None:
        e = self.live(now).get(key)
        if e and (last is None or e.revision == last):
            del self.entries[key]

    def view(self, now: float) -> View:
        return view_of((k, e.value, e.revision) for k, e in self.live(now).items())


class Replica:
    """What ownership does with the core, the KV writes made on :class:`Bucket`. A write is
    stored ``delay`` after it was sent; its ack may be lost (then the replica sees no answer)."""

    def __init__(self, name: str, bucket: Bucket, partitions: int) -> None:
        self.name, self.bucket, self.partitions = name, bucket, partitions
        self.timing = LeaseTiming(bucket.ttl)
        self.book = LeaseBook(self.timing)
        self.alive = True

    def renew(self, now: float, delay: float, ack_lost: bool) -> None:
        stored = now + delay
        self.bucket.put(member_key(self.name), b"{}", stored)
        outcomes: dict[int, Renewal] = {}
        for p in sorted(self.book.owned):
            revision = self.book.revision(p)
            assert revision is not None
            key = partition_key(p)
            new = self.bucket.update(key, self.name.encode(), revision, stored)
            if new is None:  # ownership.renew_lease: its own renewal stored, its ack lost
                e = self.bucket.live(stored).get(key)
                if e is not None and e.value == self.name.encode():
                    new = self.bucket.update(key, self.name.encode(), e.revision, stored)
            if new is None:
                outcomes[p] = Renewal.LOST
            elif ack_lost:
                outcomes[p] = Renewal.UNKNOWN
            else:
                self.book.renewed(p, new, now)
                outcomes[p] = Renewal.RENEWED
        for p in self.book.lost(outcomes):
            self.book.forget(p)
        for p in self.book.untrusted(stored):
            self.book.forget(p)

    def rebalance(self, now: float, delay: float, ack_lost: bool) -> None:
        stored = now + delay
        plan = plan_round(self.name, self.partitions, self.bucket.view(now), self.book.owned)
        for p, revision in plan.free.items():
            self.bucket.delete(partition_key(p), revision, stored)
        for p in plan.release:
            revision = self.book.forget(p)
            self.bucket.delete(partition_key(p), revision, stored)
        for p in plan.claim:
            revision = self.bucket.create(partition_key(p), self.name.encode(), stored)
            if revision is not None and not ack_lost:
                self.book.claimed(p, revision, now)


steps = st.lists(
    st.tuples(
        st.integers(0, 2),  # replica
        st.sampled_from(["renew", "rebalance", "renew", "rebalance", "kill"]),
        st.floats(0, LEASE_S / 2, allow_nan=False),  # time passing before the step
        st.floats(0, LEASE_S / 10, allow_nan=False),  # how long after sending a write is stored
        st.booleans(),  # its ack lost
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(st.integers(1, 8), steps)
def test_two_replicas_never_trust_a_lease_on_one_partition_at_once(
    partitions: int, plan: list[tuple[int, str, float, float, bool]]
) -> None:
    bucket = Bucket(ttl=LEASE_S)
    replicas = [Replica(f"r{i}", bucket, partitions) for i in range(3)]
    now = 0.0
    for i, action, dt, delay, ack_lost in plan:
        now += dt
        r = replicas[i]
        if not r.alive:
            continue
        if action == "kill":
            r.alive = False
        elif action == "renew":
            r.renew(now, delay, ack_lost)
        else:
            r.rebalance(now, delay, ack_lost)
        now += delay
        for p in range(partitions):
            trusting = [r.name for r in replicas if r.alive and r.book.holds(p, now)]
            assert len(trusting) <= 1, f"partition {p} trusted by {trusting} at {now}"


@given(st.integers(1, 12), st.lists(st.sampled_from(REPLICAS), min_size=1, unique=True), st.data())
def test_every_partition_gets_one_member_as_owner_after_the_rounds(
    partitions: int, names: list[str], data: st.DataObject
) -> None:
    """From any leases (some held by replicas gone, which run out), members taking turns in
    any order own every partition, balanced, within three rounds each after expiry."""
    bucket = Bucket(ttl=LEASE_S)
    replicas = [Replica(n, bucket, partitions) for n in names]
    for p in data.draw(st.sets(st.integers(0, partitions - 1))):
        bucket.put(partition_key(p), b"gone", stored=0.0)
    now = LEASE_S  # the leases of the replicas gone have run out
    for _ in range(3):
        for r in data.draw(st.permutations(replicas)):
            r.renew(now, 0.0, ack_lost=False)
        for r in data.draw(st.permutations(replicas)):
            r.rebalance(now, 0.0, ack_lost=False)
        now += 0.1
    owners = bucket.view(now).owners
    assert set(owners) == set(range(partitions))
    assert set(owners.values()) <= set(names)
    for r in replicas:
        assert r.book.owned == {p for p, o in owners.items() if o == r.name}
        assert len(r.book.owned) in (partitions // len(names), -(-partitions // len(names)))
