"""The one account of replay, report and the demo summary: GPU-hours held against whole GPUs,
their cost, and overruns (usage above the fraction held)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.analysis.accounting import Metrics, overruns, sample_intervals

shares = st.floats(0.0, 1.0)
fractions = st.sampled_from([0.125, 0.25, 0.375, 0.5, 0.75, 1.0])


def test_usage_exactly_at_the_fraction_is_not_an_overrun() -> None:
    assert not overruns(0.25, 0.25)
    assert not overruns(0.25 + 1e-12, 0.25)  # float noise
    assert overruns(0.2501, 0.25)


def test_a_sample_adds_its_gpu_hours_and_its_overruns() -> None:
    m = Metrics()
    assert m.record(0.5, compute=0.6, memory_share=0.2, seconds=1800) == (True, False)
    assert m.record(0.5, compute=0.1, memory_share=0.7, seconds=1800) == (False, True)
    assert m.record(0.5, compute=0.1, memory_share=0.2, seconds=3600) == (False, False)
    assert m.samples == 3
    assert m.fraction_hours == pytest.approx(1.0)
    assert m.whole_gpu_hours == pytest.approx(2.0)
    assert m.saved_gpu_hours == pytest.approx(1.0)
    assert (m.compute_overrun_samples, m.memory_overrun_samples) == (1, 1)
    assert m.longest_overrun_s == 3600  # two overrunning samples in a row
    assert m.savings_pct == pytest.approx(50.0)


def test_an_overrun_run_ends_at_the_first_sample_within_the_fraction() -> None:
    m = Metrics()
    for compute in (0.9, 0.9, 0.1, 0.9):
        m.record(0.5, compute, 0.1, 60)
    assert m.longest_overrun_s == 120


def test_pricing_once_or_per_sample_gives_the_same_money() -> None:
    once, each = Metrics(), Metrics()
    for held in (0.25, 0.5, 1.0):
        once.record(held, 0.1, 0.1, 600)
        each.record(held, 0.1, 0.1, 600, usd_per_gpu_hour=3.4)
    once.price(3.4)
    assert once.allocated_cost_usd == pytest.approx(each.allocated_cost_usd)
    assert once.whole_cost_usd == pytest.approx(each.whole_cost_usd)
    assert once.cost_saved_usd == pytest.approx((3 * 600 / 3600 - 1.75 * 600 / 3600) * 3.4)


def test_totals_add_up_and_keep_the_longest_overrun() -> None:
    a, b, total = Metrics(workloads=1), Metrics(workloads=1), Metrics()
    a.record(0.25, 0.9, 0.1, 120)
    b.record(0.5, 0.1, 0.1, 60)
    b.resizes = 2
    total.add(a)
    total.add(b)
    assert (total.samples, total.workloads, total.resizes) == (2, 2, 2)
    assert total.longest_overrun_s == 120
    assert total.as_dict()["compute_overrun_pct"] == 50.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(fractions, shares, shares), min_size=1, max_size=40))
def test_held_never_exceeds_whole_and_overruns_are_counted_per_sample(
    rows: list[tuple[float, float, float]],
) -> None:
    m = Metrics()
    for held, compute, memory in rows:
        m.record(held, compute, memory, 60)
    assert m.fraction_hours <= m.whole_gpu_hours + 1e-9
    assert m.compute_overrun_samples == sum(overruns(c, h) for h, c, _ in rows)
    assert m.memory_overrun_samples == sum(overruns(s, h) for h, _, s in rows)
    assert 0 <= m.longest_overrun_s <= 60 * len(rows)


def test_intervals_cap_gaps_at_five_median_steps() -> None:
    assert sample_intervals([]) == []
    assert sample_intervals([10.0]) == [60.0]
    assert sample_intervals([0.0, 60.0, 120.0, 3600.0]) == [60.0, 60.0, 300.0, 60.0]
