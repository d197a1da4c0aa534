"""The Docker Compose stack, run as local processes with exactly the compose file's environment.

No Docker engine exists here, so no image runs; instead nats-server (with the compose
``command``), Prometheus (with deploy/prometheus/prometheus.yml) and the dcgm-exporter
simulator and the three services (with their images' commands) run on loopback with each
compose service's ``environment`` as it is, only the compose services' addresses and listening
ports moved to loopback ports (tests/support/compose_stack.py). So the compose file and the
services cannot drift apart: a setting the services do not understand, a wrong address or a
loop that does not close fails here.

The pipeline must close the loop: the simulator's dcgm series reach ingest through Prometheus,
decisions are made, the simulated cluster applies them, and later samples carry the new
fraction, because the simulator serves the pod where the actuator put it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fracpilot_libs.contracts import (
    ActuationResult,
    FractionDecision,
    Outcome,
    PlanKind,
    UsageSample,
)
from fracpilot_libs.nats import subjects
from helpers import read_stream, read_usage
from support.compose_stack import OUR_SERVICES, ComposeStack, scrape

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[ComposeStack]:
    stack = ComposeStack(tmp_path)
    try:
        yield stack
    finally:
        stack.stop()


def test_the_local_environment_is_the_compose_files_but_for_addresses(tmp_path: Path) -> None:
    stack = ComposeStack(tmp_path)
    for service in OUR_SERVICES:
        compose_env = stack.compose_env(service)
        local = stack.local_env(service)
        assert set(local) == set(compose_env), service
        assert stack.restore(service, local) == compose_env, service
        changed = {k for k in local if local[k] != compose_env[k]}
        assert changed <= {
            "FRACPILOT_NATS_URL",
            "FRACPILOT_PROMETHEUS_URL",
            "FRACPILOT_METRICS_PORT",
            "FRACPILOT_EXPORTER_PORT",
        }, (service, changed)
    assert stack.local_env("ingest")["FRACPILOT_PROMETHEUS_URL"] == stack.url("prometheus", 9090)
    assert stack.local_env("decision")["FRACPILOT_NATS_URL"] == stack.nats_url


async def samples_decisions_results(
    url: str,
) -> tuple[list[UsageSample], list[FractionDecision], list[ActuationResult]]:
    samples = [UsageSample.model_validate_json(d) for _, d in await read_usage(url)]
    decisions = [
        FractionDecision.model_validate_json(d)
        for _, d in await read_stream(url, subjects.DECISION_STREAM)
    ]
    results = [
        ActuationResult.model_validate_json(d)
        for _, d in await read_stream(url, subjects.ACTUATION_STREAM)
    ]
    return samples, decisions, results


def loop_closed(samples: list[UsageSample], results: list[ActuationResult]) -> bool:
    """A sample newer than an applied change carries the fraction that change set."""
    for r in results:
        if r.outcome is not Outcome.APPLIED or r.plan is PlanKind.NONE:
            continue
        later = [s for s in samples if s.workload == r.workload and s.timestamp > r.finished_at]
        if any(s.allocated_fraction == r.fraction_after for s in later):
            return True
    return False


async def test_the_compose_pipeline_decides_and_acts_with_the_compose_environment(
    stack: ComposeStack,
) -> None:
    started = time.monotonic()
    stack.start()
    ready_s = time.monotonic() - started

    deadline = time.monotonic() + 120
    while True:
        samples, decisions, results = await samples_decisions_results(stack.nats_url)
        if loop_closed(samples, results):
            break
        for name, process in stack.processes.items():
            assert process.running, f"{name} stopped:\n{process.log()[-3000:]}"
        if time.monotonic() > deadline:
            logs = {n: p.log()[-1500:] for n, p in stack.processes.items()}
            raise AssertionError(
                f"no closed loop: {len(samples)} samples, {len(decisions)} decisions, "
                f"{len(results)} results\n{logs}"
            )
        await asyncio.sleep(1.0)
    closed_s = time.monotonic() - started

    # Samples came from Prometheus (the simulator's dcgm series), as the actuator knows them.
    assert samples
    assert {s.source for s in samples} == {"prometheus"}
    assert {s.workload.cluster for s in samples} == {"demo"}
    assert {s.workload.owner_kind for s in samples} == {"Deployment"}
    assert {s.gpu_model for s in samples} == {"NVIDIA A100-SXM4-80GB"}
    assert all(s.attribution.value == "exact" for s in samples)  # per-process dcgm series
    assert all(s.allocated_fraction is not None for s in samples)
    # Load became decisions, and decisions became applied changes of the simulated cluster.
    assert decisions
    assert any(r.outcome is Outcome.APPLIED for r in results)
    assert {r.decision_id for r in results} <= {d.decision_id for d in decisions}

    # Prometheus scrapes every target of deploy/prometheus/prometheus.yml.
    prometheus = stack.prometheus
    assert prometheus is not None
    up = prometheus.wait_for_series(
        "up == 1", timeout=30, predicate=lambda result: len(result) >= 5
    )
    assert {s["metric"]["job"] for s in up} == {"dcgm-exporter", "fracpilot"}
    # Ingest counts what the fractions saved, priced by the GPU model.
    metrics = scrape(stack.url("ingest", 9090, "/metrics"))
    saved = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("fracpilot_cost_saved_usd_total{")
    ]
    assert saved
    assert sum(saved) > 0

    codes = stack.stop()
    assert codes == dict.fromkeys(reversed(OUR_SERVICES), 0), codes
    print(f"compose stack: ready in {ready_s:.1f} s, loop closed after {closed_s:.1f} s")
