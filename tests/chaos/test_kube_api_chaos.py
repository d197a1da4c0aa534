"""Kubernetes API faults under load: the actuator (a process, backend=kubernetes) talks to the
real kube-apiserver through the fault proxy, which answers 409, 429 and 500, holds requests
past the client's timeout, loses the answer to an eviction the apiserver carried out and goes
away altogether; the actuator is also SIGKILLed while an eviction is in flight, after it
recorded the target. Decisions come from a load generator: six workloads resized in place
over and over, and one eviction-sized decision at a time for the others, with a disruption
budget of three per window.

Checked afterwards (chaos.invariants): every decision has a result and no record is left
half-way, no pod was evicted twice (the proxy saw what reached the apiserver), at most three
disruptive actions in the window even across the kill, every applied fraction is the decided
one; and after each fault the actuator is ready and acting again within ``READY_WITHIN_S``.

The bus is secured as the chart's default is (issue 29): deploy/nats's configuration (the chart's
permissions source) with TLS from the chart hook's CA. The actuator process runs as ``actuator``,
the load generator publishes decisions as ``decision``, the allocations are seeded as the
actuator writes them, the results are followed and the evidence read as the read-only
``operator``; no identity may lack a permission, faults included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from chaos.faults import READY_WITHIN_S, FaultRun, ScenarioFigures, seconds_until_ready
from chaos.invariants import Budget, EvictionSeen, check, wait_drained
from chaos.kube_cluster import GpuCluster
from factories import decision as make_decision
from fracpilot_cli.processes import ServiceProcess
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import ActuationResult, FractionDecision, Outcome, PlanKind, utcnow
from fracpilot_libs.nats import subjects
from fracpilot_libs.server_process import free_port
from helpers import connect, wait_for
from k8s_control_plane import ControlPlane
from support.fault_proxy import FaultProxy, Rule, proxy_kubeconfig, upstream_context
from support.nats_auth import IDENTITIES, SecuredNats, chart_tls_files

pytestmark = pytest.mark.chaos

WORKLOADS = [f"svc-{i}" for i in range(8)]
EVICTED = WORKLOADS[:4]  # each gets one eviction-sized decision, one at a time
STEADY = WORKLOADS[4:]  # resized in place all along
BUDGET = Budget(max_disruptions=3, max_per_namespace=3, window_s=600.0)
EVICTION = r"/pods/[^/]+/eviction$"


class Results:
    """Every ActuationResult as it is stored, followed with an ordered consumer (what the
    read-only operator may do), waited on by decision id."""

    def __init__(self) -> None:
        self.seen: dict[str, list[ActuationResult]] = {}
        self.at: list[tuple[float, ActuationResult]] = []
        self._changed = asyncio.Event()

    async def on_message(self, msg: Msg) -> None:
        result = ActuationResult.model_validate_json(msg.data)
        self.seen.setdefault(result.decision_id, []).append(result)
        self.at.append((time.monotonic(), result))
        self._changed.set()

    async def wait(self, decision_id: str, timeout_s: float = 60.0) -> ActuationResult:
        deadline = time.monotonic() + timeout_s
        while not self.seen.get(decision_id):
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no result for decision {decision_id}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))
        return self.seen[decision_id][0]

    def acting_since(self, since: float) -> float | None:
        """When the first result without an error arrived after ``since`` (monotonic)."""
        return next((t for t, r in self.at if t >= since and r.error is None), None)


@contextlib.asynccontextmanager
async def nats_client(identity: ServiceSettings) -> AsyncIterator[NatsClient]:
    nc = await connect(identity)
    try:
        yield nc
    finally:
        await nc.close()


async def test_api_faults_and_a_crash_mid_eviction_keep_every_invariant(
    chaos_kube: ControlPlane, tmp_path: Path, chaos_figures: list[ScenarioFigures]
) -> None:
    started = time.monotonic()
    figures = ScenarioFigures(
        "Kubernetes API faults (real apiserver behind the fault proxy)",
        f"{len(WORKLOADS)} Deployments x 2 KAI pods on 16 GPUs; closed-loop decisions",
    )
    chaos_figures.append(figures)
    namespace = f"chaos-{uuid.uuid4().hex[:8]}"
    admin = chaos_kube.admin_client()
    client.CoreV1Api(admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
    )
    gpus = GpuCluster(admin, namespace)
    # 4 nodes x 4 GPUs: 8 GPUs each shared by two pods of different workloads at 0.5, and 8
    # free ones where an evicted pod may go.
    uuids = [gpu for n in range(4) for gpu in gpus.node(f"gpu{n}", 4)]
    shared, _free = uuids[:8], uuids[8:]
    owners = {name: gpus.deployment(name) for name in WORKLOADS}
    for i, gpu in enumerate(shared):
        gpus.reserve(gpu)
        gpus.kai_pod(f"{WORKLOADS[i]}-a", owners[WORKLOADS[i]], gpu, 0.5)
        other = WORKLOADS[(i + 1) % len(WORKLOADS)]
        gpus.kai_pod(f"{other}-b", owners[other], gpu, 0.5)

    host, port = chaos_kube.url.removeprefix("https://").split(":")
    upstream = upstream_context(
        str(chaos_kube.ca_path), str(chaos_kube.admin_cert_path), str(chaos_kube.admin_key_path)
    )
    proxy = FaultProxy(host, int(port), upstream, seed=7).start()
    kubeconfig = tmp_path / "kubeconfig-via-proxy"
    kubeconfig.write_text(json.dumps(proxy_kubeconfig(proxy.url)))
    server = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls")).start()
    operator = server.settings("operator")
    metrics_port = free_port()
    actuator = ServiceProcess(
        "actuator",
        {
            **server.env("actuator"),  # its own identity and the CA
            "FRACPILOT_METRICS_PORT": str(metrics_port),
            "FRACPILOT_BACKEND": "kubernetes",
            "FRACPILOT_KUBECONFIG": str(kubeconfig),
            "FRACPILOT_CLUSTER": gpus.cluster,
            "FRACPILOT_GPU_NODE_SELECTOR": gpus.selector,
            "FRACPILOT_NAMESPACE": namespace,
            "FRACPILOT_LEADER_ELECTION": "false",
            # Opted in cluster-wide (not by a namespace label, which a faulty API could hide).
            "FRACPILOT_OPTIN_DEFAULT_MODE": "auto",
            "FRACPILOT_MAX_DISRUPTIONS": str(BUDGET.max_disruptions),
            "FRACPILOT_MAX_DISRUPTIONS_PER_NAMESPACE": str(BUDGET.max_per_namespace),
            "FRACPILOT_DISRUPTION_WINDOW_S": str(BUDGET.window_s),
            "FRACPILOT_EVICTION_ATTEMPTS": "6",
            "FRACPILOT_EVICTION_BACKOFF_S": "0.1",
            "FRACPILOT_EVICTION_BACKOFF_MAX_S": "0.5",
            "FRACPILOT_KUBE_TIMEOUT_S": "2",
            "FRACPILOT_KUBE_RETRY_ATTEMPTS": "6",
            "FRACPILOT_KUBE_RETRY_BACKOFF_S": "0.1",
            "FRACPILOT_KUBE_RETRY_BACKOFF_MAX_S": "1",
            "FRACPILOT_ACK_WAIT_S": "3",
        },
        tmp_path,
    )
    results = Results()
    current = dict.fromkeys(WORKLOADS, 0.5)
    stop_load = asyncio.Event()
    decisions_sent: list[FractionDecision] = []

    async def publish(nc: Any, name: str, new: float) -> FractionDecision:
        made = make_decision(
            current=current[name],
            new=new,
            name=name,
            decision_id=f"{name}-{uuid.uuid4().hex[:12]}",
            workload=gpus.workload(name),
            decided_at=utcnow(),
            pod=f"{name}-a",
            device_memory_bytes=81920 * 2**20,
            current_memory_mib=int(current[name] * 81920),
            new_memory_mib=int(new * 81920),
            explanation=f"chaos load: {name} {current[name]:g} -> {new:g}",
        )
        decisions_sent.append(made)
        await nc.jetstream().publish(
            subjects.decision_subject(made.workload),
            made.to_json(),
            headers={"Nats-Msg-Id": made.decision_id},
        )
        return made

    async def steady_load(nc: Any, name: str) -> None:
        """Resize one workload in place, 0.5 <-> 0.38 (KAI holds hundredths), each decision after
        the last result."""
        while not stop_load.is_set():
            made = await publish(nc, name, 0.38 if current[name] == 0.5 else 0.5)
            result = await results.wait(made.decision_id)
            if result.outcome is Outcome.APPLIED:
                current[name] = made.new_fraction
            await asyncio.sleep(0.1)

    async def fault(
        kind: str, target: str, during: Callable[[], Awaitable[None]], count: bool = False
    ) -> FaultRun:
        """Run a fault; then time until the actuator is ready and acting again."""
        began = time.monotonic()
        await during()
        ended = time.monotonic()
        ready = await seconds_until_ready([metrics_port])
        acting = None
        while acting is None and time.monotonic() - ended < 30:
            acting = results.acting_since(ended)
            await asyncio.sleep(0.05)
        recovery = max(ready, (acting - ended) if acting is not None else float("inf"))
        return figures.fault(FaultRun(kind, target, ended - began, recovery), count=count)

    def rule_for(seconds: float, *rules: Rule) -> Callable[[], Awaitable[None]]:
        async def during() -> None:
            for rule in rules:
                proxy.add(rule)
            await asyncio.sleep(seconds)
            for rule in rules:
                proxy.remove(rule)

        return during

    def evicted_pods_of(name: str) -> list[str]:
        return [p for p in (f"{name}-a", f"{name}-b") if gpus.evicted(p)]

    try:
        async with nats_client(server.settings("actuator")) as writer:
            # The cluster's allocations, written as the actuator writes them.
            kv = await writer.jetstream().create_key_value(bucket=subjects.ALLOCATION_BUCKET)
            for allocation in gpus.allocations():
                await kv.put(subjects.kv_key(allocation.workload), allocation.to_json())
        actuator.start().wait_for_log("service ready", timeout_s=60)  # streams declared
        async with nats_client(server.settings("decision")) as nc, nats_client(operator) as reader:
            await reader.jetstream().subscribe(
                f"{subjects.ACTUATION_PREFIX}.>",
                stream=subjects.ACTUATION_STREAM,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                cb=results.on_message,
            )
            load = [asyncio.create_task(steady_load(nc, name)) for name in STEADY]
            await asyncio.sleep(1.5)

            # 409 on pod patches: each is read again and retried.
            conflicts = Rule("status", method="PATCH", path="/pods/", status=409, first=6)

            async def conflict_burst() -> None:
                proxy.add(conflicts)
                await wait_for(lambda: conflicts.matched >= 6, timeout=20)
                proxy.remove(conflicts)

            await fault("409 on PATCH pods (6 in a row)", "kube-apiserver", conflict_burst)
            first = await publish(nc, EVICTED[0], 0.88)
            # Evicted: pending, since no controller here makes the replacement it would verify.
            assert (await results.wait(first.decision_id)).outcome is Outcome.PENDING
            # 429 (Retry-After: 1) and 500 on half of all calls, in bursts.
            await fault(
                "429 on 50% of calls",
                "kube-apiserver",
                rule_for(3.0, Rule("status", status=429, probability=0.5, retry_after_s=1)),
            )
            await fault(
                "500 on 50% of calls",
                "kube-apiserver",
                rule_for(3.0, Rule("status", status=500, probability=0.5)),
            )
            # Timeouts: calls held past the client's 2 s, and an eviction the apiserver carries
            # out whose answer is lost: it must be recognised, not sent again.
            lost = Rule("lose_response", method="POST", path=EVICTION, first=1)
            hung = Rule("hang", method="GET|PATCH", path="/api/", delay_s=3.0, first=4)

            async def timeouts() -> None:
                proxy.add(lost)
                proxy.add(hung)
                second = await publish(nc, EVICTED[1], 0.88)
                assert (await results.wait(second.decision_id)).outcome is Outcome.PENDING
                proxy.remove(hung)
                proxy.remove(lost)

            await fault("timeouts + a lost eviction answer", "kube-apiserver", timeouts)
            assert lost.matched == 1
            # Crash between "target recorded" and "pod evicted": the eviction hangs, the
            # actuator is SIGKILLed, comes back, and finishes the decision exactly once.
            held = Rule("hang", method="POST", path=EVICTION, delay_s=60.0)

            async def crash_mid_eviction() -> None:
                proxy.add(held)
                third = await publish(nc, EVICTED[2], 0.88)
                await wait_for(lambda: held.matched > 0, timeout=20)
                actuator.kill()
                proxy.remove(held)
                actuator.start()
                assert (await results.wait(third.decision_id)).outcome is Outcome.PENDING

            await fault("SIGKILL mid-eviction + restart", "actuator", crash_mid_eviction, True)
            # The budget (3) is spent, and it survived the restart: the next one is refused.
            fourth = await publish(nc, EVICTED[3], 0.88)
            refused = await results.wait(fourth.decision_id)
            await fault("proxy down", "kube-apiserver", proxy_down(proxy, 3.0))
            await asyncio.sleep(1.0)
            stop_load.set()
            await asyncio.gather(*load)
            figures.extra["drained after the load ended"] = f"{await wait_drained(operator):.1f} s"

        seen = [
            EvictionSeen(
                r.at,
                namespace,
                _pod_of(r.path),
                r.forwarded and (r.status is None or 200 <= r.status < 300),
            )
            for r in proxy.requests("POST", EVICTION)
        ]
        findings = await check(
            operator,
            evictions=seen,
            decision_of_pod=gpus.decision_of_evicted_pods(),
            budget=BUDGET,
        )
        figures.findings = findings
        figures.injected.update({f"proxy {k}": v for k, v in proxy.injected.items()})
        outcomes: dict[str, int] = {}
        for found in results.seen.values():
            key = found[0].outcome.value
            outcomes[key] = outcomes.get(key, 0) + 1
        figures.extra["results by outcome"] = outcomes
        figures.extra["API requests through the proxy"] = len(proxy.log)
        retried = _count_in_log(actuator.log_path, "API call failed, retrying")
        figures.extra["API calls retried (actuator log)"] = retried
        evicted = {name: evicted_pods_of(name) for name in EVICTED}
        assert actuator.running, f"the actuator died; see {actuator.log_path}"
        lacked = {name: server.violations(name) for name in IDENTITIES}
    finally:
        figures.wall_s = time.monotonic() - started
        stop_load.set()
        actuator.kill()
        proxy.stop()
        server.cleanup()
        admin.close()

    assert findings.breaches == 0, findings.problems
    assert findings.decisions == len({d.decision_id for d in decisions_sent})
    assert findings.disruptive_actions == BUDGET.max_disruptions
    assert (refused.outcome, refused.plan) == (Outcome.SKIPPED, PlanKind.RECREATE_ELSEWHERE)
    assert "rate" in refused.detail, refused.detail
    assert evicted == {
        EVICTED[0]: [f"{EVICTED[0]}-a", f"{EVICTED[0]}-b"],
        EVICTED[1]: [f"{EVICTED[1]}-a", f"{EVICTED[1]}-b"],
        EVICTED[2]: [f"{EVICTED[2]}-a", f"{EVICTED[2]}-b"],
        EVICTED[3]: [],
    }
    assert figures.injected["proxy status:409"] == 6
    assert figures.injected["proxy lose_response"] == 1
    for run in figures.faults:
        assert run.recovery_s <= READY_WITHIN_S, run
    assert lacked == {name: [] for name in IDENTITIES}, "an identity lacked a permission"


def proxy_down(proxy: FaultProxy, seconds: float) -> Callable[[], Awaitable[None]]:
    async def during() -> None:
        proxy.down()
        proxy.injected["down"] += 1
        await asyncio.sleep(seconds)
        proxy.up()

    return during


def _pod_of(path: str) -> str:
    found = re.search(r"/pods/([^/]+)/eviction$", path)
    return found.group(1) if found else path


def _count_in_log(log_path: Path, text: str) -> int:
    return log_path.read_text(errors="replace").count(text) if log_path.exists() else 0
