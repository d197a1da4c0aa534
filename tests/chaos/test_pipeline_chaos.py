"""Kill nats-server and each service under simulated load; nothing may be lost or done twice.

The three services run as processes (as in production) over a real nats-server with a file
store; the load is the workload simulator (ingest) and the simulated cluster (actuator). While
samples flow the test kills, one after the other: ingest, decision and the actuator with
SIGKILL (each restarted at once, as a supervisor would), nats-server with SIGKILL (restarted on
the same port and store after two seconds) and freezes the decision service with SIGSTOP for
three seconds. After each fault it polls every service's /readyz until all answer ready
(``READY_WITHIN_S``); at the end it lets the pipeline drain and runs the invariant checker.

The bus is secured as the chart's default is (issue 29): deploy/nats's configuration (the
chart's permissions source) with TLS; each service has its own identity and the CA, the checker
reads as the read-only operator, and no identity may lack a permission, faults included.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest

from chaos.faults import (
    READY_WITHIN_S,
    FaultRun,
    ScenarioFigures,
    pause,
    resume,
    seconds_until_ready,
    went_unready,
)
from chaos.invariants import check, wait_drained
from fracpilot_cli.demo import DemoConfig
from fracpilot_cli.processes import ServiceProcess
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.server_process import free_port
from fracpilot_libs.simulation.workloads import demo_workloads
from support.nats_auth import SecuredNats, chart_tls_files

pytestmark = pytest.mark.chaos

ORDER = ("actuator", "decision", "ingest")


def expected_sample_ids(config: DemoConfig) -> set[str]:
    start = IngestSettings().sim.start
    steps = int(config.sim_hours * 3600 // config.step_s)
    return {
        f"sim|{w.workload.key}|{int((start + timedelta(seconds=i * config.step_s)).timestamp())}"
        for w in demo_workloads(config.namespace, config.cluster)[: config.workloads]
        for i in range(steps)
    }


async def test_kills_of_nats_and_every_service_lose_nothing_and_repeat_nothing(
    tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    # 8 workloads, a sample per simulated minute, 30 simulated hours in ~45 s: 14,400 samples.
    config = DemoConfig(workloads=8, sim_hours=30, speed=2400, log_dir=tmp_path)
    figures = ScenarioFigures(
        "NATS and service kills (simulated cluster)",
        f"{config.workloads} simulated workloads, {config.expected_samples} samples at "
        f"{config.speed * config.workloads / config.step_s:.0f}/s",
    )
    chaos_figures.append(figures)
    started = time.monotonic()
    server = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls"))
    server.start()
    operator = server.settings("operator")
    ports = {name: free_port() for name in ORDER}
    envs = config.service_env(server.url)
    procs: dict[str, ServiceProcess] = {}
    for name in ORDER:
        env = {
            **envs[name],
            **server.env(name),  # its own identity and the CA
            "FRACPILOT_METRICS_PORT": str(ports[name]),  # the same port across restarts
            "FRACPILOT_ACK_WAIT_S": "3",  # a killed consumer's messages come back in 3 s
            "FRACPILOT_CHECKPOINT_INTERVAL_S": "1",
        }
        procs[name] = ServiceProcess(name, env, tmp_path)

    async def restart(name: str) -> FaultRun:
        procs[name].kill()  # SIGKILL: no drain, no last checkpoint, nothing flushed
        down = time.monotonic()
        await asyncio.sleep(0.5)
        procs[name].start()
        recovery = await seconds_until_ready(ports.values())
        return figures.fault(
            FaultRun("SIGKILL + restart", name, time.monotonic() - down - recovery, recovery)
        )

    try:
        for name in ORDER:
            procs[name].start().wait_for_log("service ready", timeout_s=60)
        await asyncio.sleep(2.0)
        await restart("ingest")  # early: the simulator replays its span from the start
        await asyncio.sleep(2.0)
        await restart("decision")
        await asyncio.sleep(2.0)
        await restart("actuator")
        await asyncio.sleep(2.0)

        server.stop(kill=True)  # SIGKILL nats-server; the store stays on disk
        down = time.monotonic()
        noticed = await went_unready(ports.values(), within_s=2.0)
        await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - down)))
        server.start()
        duration = time.monotonic() - down
        recovery = await seconds_until_ready(ports.values())
        figures.fault(FaultRun("SIGKILL + restart", "nats-server", duration, recovery, noticed))
        await asyncio.sleep(2.0)

        pid = procs["decision"].proc.pid  # type: ignore[union-attr]
        pause(pid)  # frozen: no heartbeat, no acks, its HTTP endpoint does not answer
        await asyncio.sleep(3.0)
        resume(pid)
        recovery = await seconds_until_ready(ports.values())
        figures.fault(FaultRun("SIGSTOP/SIGCONT", "decision", 3.0, recovery))

        procs["ingest"].wait_for_log("simulation finished", timeout_s=120)
        figures.extra["drained after the load ended"] = f"{await wait_drained(operator):.1f} s"
        findings = await check(operator, expected_sample_ids=expected_sample_ids(config))
        figures.findings = findings
        for p in procs.values():
            assert p.running, f"{p.name} died; see {p.log_path}"
        resumed = sum(p.log_path.read_text().count("resuming a decision") for p in procs.values())
        figures.extra["decisions resumed after a kill"] = resumed
        lacked = {name: server.violations(name) for name in (*ORDER, "operator")}
    finally:
        figures.wall_s = time.monotonic() - started
        for p in procs.values():
            p.kill()
        server.cleanup()

    assert findings.breaches == 0, findings.problems
    assert findings.expected_samples == findings.samples == config.expected_samples
    assert findings.decisions > 0
    assert findings.applied > 0
    assert findings.stale_allocation_samples == 0
    for run in figures.faults:
        assert run.recovery_s <= READY_WITHIN_S, run
    nats_run = next(r for r in figures.faults if r.target == "nats-server")
    assert nats_run.noticed, "no service reported not-ready while nats-server was down"
    assert lacked == {name: [] for name in (*ORDER, "operator")}, "an identity lacked a permission"
