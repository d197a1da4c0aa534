"""One trace id spans ingest, decision and actuator for a sample that caused an action.

The three services run in this process (each with its own tracer provider, as in separate
processes) against a real nats-server; the trace context travels only in NATS headers.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import ActuationResult, Outcome
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running, wait_for

pytestmark = pytest.mark.integration


async def test_one_trace_spans_the_three_services(nats_url: str) -> None:
    await reset_nats(nats_url)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    # One small workload seeded far too small, so its first samples cause an upsize.
    actuator = ActuatorService(
        ActuatorSettings(
            nats={"url": nats_url},
            sim={
                "cluster": "demo",
                "pods": "inference/chat-llama-8b=0.125",
                # opted in, so that the decision is applied and the trace reaches the actuator
                "namespace_labels": {"inference": {"fracpilot.io/mode": "auto"}},
            },
        ),
        processor,
    )
    decision = DecisionService(DecisionSettings(nats={"url": nats_url}), processor)
    ingest = IngestService(
        IngestSettings(
            nats={"url": nats_url}, sim={"workloads": 1, "speed": 3600, "duration_s": 1800}
        ),
        processor,
    )
    async with running(actuator), running(decision), running(ingest):
        await wait_for(ingest.finished.is_set, timeout=30)
        await wait_for(
            lambda: any(
                s.name.startswith("process fracpilot.decision")
                for s in exporter.get_finished_spans()
            ),
            timeout=30,
        )
    results = [
        ActuationResult.model_validate_json(d)
        for _, d in await read_stream(nats_url, subjects.ACTUATION_STREAM)
    ]
    assert any(r.outcome is Outcome.APPLIED for r in results)

    services_by_trace: dict[int, set[str]] = defaultdict(set)
    for span in exporter.get_finished_spans():
        assert span.context is not None
        services_by_trace[span.context.trace_id].add(str(span.resource.attributes["service.name"]))
    full = [
        t
        for t, services in services_by_trace.items()
        if services == {"ingest", "decision", "actuator"}
    ]
    assert full, f"no trace crosses all three services: {dict(services_by_trace)}"
    # Samples that caused no action stay in two-service traces (ingest -> decision).
    assert len(full) < len(services_by_trace)
