"""Packing MIG instances onto GPUs: every GPU the packer makes is one MIG allows (no shared
memory slices, valid start slots, within the card's instances, compute and memory), every
instance is placed once, and the instances sized for workloads that come and go hold every
moment of them."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.mig.layout import (
    GpuLayout,
    Placement,
    Span,
    instances_for_peak,
    pack,
    peak_count,
    problems_of,
)
from fracpilot_libs.mig.profiles import A30_24GB, A100_80GB, CARDS, MigCard, MigProfile

card_st = st.sampled_from(list(CARDS.values()))


@st.composite
def card_and_instances(draw: st.DrawFn) -> tuple[MigCard, list[tuple[str, MigProfile]]]:
    card = draw(card_st)
    profiles = draw(st.lists(st.sampled_from(card.profiles), max_size=40))
    return card, [(f"w{i}", p) for i, p in enumerate(profiles)]


def assert_valid(gpu: GpuLayout, card: MigCard) -> None:
    """The checks again, written out, so that problems_of is not its own judge."""
    assert problems_of(gpu, card) == []
    slots: list[int] = []
    for p in gpu.placements:
        assert p.start in p.profile.starts
        slots += list(range(p.start, p.start + p.profile.memory_slices))
    assert len(slots) == len(set(slots)), "memory slices shared"
    assert all(0 <= s < card.memory_slices for s in slots)
    assert sum(p.profile.compute_slices for p in gpu.placements) <= card.compute_slices
    assert sum(p.profile.memory_mib for p in gpu.placements) <= card.largest.memory_mib
    assert len(gpu.placements) <= card.max_instances
    for name, n in Counter(p.profile.name for p in gpu.placements).items():
        assert n <= card.profile(name).max_instances


@settings(max_examples=300, deadline=None)
@given(card_and_instances())
def test_every_packed_gpu_is_valid_and_every_instance_is_placed_once(
    drawn: tuple[MigCard, list[tuple[str, MigProfile]]],
) -> None:
    card, instances = drawn
    gpus = pack(instances, card, whole=["big"])
    for gpu in gpus:
        if gpu.mig_enabled:
            assert gpu.placements, "an empty GPU"
            assert_valid(gpu, card)
    placed = sorted((p.label, p.profile.name) for g in gpus for p in g.placements)
    assert placed == sorted((label, p.name) for label, p in instances)
    assert [g.whole for g in gpus if not g.mig_enabled] == ["big"]


@settings(max_examples=200, deadline=None)
@given(card_and_instances())
def test_no_fewer_gpus_than_the_slices_demand_and_none_left_idle(
    drawn: tuple[MigCard, list[tuple[str, MigProfile]]],
) -> None:
    card, instances = drawn
    gpus = pack(instances, card)
    compute = sum(p.compute_slices for _, p in instances)
    memory = sum(p.memory_slices for _, p in instances)
    assert len(gpus) >= max(-(-compute // card.compute_slices), -(-memory // card.memory_slices))
    assert all(g.placements for g in gpus)
    shuffled = list(reversed(instances))  # the order given does not matter
    assert [g.counts() for g in pack(shuffled, card)] == [g.counts() for g in gpus]


SEVEN_BY_EIGHT = [c for c in CARDS.values() if (c.compute_slices, c.memory_slices) == (7, 8)]


def shaped(card: MigCard, compute: int, memory: int, me: bool = False) -> MigProfile:
    """The card's profile of ``compute`` and ``memory`` slices (names differ by card)."""
    (found,) = (
        p
        for p in card.profiles
        if (p.compute_slices, p.memory_slices, p.media_extensions) == (compute, memory, me)
    )
    return found


@pytest.mark.parametrize("card", SEVEN_BY_EIGHT, ids=lambda c: c.key)
def test_known_packings(card: MigCard) -> None:
    three, four = shaped(card, 3, 4), shaped(card, 4, 4)
    full = pack([("a", three), ("b", four)], card)
    assert len(full) == 1
    assert {(x.profile.name, x.start) for x in full[0].placements} == {
        (four.name, 0),
        (three.name, 4),
    }
    sevens = pack([(str(i), shaped(card, 1, 1)) for i in range(8)], card)
    assert [len(g.placements) for g in sevens] == [7, 1]
    # the 2g starts only at 0, 2 and 4: a fourth needs a second GPU even though slices 6-7
    # are free, where a 1g of two memory slices (where the card has it) then fits
    two = shaped(card, 2, 2)
    twos = pack([(str(i), two) for i in range(4)], card)
    assert [g.counts() for g in twos] == [{two.name: 3}, {two.name: 1}]
    if any((p.compute_slices, p.memory_slices) == (1, 2) for p in card.profiles):
        one_x2 = shaped(card, 1, 2)
        twos = pack([*((str(i), two) for i in range(4)), ("x", one_x2)], card)
        assert [g.counts() for g in twos] == [{two.name: 3, one_x2.name: 1}, {two.name: 1}]
    me = shaped(card, 1, 1, me=True)
    assert len(pack([("me", me), ("me2", me)], card)) == 2  # one media-extension instance


