"""Ingest's sample loop (``IngestService.samples_of``) marks an observation with its pod's
events only when the signal tracker could say any (an OOM kill pending, or a preemption
counter on it): the samples must be those of marking every observation, as the loop did."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.usage.attribution import GpuInventory, Observation, PodKey, Rejection
from fracpilot_libs.usage.samples import to_sample
from fracpilot_libs.usage.signals import OomKill

GIB = 1024**3
PODS = tuple(f"chat-7c9d5f8b6d-{i:05d}" for i in range(4))


def service() -> IngestService:
    settings = IngestSettings(
        nats={"url": "nats://127.0.0.1:4222"}, sources="prometheus", cluster="t", usage_view=False
    )  # fmt: skip
    return IngestService(settings)


def observation(i: int, pod: str, at: float, preemptions: float | None) -> Observation:
    return Observation(
        PodKey("inference", pod, "vllm"),
        f"GPU-{i}",
        "node-a",
        at,
        0.4,
        10 * GIB,
        80 * GIB,
        True,
        gpu_model="NVIDIA H100 80GB HBM3",
        preemptions_total=preemptions,
    )


@settings(max_examples=60, deadline=None)
@given(
    instants=st.lists(
        st.lists(st.tuples(st.sampled_from(PODS), st.none() | st.sampled_from([0.0, 2.0, 5.0]))),
        min_size=1,
        max_size=3,
    ),
    killed=st.sets(st.sampled_from(PODS), max_size=2),
)
def test_the_samples_are_those_of_marking_every_observation(
    instants: list[list[tuple[str, float | None]]], killed: set[str]
) -> None:
    now = float(int(time.time()))
    finished = datetime.fromtimestamp(now - 5, UTC).isoformat()
    kills = [OomKill("inference", pod, "vllm", finished) for pod in killed]
    ours, reference = service(), service()
    for svc in (ours, reference):
        svc.signals.note_kills(kills, now)
    inventory = GpuInventory()
    for n, rows in enumerate(instants):
        at = now - 60 + 15 * n
        observations = [observation(i, pod, at, p) for i, (pod, p) in enumerate(rows)]
        ready = asyncio.run(ours.samples_of("prometheus", observations, inventory, now, []))
        # The loop before: every observation through mark, then to_sample.
        expected: list[tuple[UsageSample, Observation]] = []
        for obs in observations:
            marked = reference.signals.mark(obs)
            workload = reference.owners.owner_of("inference", marked.pod.pod)  # type: ignore[attr-defined]
            made = to_sample(
                marked, workload, "prometheus", now, 3600.0, reference.published_series
            )
            if not isinstance(made, Rejection):
                expected.append((made, marked))
        assert ready == expected
        # Published: the events are spent in both, as the service does once acknowledged.
        ours.signals.published_all([obs for _, obs in ready], now)
        reference.signals.published_all([obs for _, obs in expected], now)
        assert ours.signals == reference.signals
