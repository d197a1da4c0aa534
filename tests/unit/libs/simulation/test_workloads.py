"""The demo's usage simulator: a pure function of the workload and the simulated time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import workload
from fracpilot_libs.simulation.workloads import (
    GIB,
    SimulatedWorkload,
    demo_workloads,
    traffic,
    usage_at,
)

DAY = datetime(2026, 3, 2, tzinfo=UTC)


def sim(**overrides: object) -> SimulatedWorkload:
    fields: dict[str, object] = {
        "workload": workload("chat"),
        "peak_compute": 0.5,
        "night_compute": 0.05,
        "weights_share": 0.2,
        "kv_cache_share": 0.15,
    }
    fields.update(overrides)
    return SimulatedWorkload(**fields)  # type: ignore[arg-type]


def mean_compute(w: SimulatedWorkload, start: datetime, minutes: int) -> float:
    return sum(usage_at(w, start + timedelta(minutes=m))[0] for m in range(minutes)) / minutes


def test_usage_is_deterministic() -> None:
    w = sim()
    times = [DAY + timedelta(minutes=7 * i) for i in range(200)]
    first = [usage_at(w, t) for t in times]
    again = [usage_at(sim(), t) for t in times]
    assert first == again
    assert len(set(first)) > 100  # and not constant: noise and the daily curve vary it


def test_noise_depends_on_the_workload() -> None:
    a, b = sim(), sim(workload=workload("other"))
    times = [DAY + timedelta(hours=15, minutes=m) for m in range(30)]
    assert [usage_at(a, t) for t in times] != [usage_at(b, t) for t in times]


@settings(max_examples=60, deadline=None)
@given(
    peak=st.floats(0.0, 1.0),
    night=st.floats(0.0, 1.0),
    weights=st.floats(0.0, 1.0),
    kv=st.floats(0.0, 1.0),
    peak_hour=st.floats(0.0, 24.0),
    memory_gib=st.integers(1, 192),
    at=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
)
def test_usage_stays_within_bounds(
    peak: float,
    night: float,
    weights: float,
    kv: float,
    peak_hour: float,
    memory_gib: int,
    at: datetime,
) -> None:
    w = sim(
        peak_compute=peak,
        night_compute=night,
        weights_share=weights,
        kv_cache_share=kv,
        peak_hour=peak_hour,
        device_memory_bytes=memory_gib * GIB,
    )
    level = traffic(w, at)
    compute, memory = usage_at(w, at)
    assert 0.0 <= level <= 1.0
    assert 0.0 <= compute <= 1.0
    assert min(night, peak) - 1e-12 <= compute <= max(night, peak) + 1e-12
    assert isinstance(memory, int)
    assert 0 <= memory <= w.device_memory_bytes
    assert memory >= int(min(1.0, weights) * w.device_memory_bytes) - 1  # weights stay loaded


def test_daily_peak_near_peak_hour_is_higher_than_at_night() -> None:
    for w in demo_workloads():
        start = DAY.replace(hour=int(w.peak_hour))
        peak = mean_compute(w, start - timedelta(minutes=30), 60)
        night = mean_compute(w, start + timedelta(hours=12) - timedelta(minutes=30), 60)
        assert peak > night + 0.5 * (w.peak_compute - w.night_compute), w.workload.owner_name
        assert peak == pytest.approx(w.peak_compute, abs=0.2 * w.peak_compute + 0.02)


def test_peak_follows_peak_hour() -> None:
    morning, evening = sim(peak_hour=9.0), sim(peak_hour=21.0)
    at_nine = DAY.replace(hour=8, minute=30)
    at_nine_pm = DAY.replace(hour=20, minute=30)
    assert mean_compute(morning, at_nine, 60) > mean_compute(evening, at_nine, 60)
    assert mean_compute(evening, at_nine_pm, 60) > mean_compute(morning, at_nine_pm, 60)


def test_memory_grows_with_traffic() -> None:
    w = sim()
    hours = [DAY + timedelta(hours=h) for h in range(24)]
    by_traffic = sorted(hours, key=lambda t: traffic(w, t))
    quiet, busy = by_traffic[0], by_traffic[-1]
    assert usage_at(w, busy)[1] > usage_at(w, quiet)[1]
    assert usage_at(w, busy)[0] > usage_at(w, quiet)[0]


def test_demo_workloads_are_distinct_and_sane() -> None:
    workloads = demo_workloads(namespace="ns", cluster="c")
    assert len(workloads) == 8
    assert len({w.workload.key for w in workloads}) == 8
    for w in workloads:
        assert w.workload.namespace == "ns"
        assert w.workload.cluster == "c"
        assert 0 < w.night_compute < w.peak_compute <= 1
        assert w.pod == f"{w.workload.owner_name}-0"
