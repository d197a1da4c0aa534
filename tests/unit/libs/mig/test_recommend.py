"""MIG profile tables and recommendations: the smallest profile that holds a workload's memory
(hard) and compute (slices of the card's), checked at every boundary of every card's table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.mig.profiles import (
    A30_24GB,
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

_ALL = (0, 1, 2, 3, 4, 5, 6)


def seven_by_eight(g1: str, g2: str, g4: str, g8: str) -> dict[str, tuple[object, ...]]:
    """The 7 x 8 cards' table, named by their sizes."""
    return {
        f"1g.{g1}": (1, 1, 7, _ALL),
        f"1g.{g1}+me": (1, 1, 1, _ALL),
        f"1g.{g2}": (1, 2, 4, (0, 2, 4, 6)),
        f"2g.{g2}": (2, 2, 3, (0, 2, 4)),
        f"3g.{g4}": (3, 4, 2, (0, 4)),
        f"4g.{g4}": (4, 4, 1, (0,)),
        f"7g.{g8}": (7, 8, 1, (0,)),
    }


# name: (compute slices, memory slices, max instances, valid starts), as the MIG User Guide's
# tables, the GPU Operator's mig-parted config and `nvidia-smi mig -lgip(p)` give them (see
# fracpilot_libs.mig.profiles)
EXPECTED = {
    "a100-80gb": seven_by_eight("10gb", "20gb", "40gb", "80gb"),
    "h100-80gb": seven_by_eight("10gb", "20gb", "40gb", "80gb"),
    "a100-40gb": seven_by_eight("5gb", "10gb", "20gb", "40gb"),
    "h100-94gb": seven_by_eight("12gb", "24gb", "47gb", "94gb"),
    "h200-141gb": seven_by_eight("18gb", "35gb", "71gb", "141gb"),
    "h200-nvl": {
        k: v for k, v in seven_by_eight("18gb", "35gb", "71gb", "141gb").items() if k != "1g.35gb"
    },
    "b200-180gb": seven_by_eight("23gb", "45gb", "90gb", "180gb"),
    "h100-96gb": seven_by_eight("12gb", "24gb", "48gb", "96gb"),
    "gh200-144gb": seven_by_eight("18gb", "36gb", "72gb", "144gb"),
    "gb200-186gb": seven_by_eight("23gb", "47gb", "93gb", "186gb"),
    "b300-288gb": seven_by_eight("34gb", "67gb", "135gb", "269gb"),
    "gb300-288gb": seven_by_eight("35gb", "70gb", "139gb", "278gb"),
    # mig-parted builder_test.go "RTX-PRO-6000": quarters, 4 instances at most
    "rtx-pro-6000-96gb": {
        "1g.24gb": (1, 1, 4, (0, 1, 2, 3)),
        "1g.24gb+me": (1, 1, 1, (0, 1, 2, 3)),
        "2g.48gb": (2, 2, 2, (0, 2)),
        "4g.96gb": (4, 4, 1, (0,)),
    },
    "a30-24gb": {
        "1g.6gb": (1, 1, 4, (0, 1, 2, 3)),
        "1g.6gb+me": (1, 1, 1, (0, 1, 2, 3)),
        "2g.12gb": (2, 2, 2, (0, 2)),
        "2g.12gb+me": (2, 2, 1, (0, 2)),
        "4g.24gb": (4, 4, 1, (0,)),
    },
}
SLICES = {
    key: (4, 4, 4) if key in ("a30-24gb", "rtx-pro-6000-96gb") else (7, 8, 7) for key in EXPECTED
}


def need(memory_bytes: int, compute: float) -> MigNeed:
    return MigNeed("ns/w", memory_bytes, compute)


def test_every_card_has_its_expected_table() -> None:
    assert set(CARDS) == set(EXPECTED)


@cards
def test_the_tables_hold_the_upstream_slices_counts_and_starts(card: MigCard) -> None:
    got = {
        p.name: (p.compute_slices, p.memory_slices, p.max_instances, p.starts)
        for p in card.profiles
    }
    assert got == EXPECTED[card.key]
    assert (card.compute_slices, card.memory_slices, card.max_instances) == SLICES[card.key]
    assert card.largest.memory_slices == card.memory_slices
    assert card.largest.compute_slices == card.compute_slices
    assert all(p.compute_share == p.compute_slices / card.compute_slices for p in card.profiles)


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
@pytest.mark.parametrize("index", range(6))
def test_memory_boundaries(card: MigCard, index: int) -> None:
    """A need of exactly a profile's memory fits it; one byte more goes to the next one."""
    if index >= len(card.candidates):
        return  # a card with fewer candidates (A30, H200 NVL): its last one is covered
    p = card.candidates[index]
    at = recommend(need(p.memory_bytes, 0.0), card)
    # the smallest profile holding this much memory: 1g.20gb, not 2g.20gb, for 20 GB
    first_with_this_memory = next(c for c in card.candidates if c.memory_mib == p.memory_mib)
    assert at.profile == first_with_this_memory
    above = recommend(need(p.memory_bytes + 1, 0.0), card)
    bigger = [c for c in card.candidates if c.memory_mib > p.memory_mib]
    assert above.profile == (bigger[0] if bigger else None)


