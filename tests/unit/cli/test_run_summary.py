"""The demo's run summary: GPU-hours and the money they cost, per workload and in total."""

from __future__ import annotations

import pytest

from factories import sample
from fracpilot_cli.summary import RunSummary
from fracpilot_libs.pricing import GpuPrices


def test_money_saved_is_whole_minus_allocated_priced_by_model() -> None:
    prices = GpuPrices(usd_per_hour={"H100": 4.0}, default_usd_per_hour=2.0)
    summary = RunSummary(step_s=3600, prices=prices)
    summary.add_sample(sample(name="a", allocated=0.25, gpu_model="NVIDIA H100 80GB HBM3"))
    summary.add_sample(sample(name="a", allocated=0.5, minute=60, gpu_model="NVIDIA H100"))
    summary.add_sample(sample(name="b", allocated=None))  # not placed: a whole GPU, no saving
    summary.add_sample(sample(name="c", allocated=0.5))  # unknown model: the default price
    assert summary.whole_cost_usd == pytest.approx(4.0 + 4.0 + 2.0 + 2.0)
    assert summary.allocated_cost_usd == pytest.approx(1.0 + 2.0 + 2.0 + 1.0)
    assert summary.cost_saved_usd == pytest.approx(6.0)
    per_workload = {v.name: v.cost_saved_usd for v in summary.workloads.values()}
    assert per_workload == pytest.approx(
        {"inference/a": 5.0, "inference/b": 0.0, "inference/c": 1.0}
    )
    assert sum(per_workload.values()) == pytest.approx(summary.cost_saved_usd)
