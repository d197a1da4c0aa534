"""OOM and contention events: each reaches exactly one published sample of its pod."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from fracpilot_libs.contracts import UsageSample, WorkloadRef
from fracpilot_libs.usage.attribution import (
    GpuInventory,
    MetricPoint,
    Observation,
    PodKey,
    observe_points,
)
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from fracpilot_libs.usage.signals import OomKill, SignalTracker

NOW = 1_772_409_600.0  # 2026-03-02T00:00:00Z
POD = PodKey("team-a", "chat-0", "server")
GIB = 1024**3


def obs(preemptions: float | None = None, at: float = NOW) -> Observation:
    return Observation(POD, "GPU-a", "n", at, 0.2, GIB, 80 * GIB, True,
                       preemptions_total=preemptions)  # fmt: skip


def kill(seconds_ago: float) -> OomKill:
    finished = datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return OomKill(POD.namespace, POD.pod, "server", finished)


def test_an_oom_kill_marks_the_next_published_sample_only() -> None:
    tracker = SignalTracker(window_s=300)
    tracker.note_kills([kill(10)], NOW)
    first = tracker.mark(obs())
    assert first.oom_event
    assert tracker.mark(obs()).oom_event  # not published yet: still pending
    tracker.published(first, NOW)
    tracker.note_kills([kill(10)], NOW + 15)  # the same kill, still the last state
    assert not tracker.mark(obs()).oom_event


def test_a_kill_older_than_the_window_when_first_seen_is_history() -> None:
    tracker = SignalTracker(window_s=300)
    tracker.note_kills([kill(3_600)], NOW)
    assert not tracker.mark(obs()).oom_event


def test_preemptions_rising_is_contention_first_value_and_reset_are_not() -> None:
    tracker = SignalTracker()
    for count, expected in ((5, False), (5, False), (7, True), (2, False), (3, True)):
        marked = tracker.mark(obs(count))
        assert marked.contention_event is expected, count
        tracker.published(marked, NOW)


def test_counters_of_pods_gone_are_forgotten() -> None:
    tracker = SignalTracker(window_s=60)
    tracker.published(obs(4), NOW)
    tracker.note_kills([], NOW + 121)
    assert tracker.preemptions == {}


def test_events_reach_the_samples_signals() -> None:
    marked = replace(obs(), oom_event=True, contention_event=True)
    sample = to_sample(
        marked,
        WorkloadRef(namespace="team-a", owner_name="chat"),
        "prometheus",
        NOW,
        3600,
        PublishedSeries(),
    )
    assert isinstance(sample, UsageSample)
    assert sample.signals is not None
    assert sample.signals.oom_event
    assert sample.signals.contention_event


def test_vllm_preemption_counters_of_a_pods_engines_add_up() -> None:
    gpu = {"UUID": "GPU-a", "gpu": "0", "Hostname": "n", "modelName": "NVIDIA L4"}
    pod = {"pod": POD.pod, "namespace": POD.namespace, "container": POD.container}
    points = [
        MetricPoint("DCGM_FI_DEV_GPU_UTIL", gpu | pod, 30, NOW),
        MetricPoint("DCGM_FI_DEV_FB_USED", gpu | pod, 1000, NOW),
        MetricPoint("DCGM_FI_DEV_FB_FREE", gpu | pod, 1000, NOW),
        MetricPoint("vllm:num_preemptions_total", {"engine": "0", **pod}, 3, NOW),
        MetricPoint("vllm:num_preemptions_total", {"engine": "1", **pod}, 4, NOW),
    ]
    (observation,), rejections = observe_points(points, MappingTable.of(), GpuInventory())
    assert rejections == []
    assert observation.preemptions_total == 7