@cards
def test_compute_boundaries(card: MigCard) -> None:
    """A compute need of exactly k/n (n the card's slices) fits a profile with k slices; a bit
    more needs more."""
    n = card.compute_slices
    for slices in range(1, n + 1):
        smallest = next(c for c in card.candidates if c.compute_slices >= slices)
        assert recommend(need(0, slices / n), card).profile == smallest
        assert recommend(need(0, slices / n + 1e-12), card).profile == smallest  # float noise
        if slices < n:
            more = next(c for c in card.candidates if c.compute_slices > slices)
            assert recommend(need(0, slices / n + 1e-6), card).profile == more


@pytest.mark.parametrize("card", [A100_80GB, H100_80GB], ids=lambda c: c.key)
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


def test_an_a30_is_sized_in_quarters() -> None:
    card = A30_24GB
    rec = recommend(need(int(5 * GIB), 0.25), card)
    assert rec.profile == card.profile("1g.6gb")
    assert "1/4 = 0.250 >= 0.250 compute" in rec.reason
    assert recommend(need(int(5 * GIB), 0.26), card).profile == card.profile("2g.12gb")
    assert recommend(need(int(12 * GIB), 0.0), card).profile == card.profile("4g.24gb")
    assert recommend(need(int(23 * GIB), 0.0), card).profile is None  # 23344 MiB < 23 GiB


def test_an_rtx_pro_6000_is_sized_in_quarters() -> None:
    card = CARDS["rtx-pro-6000-96gb"]
    assert recommend(need(int(20 * GIB), 0.25), card).profile == card.profile("1g.24gb")
    assert recommend(need(int(20 * GIB), 0.26), card).profile == card.profile("2g.48gb")
    assert recommend(need(int(24 * GIB), 0.1), card).profile == card.profile("2g.48gb")
    rec = recommend(need(int(10 * GIB), 0.6), card)
    assert (rec.profile, rec.driver) == (card.profile("4g.96gb"), "compute")


def test_h200_and_b200_needs_take_their_profiles() -> None:
    h200, b200 = CARDS["h200-141gb"], CARDS["b200-180gb"]
    assert recommend(need(int(16 * GIB), 0.1), h200).profile == h200.profile("1g.35gb")
    assert recommend(need(int(30 * GIB), 0.2), h200).profile == h200.profile("2g.35gb")
    assert recommend(need(int(20 * GIB), 0.1), b200).profile == b200.profile("1g.23gb")
    rec = recommend(need(int(50 * GIB), 0.5), b200)
    assert (rec.profile, rec.driver) == (b200.profile("4g.90gb"), "compute")
    nvl = CARDS["h200-nvl"]  # no 1g.35gb on the NVL: a 2g.35gb holds the 16+ GiB
    assert recommend(need(int(16 * GIB), 0.1), nvl).profile == nvl.profile("2g.35gb")


@cards
def test_memory_past_the_largest_profile_fits_none_and_compute_is_capped(card: MigCard) -> None:
    largest = card.largest
    rec = recommend(need(largest.memory_bytes + 1, 0.1), card)
    assert rec.profile is None
    assert not rec.fits
    assert rec.driver == "memory"
    assert "without MIG" in rec.reason
    assert recommend(need(0, 1.18), card).profile == largest  # p95 / 0.85 may pass 1


def test_instance_memory_errs_low_against_the_names() -> None:
    for card in CARDS.values():
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
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
        ("NVIDIA A30", "a30-24gb"),
        ("NVIDIA A30-PCIE-24GB", "a30-24gb"),
        ("NVIDIA H100 NVL", "h100-94gb"),
        ("NVIDIA H100 NVL 94GB", "h100-94gb"),
        ("NVIDIA H200", "h200-141gb"),
        ("NVIDIA H200 MIG 3g.71gb", "h200-141gb"),
        ("NVIDIA-H200-MIG-1g.18gb", "h200-141gb"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA B200", "b200-180gb"),
        ("b200-180gb", "b200-180gb"),
        # the driver's names (NVIDIA/open-gpu-kernel-modules README.md, df1c9a3): "GH200" and
        # "GB200" are one word, so \bH200 / \bB200 do not take them
        ("NVIDIA GH200 480GB", "h100-96gb"),
        ("NVIDIA GH200 120GB", "h100-96gb"),
        ("NVIDIA H20", "h100-96gb"),
        ("NVIDIA H20-3e", None),  # device 232C, not in the operator's H20 group
        ("NVIDIA H20 NVL16", None),
        ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
        ("NVIDIA GB200", "gb200-186gb"),
        ("NVIDIA GB200 MIG 1g.23gb", "gb200-186gb"),
        ("NVIDIA B300 SXM6 AC", "b300-288gb"),
        ("NVIDIA GB300", "gb300-288gb"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-96gb"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-96gb"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000-96gb"),
        ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb", "rtx-pro-6000-96gb"),
        ("NVIDIA A800-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A800 80GB PCIe", "a100-80gb"),
        ("NVIDIA A800-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A800 40GB Active", "a100-40gb"),
        ("NVIDIA H800", "h100-80gb"),
        ("NVIDIA H800 PCIe", "h100-80gb"),
        ("NVIDIA H800 NVL", "h100-94gb"),
        ("NVIDIA RTX PRO 5000 Blackwell", None),  # MIG-capable, no table here
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
    st.integers(0, 200 * GIB),
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