def test_known_packings_of_the_a30_four_slices() -> None:
    card = A30_24GB
    p = card.profile
    full = pack([("a", p("2g.12gb")), ("b", p("1g.6gb")), ("c", p("1g.6gb"))], card)
    assert [sorted((x.profile.name, x.start) for x in g.placements) for g in full] == [
        [("1g.6gb", 2), ("1g.6gb", 3), ("2g.12gb", 0)]
    ]
    fours = pack([(str(i), p("1g.6gb")) for i in range(5)], card)
    assert [len(g.placements) for g in fours] == [4, 1]  # 4 instances at most on an A30
    whole = pack([("a", p("4g.24gb")), ("b", p("1g.6gb"))], card)
    assert len(whole) == 2
    gpu = GpuLayout([Placement(p("1g.6gb"), s) for s in range(4)] + [Placement(p("1g.6gb"), 4)])
    found = problems_of(gpu, card)
    assert any("5 compute slices: the card has 4" in f for f in found), found
    assert any("runs past memory slice 4" in f for f in found), found


@pytest.mark.parametrize(
    ("placements", "problem"),
    [
        ([("3g.40gb", 2)], "cannot start at memory slice 2"),
        ([("2g.20gb", 0), ("1g.10gb", 1)], "overlaps"),
        ([("1g.20gb", 6), ("1g.10gb", 6)], "overlaps"),
        ([("1g.10gb+me", 0), ("1g.10gb+me", 1)], "at most 1"),
        ([("4g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 3)], "overlaps"),
    ],
)
def test_invalid_gpus_are_told_apart(placements: list[tuple[str, int]], problem: str) -> None:
    gpu = GpuLayout([Placement(A100_80GB.profile(n), s) for n, s in placements])
    found = problems_of(gpu, A100_80GB)
    assert any(problem in f for f in found), found


def test_a_gpu_past_the_compute_slices_is_invalid() -> None:
    # not reachable through valid starts (slice 7 is never a 1g's), so forced here
    one = A100_80GB.profile("1g.10gb")
    gpu = GpuLayout([Placement(one, s) for s in range(7)] + [Placement(one, 7)])
    found = problems_of(gpu, A100_80GB)
    assert any("8 compute slices" in f for f in found)
    assert any("8 instances" in f for f in found)
    assert any("cannot start at memory slice 7" in f for f in found)


def test_peak_count_ends_before_starts_at_the_same_instant() -> None:
    assert peak_count([(0, 10), (10, 20)]) == 1
    assert peak_count([(0, 10), (5, 20), (6, 7)]) == 3
    assert peak_count([]) == 0


def test_instances_follow_the_peak_of_each_size_or_larger() -> None:
    card = A100_80GB
    p = card.profile
    spans = [
        Span(0, 10, p("1g.10gb")),
        Span(0, 10, p("1g.10gb")),
        Span(10, 20, p("3g.40gb")),  # after the small ones: may reuse nothing smaller
        Span(10, 20, p("1g.10gb")),
        Span(5, 15, None),
        Span(12, 14, None),
    ]
    counts, whole = instances_for_peak(spans, card)
    # at t in [10, 20): a 3g and a 1g; at t in [5, 10): two 1g. Peaks: >=1g.10gb: 2,
    # >=3g.40gb: 1 -> one 3g and one 1g.10gb (the 3g serves a 1g while no 3g is there)
    assert counts == {"3g.40gb": 1, "1g.10gb": 1}
    assert whole == 2


@settings(max_examples=200, deadline=None)
@given(
    card_st,
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 10), st.integers(0, 5)),
        max_size=25,
    ),
)
def test_the_instances_for_the_peak_hold_every_moment(
    card: MigCard, raw: list[tuple[int, int, int]]
) -> None:
    chain = card.candidates
    spans = [Span(a, a + d, chain[k % len(chain)]) for a, d, k in raw]
    counts, whole = instances_for_peak(spans, card)
    assert whole == 0
    instances = sorted(
        (chain.index(card.profile(n)) for n, c in counts.items() for _ in range(c)),
        reverse=True,
    )
    for t in {s.start for s in spans}:
        present = sorted(
            (chain.index(s.profile) for s in spans if s.start <= t < s.end), reverse=True
        )
        # greedy: the largest needs take the largest instances
        assert len(present) <= len(instances)
        assert all(need <= have for need, have in zip(present, instances, strict=False))
    # and none is spare: dropping any instance breaks some moment
    for drop in set(instances):
        fewer = list(instances)
        fewer.remove(drop)
        assert any(
            len(present) > len(fewer) or any(n > h for n, h in zip(present, fewer, strict=False))
            for t in {s.start for s in spans}
            for present in [
                sorted(
                    (chain.index(s.profile) for s in spans if s.start <= t < s.end),
                    reverse=True,
                )
            ]
        )
