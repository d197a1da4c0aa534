"""The three services as separate processes against a real nats-server.

Simulated load becomes decisions, decisions reach the actuator, and the simulated cluster's
allocation changes. Killing the decision process mid-run and starting it again loses no
sample (every usage partition's consumer acknowledges every sample) and no decision
is applied twice (by decision id), even when a decision is delivered again.

The bus is secured as the chart's default is (issue 29): nats-server runs deploy/nats/'s
configuration, the source of the chart's permissions (tests/support/nats_auth.py), with TLS
from a test CA; each service connects with its own identity and the CA, the test reads with
the read-only operator identity and redelivers a decision as the decision identity. No
identity may lack a permission on the way (the server logs each violation).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from fracpilot_cli.demo import DemoConfig
from fracpilot_cli.processes import ServiceProcess
from fracpilot_libs.contracts import ActuationResult, Allocation, FractionDecision, Outcome
from fracpilot_libs.nats import subjects
from helpers import connect, read_stream, read_usage
from support.nats_auth import SecuredNats, chart_tls_files
from support.pipeline_idle import wait_pipeline_idle

pytestmark = pytest.mark.e2e


async def test_load_becomes_actions_and_a_decision_restart_loses_nothing(tmp_path: Path) -> None:
    bus = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls")).start()
    nats_url = bus.settings("operator")  # the test reads as the operator
    config = DemoConfig(workloads=8, sim_hours=6, speed=2400, log_dir=tmp_path)
    envs = config.service_env(bus.url)
    procs = {
        name: ServiceProcess(name, envs[name] | bus.env(name), tmp_path)
        for name in ("actuator", "decision", "ingest")
    }
    try:
        for p in procs.values():
            p.start().wait_for_log("service ready", timeout_s=60)
        # Let samples and decisions flow, then kill the decision service without warning.
        await asyncio.sleep(2.0)
        procs["decision"].kill()
        killed_at_samples = len(await read_usage(nats_url))
        await asyncio.sleep(2.0)  # ingest keeps publishing while decision is down
        procs["decision"].start().wait_for_log("service ready", timeout_s=60)
        procs["ingest"].wait_for_log("simulation finished", timeout_s=120)
        await wait_pipeline_idle(nats_url, within_s=120)

        samples = await read_usage(nats_url)
        decisions = [
            FractionDecision.model_validate_json(d)
            for _, d in await read_stream(nats_url, subjects.DECISION_STREAM)
        ]
        results = [
            ActuationResult.model_validate_json(d)
            for _, d in await read_stream(nats_url, subjects.ACTUATION_STREAM)
        ]

        # Deliver an already-applied decision again, as a republish after a crash would.
        applied = next(r for r in results if r.outcome is Outcome.APPLIED)
        again = next(d for d in decisions if d.decision_id == applied.decision_id)
        nc = await connect(bus.settings("decision"))
        await nc.jetstream().publish(subjects.decision_subject(again.workload), again.to_json())
        await nc.close()
        await wait_pipeline_idle(nats_url)
        results_after = await read_stream(nats_url, subjects.ACTUATION_STREAM)
        assert procs["actuator"].log_contains("decision already handled")

        nc = await connect(nats_url)
        kv = await nc.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        allocations = [
            Allocation.model_validate_json((await kv.get(k)).value or b"") for k in await kv.keys()
        ]
        await nc.close()
        exit_codes = {name: p.stop() for name, p in procs.items()}
        lacked = {
            name: bus.violations(name) for name in ("ingest", "decision", "actuator", "operator")
        }
    finally:
        for p in procs.values():
            p.kill()
        bus.server.cleanup()

    # Every sample the simulator produced is in the stream and was acknowledged by decision.
    assert killed_at_samples < len(samples) == config.expected_samples
    # Load became decisions and the decisions became applied actions.
    assert decisions
    applied_ids = Counter(r.decision_id for r in results if r.outcome is Outcome.APPLIED)
    assert applied_ids
    assert max(applied_ids.values()) == 1, "a decision was applied twice"
    assert len(results_after) == len(results), "a redelivered decision produced another action"
    # The simulated cluster's allocation moved away from the seed of 0.5 everywhere it acted.
    assert len(allocations) == config.workloads
    assert any(a.fraction != config.initial_fraction for a in allocations)
    # SIGTERM drains and exits cleanly.
    assert exit_codes == {"actuator": 0, "decision": 0, "ingest": 0}
    for p in procs.values():
        assert p.log_contains('"msg": "stopped"')
    # Each identity had every permission it used (the server logs each refusal).
    assert lacked == {"ingest": [], "decision": [], "actuator": [], "operator": []}
