"""MIG profile tables and recommendations: the smallest profile that holds a workload's memory
(hard) and compute (slices of 7), checked at every boundary of both cards' tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.mig.profiles import (
    A100_80GB,
    CARDS,
    H100_80GB,
    MIB,
    MigCard,
    card_for_model,
)
from fracpilot_libs.mig.recommend import MigNeed, recommend

GIB = 1024**3
cards = pytest.mark.parametrize("card", list(CARDS.values()), ids=list(CARDS))

# name: (compute slices, memory slices, max instances, valid starts), as the MIG User Guide's
# tables and `nvidia-smi mig -lgipp` give them (see fracpilot_libs.mig.profiles)
EXPECTED = {
    "1g.10gb": (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1g.10gb+me": (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g.20gb": (1, 2, 4, (0, 2, 4, 6)),
    "2g.20gb": (2, 2, 3, (0, 2, 4)),
    "3g.40gb": (3, 4, 2, (0, 4)),
    "4g.40gb": (4, 4, 1, (0,)),
    "7g.80gb": (7, 8, 1, (0,)),
}
CHAIN = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def need(memory_bytes: int, compute: float) -> MigNeed:
    return MigNeed("ns/w", memory_bytes, compute)


@cards
def test_the_tables_hold_the_upstream_slices_counts_and_starts(card: MigCard) -> None:
    got = {
        p.name: (p.compute_slices, p.memory_slices, p.max_instances, p.starts)
        for p in card.profiles
    }
    assert got == EXPECTED
    assert [p.name for p in card.candidates] == CHAIN
    assert card.profile("7g.80gb").memory_slices == card.memory_slices == 8
    assert card.profile("7g.80gb").compute_slices == card.compute_slices == 7


@cards
def test_every_start_leaves_the_profile_on_the_card_and_counts_match_the_starts(
    card: MigCard,
) -> None:
    for p in card.profiles:
        assert all(s >= 0 and s + p.memory_slices <= card.memory_slices for s in p.starts)
        if not p.media_extensions:  # as many instances as disjoint starts
            assert p.max_instances == len(p.starts)


@cards
def test_each_candidate_holds_at_least_the_one_before(card: MigCard) -> None:
    for a, b in zip(card.candidates, card.candidates[1:], strict=False):
        assert b.memory_mib >= a.memory_mib
        assert b.compute_slices >= a.compute_slices
        assert (b.memory_mib, b.compute_slices) != (a.memory_mib, a.compute_slices)


@cards
@pytest.mark.parametrize("index", range(len(CHAIN)))
def test_memory_boundaries(card: MigCard, index: int) -> None:
    """A need of exactly a profile's memory fits it; one byte more goes to the next one."""
    p = card.profile(CHAIN[index])
    at = recommend(need(p.memory_bytes, 0.0), card)
    # the smallest profile holding this much memory: 1g.20gb, not 2g.20gb, for 20 GB
    first_with_this_memory = next(c for c in card.candidates if c.memory_mib == p.memory_mib)
    assert at.profile == first_with_this_memory
    above = recommend(need(p.memory_bytes + 1, 0.0), card)
    bigger = [c for c in card.candidates if c.memory_mib > p.memory_mib]
    assert above.profile == (bigger[0] if bigger else None)


@cards
@pytest.mark.parametrize("slices", range(1, 8))
def test_compute_boundaries(card: MigCard, slices: int) -> None:
    """A compute need of exactly k/7 fits a profile with k slices; a bit more needs more."""
    smallest = next(c for c in card.candidates if c.compute_slices >= slices)
    assert recommend(need(0, slices / 7), card).profile == smallest
    assert recommend(need(0, slices / 7 + 1e-12), card).profile == smallest  # float noise
    if slices < 7:
        more = next(c for c in card.candidates if c.compute_slices > slices)
        assert recommend(need(0, slices / 7 + 1e-6), card).profile == more


@cards
def test_the_brief_s_examples(card: MigCard) -> None:
    assert recommend(need(int(9 * GIB), 0.05), card).profile == card.profile("1g.10gb")
    assert recommend(need(int(10.1 * GIB), 0.05), card).profile == card.profile("1g.20gb")
    assert recommend(need(int(10.1 * GIB), 0.2), card).profile == card.profile("2g.20gb")
    # memory of a 3g, compute of a 4g
    rec = recommend(need(int(30 * GIB), 0.5), card)
    assert (rec.profile, rec.driver) == (card.profile("4g.40gb"), "compute")
    rec = recommend(need(int(39 * GIB), 0.1), card)
    assert (rec.profile, rec.driver) == (card.profile("3g.40gb"), "memory")
    assert recommend(need(int(41 * GIB), 0.1), card).profile == card.profile("7g.80gb")


@cards
def test_memory_past_the_largest_profile_fits_none_and_compute_is_capped(card: MigCard) -> None:
    largest = card.profile("7g.80gb")
    rec = recommend(need(largest.memory_bytes + 1, 0.1), card)
    assert rec.profile is None
    assert not rec.fits
    assert rec.driver == "memory"
    assert "without MIG" in rec.reason
    assert recommend(need(0, 1.18), card).profile == largest  # p95 / 0.85 may pass 1


def test_instance_memory_errs_low_against_the_names() -> None:
    for card in (A100_80GB, H100_80GB):
        for p in card.profiles:
            nominal_gb = int(p.name.split(".")[1].split("gb")[0])
            assert p.memory_mib * MIB < nominal_gb * GIB


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA H100 PCIe 80GB", "h100-80gb"),
        ("h100-80gb", "h100-80gb"),
        ("NVIDIA A100-SXM4-40GB", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H100 NVL 94GB", None),
        ("Tesla T4", None),
        ("", None),
    ],
)
def test_cards_are_found_by_model_name(model: str, key: str | None) -> None:
    card = card_for_model(model)
    assert (card.key if card else None) == key


def test_a_need_is_a_share_and_bytes() -> None:
    with pytest.raises(ValueError, match="negative"):
        MigNeed("w", -1, 0.1)
    with pytest.raises(ValueError, match="not a share"):
        MigNeed("w", 1, float("nan"))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(CARDS.values())),
    st.integers(0, 90 * GIB),
    st.floats(0.0, 1.5, allow_nan=False),
)
def test_the_recommendation_is_the_smallest_that_fits(
    card: MigCard, memory: int, compute: float
) -> None:
    rec = recommend(need(memory, compute), card)
    fitting = [
        p
        for p in card.candidates
        if memory <= p.memory_bytes and min(compute, 1.0) <= p.compute_share + 1e-9
    ]
    assert rec.profile == (fitting[0] if fitting else None)
