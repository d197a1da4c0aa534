"""Per-workload usage and savings metrics: what one sample costs, and the capped series."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_ingest.metrics import OTHER, WorkloadUsageMetrics, sample_cost
from fracpilot_libs.pricing import GpuPrices

A100 = "NVIDIA A100-SXM4-80GB"
PRICES = GpuPrices.with_overrides({"A100 80GB": 4.0}, default=2.0)
NOW = 1_800_000_000.0


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_sample_costs_its_step_as_whole_gpus_and_its_fraction_as_allocated() -> None:
    cost = sample_cost(sample(allocated=0.25, gpu_model=A100), 900.0, PRICES)  # 15 minutes
    assert cost.whole_gpu_hours == pytest.approx(0.25)
    assert cost.allocated_gpu_hours == pytest.approx(0.0625)
    assert cost.saved_gpu_hours == pytest.approx(0.1875)
    assert cost.whole_usd == pytest.approx(1.0)
    assert cost.saved_usd == pytest.approx(0.75)


def test_an_unplaced_pod_holds_a_whole_gpu_and_saves_nothing() -> None:
    cost = sample_cost(sample(allocated=None), 3600.0, PRICES)
    assert cost.allocated_gpu_hours == cost.whole_gpu_hours == 1.0
    assert cost.saved_usd == 0.0
    assert cost.whole_usd == 2.0  # no model: the default price


def test_a_negative_step_is_refused() -> None:
    with pytest.raises(ValueError, match="step_s"):
        sample_cost(sample(), -1.0, PRICES)


@given(
    fraction=st.sampled_from([0.125, 0.25, 0.5, 0.875, 1.0]),
    step=st.floats(0.0, 86_400.0),
)
def test_savings_are_never_negative_and_add_up(fraction: float, step: float) -> None:
    cost = sample_cost(sample(allocated=fraction, gpu_model=A100), step, PRICES)
    assert cost.saved_gpu_hours >= 0
    assert cost.saved_usd >= 0
    assert cost.allocated_usd + cost.saved_usd == pytest.approx(cost.whole_usd)


def test_gauges_follow_the_latest_sample_and_counters_add_up() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=10)
    labels = {"namespace": "inference", "workload": "chat"}
    metrics.observe(sample(compute=0.3, memory_share=0.2, allocated=0.5, gpu_model=A100), 3600, NOW)
    metrics.observe(
        sample(compute=0.4, memory_share=0.25, allocated=0.25, gpu_model=A100), 3600, NOW
    )
    assert value(registry, "fracpilot_workload_allocated_ratio", **labels) == 0.25
    assert value(registry, "fracpilot_workload_compute_ratio", **labels) == 0.4
    assert value(registry, "fracpilot_workload_memory_ratio", **labels) == pytest.approx(0.25)
    assert value(registry, "fracpilot_gpu_whole_seconds_total", **labels) == 2.0 * 3600
    assert value(registry, "fracpilot_gpu_allocated_seconds_total", **labels) == 0.75 * 3600
    assert value(registry, "fracpilot_gpu_saved_seconds_total", **labels) == 1.25 * 3600
    assert value(registry, "fracpilot_cost_whole_usd_total", **labels) == 8.0
    assert value(registry, "fracpilot_cost_allocated_usd_total", **labels) == 3.0
    assert value(registry, "fracpilot_cost_saved_usd_total", **labels) == 5.0


def test_workloads_beyond_the_limit_count_as_other_and_the_total_stays_right() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=2)
    for name in ("a", "b", "c", "d", "a"):
        metrics.observe(sample(name=name, allocated=0.5, gpu_model=A100), 3600, NOW)
    tracked = {"namespace": "inference", "workload": "a"}
    other = {"namespace": OTHER, "workload": OTHER}
    assert value(registry, "fracpilot_cost_saved_usd_total", **tracked) == 4.0  # twice
    assert value(registry, "fracpilot_cost_saved_usd_total", **other) == 4.0  # c and d
    assert (
        value(registry, "fracpilot_workload_compute_ratio", workload="c", namespace="inference")
        is None
    )
    assert value(registry, "fracpilot_workload_compute_ratio", **other) is None
    assert value(registry, "fracpilot_workload_metrics_overflow_total") == 2.0
    total = sum(
        s.value
        for m in registry.collect()
        if m.name == "fracpilot_cost_saved_usd"
        for s in m.samples
        if s.name.endswith("_total")
    )
    assert total == 10.0  # five samples of 0.5 x 4 USD


def test_a_limit_of_zero_keeps_only_the_totals() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=0)
    metrics.observe(sample(allocated=0.5, gpu_model=A100), 3600, NOW)
    assert (
        value(registry, "fracpilot_gpu_saved_seconds_total", namespace=OTHER, workload=OTHER)
        == 0.5 * 3600
    )


def series_of(registry: CollectorRegistry, namespace: str, workload: str) -> set[str]:
    """Names of the samples that carry this workload's labels."""
    return {
        s.name
        for m in registry.collect()
        for s in m.samples
        if s.labels.get("namespace") == namespace and s.labels.get("workload") == workload
    }


