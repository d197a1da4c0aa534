"""Partition assignment among decision replicas: balanced, deterministic, minimal movement, and
the decentralised rounds (each replica acting on its own share) converge to it."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.leases.balance import moves_for, quotas, rebalance
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.policies import scope_chain, workload_scope
from fracpilot_libs.sizing.policies import workload_chain_keys as _chain_keys

NAMES = [f"r{i}" for i in range(8)]
members_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True)


@st.composite
def situations(draw: st.DrawFn, max_partitions: int = 64) -> tuple[int, list[str], dict[int, str]]:
    """A partition count, the live members, and current owners (some of them gone)."""
    n = draw(st.integers(1, max_partitions))
    members = draw(members_st)
    owners: dict[int, str] = {}
    for p in range(n):
        owner = draw(st.sampled_from([None, *NAMES]))
        if owner is not None:
            owners[p] = owner
    return n, members, owners


def counts(target: dict[int, str], members: list[str]) -> dict[str, int]:
    c = dict.fromkeys(members, 0)
    for owner in target.values():
        c[owner] += 1
    return c


def kept(target: dict[int, str], owners: dict[int, str]) -> int:
    return sum(1 for p, o in owners.items() if target.get(p) == o)


@given(situations())
def test_every_partition_gets_a_live_owner_and_the_load_is_balanced(
    case: tuple[int, list[str], dict[int, str]],
) -> None:
    n, members, owners = case
    target = rebalance(n, members, owners)
    assert sorted(target) == list(range(n))
    assert set(target.values()) <= set(members)
    c = counts(target, members)
    assert max(c.values()) - min(c.values()) <= 1
    assert c == quotas(n, members, {m: sum(o == m for o in owners.values()) for m in members})


@given(situations(), st.randoms(use_true_random=False))
def test_the_answer_does_not_depend_on_who_asks_or_in_what_order(
    case: tuple[int, list[str], dict[int, str]], rnd: random.Random
) -> None:
    n, members, owners = case
    shuffled = members[:]
    rnd.shuffle(shuffled)
    assert rebalance(n, shuffled, dict(reversed(owners.items()))) == rebalance(n, members, owners)


@given(situations())
def test_a_balanced_assignment_stays_as_it_is(case: tuple[int, list[str], dict[int, str]]) -> None:
    n, members, owners = case
    target = rebalance(n, members, owners)
    assert rebalance(n, members, target) == target


@settings(max_examples=200)
@given(situations(max_partitions=6), st.integers(1, 3))
def test_no_balanced_assignment_keeps_more_partitions_where_they_are(
    case: tuple[int, list[str], dict[int, str]], m: int
) -> None:
    n, _, owners = case
    members = NAMES[:m]
    target = rebalance(n, members, owners)
    lo, hi = n // m, -(-n // m)
    best = 0
    for assignment in itertools.product(members, repeat=n):  # every balanced assignment
        c = [assignment.count(x) for x in members]
        if min(c) >= lo and max(c) <= hi:
            best = max(best, kept(dict(enumerate(assignment)), owners))
    assert kept(target, owners) == best


@given(st.integers(1, 64), members_st, st.data())
def test_when_a_replica_leaves_only_its_partitions_move(
    n: int, members: list[str], data: st.DataObject
) -> None:
    before = rebalance(n, members, {})
    gone = data.draw(st.sampled_from(members))
    survivors = [m for m in members if m != gone]
    after = rebalance(n, survivors, before)
    if not survivors:
        assert after == {}
        return
    for p, owner in before.items():
        if owner != gone:
            assert after[p] == owner


@given(st.integers(1, 64), members_st, st.data())
def test_when_a_replica_joins_partitions_move_only_to_it(
    n: int, members: list[str], data: st.DataObject
) -> None:
    before = rebalance(n, members, {})
    joiner = data.draw(st.sampled_from([x for x in NAMES if x not in members]))
    after = rebalance(n, [*members, joiner], before)
    for p, owner in after.items():
        assert owner in (before[p], joiner)
    assert sum(o == joiner for o in after.values()) == n // (len(members) + 1)


@given(situations(), st.randoms(use_true_random=False))
def test_replicas_acting_on_their_own_share_settle_within_three_rounds(
    case: tuple[int, list[str], dict[int, str]], rnd: random.Random
) -> None:
    """Each round every replica, in any order and seeing the others' moves so far, releases
    what it should give away and claims free partitions it should own (the lease store: a
    claim of a held one fails). Leases of replicas that are gone have run out. The leases
    settle on a complete, balanced assignment that no replica wants to change, and a replica
    holding no more than its fair share never loses a partition on the way."""
    n, members, start = case
    leases = {p: o for p, o in start.items() if o in members}
    fair = n // len(members)
    keepers = {p: o for p, o in leases.items() if sum(x == o for x in leases.values()) <= fair}
    for _ in range(3):
        order = members[:]
        rnd.shuffle(order)
        for me in order:
            moves = moves_for(me, n, members, leases)
            for p in moves.release:
                del leases[p]
            for p in moves.claim:
                leases.setdefault(p, me)
            assert all(leases.get(p) == o for p, o in keepers.items())
    assert sorted(leases) == list(range(n))
    assert rebalance(n, members, leases) == leases
    c = counts(leases, members)
    assert max(c.values()) - min(c.values()) <= 1


def test_a_replica_never_claims_a_partition_another_still_holds() -> None:
    moves = moves_for("b", 4, ["a", "b"], {0: "a", 1: "a", 2: "a", 3: "a"})
    assert moves.claim == frozenset()
    moves = moves_for("a", 4, ["a", "b"], {0: "a", 1: "a", 2: "a", 3: "a"})
    assert moves.release == frozenset({2, 3})


def test_slots_are_fnv1a_of_the_two_tokens() -> None:
    # FNV-1a 32-bit test vectors ("foobar", "a"), over the two tokens written one after the other.
    assert subjects.slot_of("foo", "bar") == 0xBF9CF968 % subjects.USAGE_SLOTS
    assert subjects.slot_of("", "a") == 0xE40C292C % subjects.USAGE_SLOTS


@pytest.mark.parametrize("partitions", [1, 2, 7, 16, 24, 32, 1024])
def test_every_slot_is_in_exactly_one_partition_stream(partitions: int) -> None:
    owners: dict[str, int] = {}
    for p in range(partitions):
        for subject in subjects.usage_stream_subjects(p, partitions):
            assert subject not in owners, subject
            owners[subject] = p
    # every slot, and each partition's batches
    assert len(owners) == subjects.USAGE_SLOTS + partitions
    for p in range(partitions):
        assert owners[f"{subjects.USAGE_BATCH_PREFIX}.{p}.*"] == p
    sizes = [len(subjects.usage_stream_subjects(p, partitions)) for p in range(partitions)]
    assert max(sizes) - min(sizes) <= 1  # as even as the slots allow


names = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="/"), min_size=1, max_size=40
)


@given(namespace=names, name=names, cluster=st.text(min_size=1, max_size=20))
def test_a_checkpoint_key_names_the_partition_of_its_workload(
    namespace: str, name: str, cluster: str
) -> None:
    wl = WorkloadRef(cluster=cluster, namespace=namespace, owner_name=name)
    for n in (1, 7, 16):
        assert subjects.partition_of_kv_key(subjects.kv_key(wl), n) == subjects.usage_partition(
            wl, n
        )


@given(namespace=names, name=names)
def test_a_workloads_subject_is_stored_in_its_partitions_stream(namespace: str, name: str) -> None:
    wl = WorkloadRef(namespace=namespace, owner_name=name)
    subject = subjects.usage_subject(wl)
    slot_wildcard = subject.rsplit(".", 2)[0] + ".*.*"
    for n in (1, 7, 16):
        assert slot_wildcard in subjects.usage_stream_subjects(subjects.usage_partition(wl, n), n)


def test_usage_stream_names_give_back_their_partition() -> None:
    assert subjects.usage_stream_partition(subjects.usage_stream(12)) == 12
    assert subjects.usage_stream_partition(subjects.LEGACY_USAGE_STREAM) is None
    assert subjects.usage_stream_partition("FRACPILOT_USAGE_x") is None


@pytest.mark.parametrize("key", ["", "no-slashes", "a/b", "c/ns/Kind/"])
def test_a_key_of_another_shape_has_no_partition(key: str) -> None:
    assert subjects.partition_of_kv_key(key, 16) is None


@given(namespace=names, name=names)
def test_policy_keys_are_spelled_as_the_scopes_spell_them(namespace: str, name: str) -> None:
    wl = WorkloadRef(namespace=namespace, owner_name=name)
    expected = tuple(s.key for s in scope_chain(workload_scope(wl)))
    assert _chain_keys(namespace, name, wl.owner_kind) == expected


def test_the_position_comes_from_either_form_of_the_reply_subject() -> None:
    v1 = "$JS.ACK.FRACPILOT_USAGE_3.decision-p3.1.4021.17.1764693600000000000.5"
    v2 = "$JS.ACK.hub.ACCHASH.FRACPILOT_USAGE_3.decision-p3.1.4021.17.1764693600000000000.5.tok"
    assert subjects.stream_position(v1) == (4021, 1764693600000000000)
    assert subjects.stream_position(v2) == (4021, 1764693600000000000)


CHAT = subjects.slot_of("inference", "chat")


@pytest.mark.parametrize(
    ("namespace", "name", "subject", "ok"),
    [
        ("inference", "chat", f"fracpilot.usage.v1.{CHAT}.inference.chat", True),
        (
            "inference",
            "llama-3.1",
            f"fracpilot.usage.v1.{subjects.slot_of('inference', 'llama-3_1')}.inference.llama-3_1",
            True,
        ),
        ("inference", "chat", f"fracpilot.usage.v1.{CHAT}.inference.other", False),
        ("3", "b.c", "fracpilot.usage.v1.3.b.c", False),  # not fooled by a look-alike tail
        ("inference", "chat", f"fracpilot.usage.v1.{CHAT}.xinference.chat", False),
        ("inference", "chat", f"fracpilot.usage.v1.{(CHAT + 1) % 1024}.inference.chat", False),
    ],
)
def test_a_sample_belongs_on_its_own_workloads_subject(
    namespace: str, name: str, subject: str, ok: bool
) -> None:
    assert subjects.on_own_subject(subject, namespace, name, slot_too=True) is ok
    assert subjects.on_own_subject(
        subjects.usage_subject(WorkloadRef(namespace=namespace, owner_name=name)),
        namespace,
        name,
        slot_too=True,
    )


def test_the_slot_is_checked_only_when_asked() -> None:
    wrong_slot = f"fracpilot.usage.v1.{(CHAT + 1) % 1024}.inference.chat"
    assert subjects.on_own_subject(wrong_slot, "inference", "chat", slot_too=False)


def test_a_sample_left_from_another_partition_count_is_told_apart() -> None:
    subject = f"fracpilot.usage.v1.{CHAT}.inference.chat"
    assert not subjects.of_another_partition(subject, 16, CHAT % 16)
    assert subjects.of_another_partition(subject, 16, (CHAT + 1) % 16)
    assert not subjects.of_another_partition(subject, 4, CHAT % 4)
    assert subjects.of_another_partition("fracpilot.usage.v1.x.inference.chat", 16, 0)
