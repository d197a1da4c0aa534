"""The per-workload recommendation series: set, capped, and removed when stale."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_decision.metrics import RecommendationMetrics


def value(registry: CollectorRegistry, name: str, namespace: str, workload: str) -> float | None:
    return registry.get_sample_value(name, {"namespace": namespace, "workload": workload})


def test_the_recommendation_and_its_saving_are_set_per_workload() -> None:
    registry = CollectorRegistry()
    metrics = RecommendationMetrics(registry, limit=10, ttl_s=60)
    metrics.set("ml", "llm", held=1.0, recommended=0.25, now=0)
    metrics.set("ml", "embed", held=0.25, recommended=0.5, now=0)
    assert value(registry, "fracpilot_workload_recommended_ratio", "ml", "llm") == 0.25
    assert value(registry, "fracpilot_workload_recommended_saving_ratio", "ml", "llm") == 0.75
    assert value(registry, "fracpilot_workload_recommended_saving_ratio", "ml", "embed") == -0.25


def test_workloads_beyond_the_limit_have_no_series_and_are_counted() -> None:
    registry = CollectorRegistry()
    metrics = RecommendationMetrics(registry, limit=1, ttl_s=60)
    metrics.set("ml", "a", 1.0, 0.5, now=0)
    metrics.set("ml", "b", 1.0, 0.5, now=0)
    metrics.set("ml", "a", 1.0, 0.4, now=1)  # one already shown stays shown
    assert value(registry, "fracpilot_workload_recommended_ratio", "ml", "a") == 0.4
    assert value(registry, "fracpilot_workload_recommended_ratio", "ml", "b") is None
    assert registry.get_sample_value("fracpilot_workload_recommendations_left_out_total") == 1


def test_a_workload_not_decided_for_the_ttl_loses_its_series() -> None:
    registry = CollectorRegistry()
    metrics = RecommendationMetrics(registry, limit=1, ttl_s=60)
    metrics.set("ml", "a", 1.0, 0.5, now=0)
    assert metrics.expire(now=30) == []
    assert metrics.expire(now=61) == [("ml", "a")]
    for name in (
        "fracpilot_workload_recommended_ratio",
        "fracpilot_workload_recommended_saving_ratio",
    ):
        assert value(registry, name, "ml", "a") is None
    metrics.set("ml", "b", 1.0, 0.5, now=62)  # its place under the limit is free again
    assert value(registry, "fracpilot_workload_recommended_ratio", "ml", "b") == 0.5


@pytest.mark.parametrize("ttl_s", [0, -1])
def test_the_ttl_must_be_positive(ttl_s: float) -> None:
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        RecommendationMetrics(CollectorRegistry(), limit=1, ttl_s=ttl_s)