def test_a_workload_not_seen_for_the_ttl_loses_its_series_and_others_keep_theirs() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=10, ttl_s=300.0)
    metrics.observe(sample(name="gone", allocated=0.5), 60, NOW)
    metrics.observe(sample(name="kept", allocated=0.5), 60, NOW)
    assert len({n for n in series_of(registry, "inference", "gone") if "_created" not in n}) == 9
    metrics.observe(sample(name="kept", allocated=0.5), 60, NOW + 200)
    assert metrics.expire(NOW + 299) == []  # not yet: within the TTL
    assert metrics.expire(NOW + 301) == [("inference", "gone")]
    assert series_of(registry, "inference", "gone") == set()
    assert "fracpilot_workload_allocated_ratio" in series_of(registry, "inference", "kept")
    assert value(registry, "fracpilot_workload_metrics_expired_total") == 1.0
    assert metrics.expire(NOW + 501) == [("inference", "kept")]


def test_an_expired_workload_frees_its_place_under_the_cap() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=1, ttl_s=60.0)
    metrics.observe(sample(name="a"), 60, NOW)
    metrics.observe(sample(name="b"), 60, NOW)  # beyond the cap
    assert series_of(registry, "inference", "b") == set()
    assert value(registry, "fracpilot_workload_metrics_overflow_total") == 1.0
    metrics.expire(NOW + 61)
    metrics.observe(sample(name="b"), 60, NOW + 62)
    assert "fracpilot_workload_compute_ratio" in series_of(registry, "inference", "b")
    assert value(registry, "fracpilot_workload_metrics_overflow_total") == 1.0


def test_a_deleted_workload_is_forgotten_at_once() -> None:
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=10, ttl_s=600.0)
    metrics.observe(sample(name="a", allocated=None), 60, NOW)  # no fraction: no ratio gauge
    assert metrics.forget("inference", "a")
    assert series_of(registry, "inference", "a") == set()
    assert not metrics.forget("inference", "a")


def test_a_workload_back_after_expiry_is_exported_and_counted_from_zero() -> None:
    # Each workload's series are kept between samples: an expired one must not be reused.
    registry = CollectorRegistry()
    metrics = WorkloadUsageMetrics(registry, PRICES, limit=10, ttl_s=60.0)
    labels = {"namespace": "inference", "workload": "back"}
    metrics.observe(sample(name="back", allocated=None), 3600, NOW)
    assert value(registry, "fracpilot_workload_allocated_ratio", **labels) is None  # never set
    metrics.expire(NOW + 61)
    metrics.observe(sample(name="back", allocated=0.5), 3600, NOW + 62)
    assert value(registry, "fracpilot_gpu_whole_seconds_total", **labels) == 3600.0
    assert value(registry, "fracpilot_workload_allocated_ratio", **labels) == 0.5


def test_a_batch_counts_as_its_samples_one_by_one() -> None:
    # observe_all sums the samples beyond the cap into _other once per batch.
    batch = [
        sample(name=name, allocated=fraction, gpu_model=A100)
        for name, fraction in (("a", 0.5), ("b", None), ("c", 0.25), ("d", 0.5), ("a", 0.125))
    ]
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    single = WorkloadUsageMetrics(one_by_one, PRICES, limit=2)
    for s in batch:
        single.observe(s, 900, NOW)
    WorkloadUsageMetrics(at_once, PRICES, limit=2).observe_all(batch, 900, NOW)

    def exported(registry: CollectorRegistry) -> dict[tuple[str, tuple[object, ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect()
            for s in m.samples
            if not s.name.endswith("_created")
        }

    expected = exported(one_by_one)
    assert exported(at_once) == pytest.approx(expected)
    assert expected[("fracpilot_workload_metrics_overflow_total", ())] == 2.0
    other = (("namespace", OTHER), ("workload", OTHER))
    assert expected[("fracpilot_cost_whole_usd_total", other)] == pytest.approx(2.0)  # 2 x 1 USD
