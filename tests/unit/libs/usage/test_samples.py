"""Observations become UsageSample messages, or rejections with a reason."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import AppSignals, Attribution, UsageSample, WorkloadRef
from fracpilot_libs.usage.attribution import Observation, PodKey, Rejection
from fracpilot_libs.usage.samples import PublishedSeries, sample_id, to_sample

GIB = 1024**3
T = 1_772_409_600.0  # 2026-03-02T00:00:00Z
NOW = T + 30
MAX_AGE = 3600.0
GPU = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
WORKLOAD = WorkloadRef(cluster="prod", namespace="inference", owner_name="chat")
POD = PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")


def observation(**overrides: object) -> Observation:
    fields: dict[str, object] = {
        "pod": POD,
        "gpu_uuid": GPU,
        "node": "node-a",
        "timestamp": T,
        "compute": 0.42,
        "memory_used_bytes": 10 * GIB,
        "memory_total_bytes": 80 * GIB,
        "exact": True,
    }
    fields.update(overrides)
    return Observation(**fields)  # type: ignore[arg-type]


def convert(
    obs: Observation,
    published: PublishedSeries | None = None,
    now: float = NOW,
    fraction: float | None = 0.5,
    workload: WorkloadRef = WORKLOAD,
) -> UsageSample | Rejection:
    return to_sample(
        obs,
        workload,
        "prometheus",
        now,
        MAX_AGE,
        published if published is not None else PublishedSeries(),
        fraction,
    )


def test_valid_exact_observation_becomes_a_sample() -> None:
    published = PublishedSeries()
    sample = convert(observation(), published)
    assert isinstance(sample, UsageSample)
    assert sample.workload == WORKLOAD
    assert sample.pod == POD.pod
    assert sample.container == "vllm"
    assert sample.node == "node-a"
    assert sample.gpu_uuid == GPU
    assert sample.timestamp == datetime(2026, 3, 2, tzinfo=UTC)
    assert sample.compute == pytest.approx(0.42)
    assert sample.memory_used_bytes == 10 * GIB
    assert sample.memory_total_bytes == 80 * GIB
    assert sample.allocated_fraction == 0.5
    assert sample.source == "prometheus"
    assert sample.attribution is Attribution.EXACT
    assert sample.signals is None
    assert published.newest == {(WORKLOAD.key, POD.pod, "vllm", GPU): T}


def test_estimated_observation_is_marked_estimated() -> None:
    sample = convert(observation(exact=False))
    assert isinstance(sample, UsageSample)
    assert sample.attribution is Attribution.ESTIMATED


def test_allocated_fraction_is_passed_through_or_left_unknown() -> None:
    known = convert(observation(), fraction=0.125)
    unknown = convert(observation(), fraction=None)
    assert isinstance(known, UsageSample)
    assert known.allocated_fraction == 0.125
    assert isinstance(unknown, UsageSample)
    assert unknown.allocated_fraction is None


def test_a_missing_container_name_becomes_main() -> None:
    sample = convert(observation(pod=PodKey("inference", POD.pod)))
    assert isinstance(sample, UsageSample)
    assert sample.container == "main"


@pytest.mark.parametrize(
    ("kv", "waiting", "expected"),
    [
        (0.73, 4, AppSignals(kv_cache_usage=0.73, waiting_requests=4)),
        (0.1, None, AppSignals(kv_cache_usage=0.1)),
        (None, 0, AppSignals(waiting_requests=0)),
        (None, None, None),
    ],
)
def test_app_signals_when_present(
    kv: float | None, waiting: int | None, expected: AppSignals | None
) -> None:
    sample = convert(observation(kv_cache_usage=kv, waiting_requests=waiting))
    assert isinstance(sample, UsageSample)
    assert sample.signals == expected


def test_sample_id_is_deterministic_and_names_the_series_and_second() -> None:
    a = convert(observation(timestamp=T + 0.4))
    b = convert(observation(timestamp=T + 0.4))
    assert isinstance(a, UsageSample)
    assert isinstance(b, UsageSample)
    assert a.sample_id == b.sample_id
    assert a.sample_id == sample_id("prometheus", WORKLOAD, observation(timestamp=T))
    assert a.sample_id == (
        f"prometheus|prod/inference/Deployment/chat|{POD.pod}|vllm|{GPU}|{int(T)}"
    )


@pytest.mark.parametrize(
    "change",
    [
        {"timestamp": T + 15},
        {"gpu_uuid": "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"},
        {"pod": PodKey("inference", "chat-7c9d5f8b6d-m8n2b", "vllm")},
        {"pod": PodKey("inference", POD.pod, "sidecar")},
    ],
)
def test_sample_id_differs_per_series_and_instant(change: dict[str, object]) -> None:
    base = sample_id("prometheus", WORKLOAD, observation())
    assert sample_id("prometheus", WORKLOAD, observation(**change)) != base
    assert sample_id("scrape", WORKLOAD, observation()) != base


def test_stale_observation_is_rejected_and_not_recorded() -> None:
    published = PublishedSeries()
    result = convert(observation(timestamp=NOW - MAX_AGE - 1), published)
    assert isinstance(result, Rejection)
    assert result.reason == "stale"
    assert POD.pod in result.detail
    assert GPU in result.detail
    assert published.newest == {}


def test_exactly_max_age_is_not_stale() -> None:
    assert isinstance(convert(observation(timestamp=NOW - MAX_AGE)), UsageSample)


def test_future_observation_is_rejected_beyond_a_minute_of_clock_skew() -> None:
    assert isinstance(convert(observation(timestamp=NOW + 60)), UsageSample)
    result = convert(observation(timestamp=NOW + 61))
    assert isinstance(result, Rejection)
    assert result.reason == "future"


def test_the_same_series_and_instant_again_is_a_duplicate() -> None:
    published = PublishedSeries()
    assert isinstance(convert(observation(), published), UsageSample)
    again = convert(observation(compute=0.9), published)
    assert isinstance(again, Rejection)
    assert again.reason == "duplicate"
    older = convert(observation(timestamp=T - 15), published)
    assert isinstance(older, Rejection)
    assert older.reason == "duplicate"
    newer = convert(observation(timestamp=T + 15), published)
    assert isinstance(newer, UsageSample)
    assert published.newest[(WORKLOAD.key, POD.pod, "vllm", GPU)] == T + 15


def test_other_series_at_the_same_instant_are_not_duplicates() -> None:
    published = PublishedSeries()
    assert isinstance(convert(observation(), published), UsageSample)
    other_gpu = observation(gpu_uuid="GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448")
    other_pod = observation(pod=PodKey("inference", "chat-7c9d5f8b6d-m8n2b", "vllm"))
    other_workload = WorkloadRef(cluster="prod", namespace="inference", owner_name="code")
    assert isinstance(convert(other_gpu, published), UsageSample)
    assert isinstance(convert(other_pod, published), UsageSample)
    assert isinstance(convert(observation(), published, workload=other_workload), UsageSample)
    assert len(published.newest) == 4


def test_memory_above_the_device_is_rejected() -> None:
    published = PublishedSeries()
    result = convert(observation(memory_used_bytes=80 * GIB + 1), published)
    assert isinstance(result, Rejection)
    assert result.reason == "memory_above_device"
    assert str(80 * GIB + 1) in result.detail
    assert published.newest == {}
    assert isinstance(convert(observation(memory_used_bytes=80 * GIB), published), UsageSample)


def test_a_rejected_instant_does_not_block_the_next_valid_one() -> None:
    published = PublishedSeries()
    bad = convert(observation(memory_used_bytes=81 * GIB), published)
    assert isinstance(bad, Rejection)
    assert isinstance(convert(observation(), published), UsageSample)


def test_values_the_contract_refuses_become_an_invalid_rejection() -> None:
    published = PublishedSeries()
    result = convert(observation(), published, fraction=1.5)
    assert isinstance(result, Rejection)
    assert result.reason == "invalid"
    assert "allocated_fraction" in result.detail
    assert published.newest == {}
    zero = convert(observation(memory_total_bytes=0, memory_used_bytes=0))
    assert isinstance(zero, Rejection)
    assert zero.reason == "invalid"
    assert "memory_total_bytes" in zero.detail


def test_long_but_valid_kubernetes_names_still_make_samples() -> None:
    name = "llama-3-1-70b-instruct-awq-int4-marlin-tp2-v2"  # 45 characters
    assert len(name) == 45
    workload = WorkloadRef(cluster="prod", namespace="inference", owner_name=name)
    pod = PodKey("inference", f"{name}-7c9d5f8b6d-x2k4p", "vllm")  # 62 <= 63 characters
    result = convert(observation(pod=pod), workload=workload)
    assert isinstance(result, UsageSample), result


def test_forget_before_drops_only_older_series() -> None:
    published = PublishedSeries()
    for i in range(5):
        obs = observation(pod=PodKey("inference", f"chat-{i}", "vllm"), timestamp=T + i * 60)
        assert isinstance(convert(obs, published, now=T + 300), UsageSample)
    published.forget_before(T + 120)
    assert sorted(published.newest.values()) == [T + 120, T + 180, T + 240]
    published.forget_before(T + 10_000)
    assert published.newest == {}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=200))
def test_forgetting_bounds_the_record_to_the_recent_series(pods: list[int]) -> None:
    """One series per pod, each seen at its own time; forgetting what is older than a window
    keeps at most the series seen within the window."""
    published = PublishedSeries()
    now = T
    window = 300.0
    for pod in pods:
        now += 15
        obs = observation(pod=PodKey("inference", f"p-{pod}", "c"), timestamp=now)
        assert isinstance(convert(obs, published, now=now), UsageSample)
        published.forget_before(now - window)
        assert len(published.newest) <= window / 15 + 1
        assert all(ts >= now - window for ts in published.newest.values())


def test_observation_is_not_changed_by_conversion() -> None:
    obs = observation(kv_cache_usage=0.5)
    before = replace(obs)
    convert(obs)
    assert obs == before
