"""The chaos suite's pipeline on a three-node JetStream cluster (issue 17): the services as
processes, every stream and bucket R3; a node's leadership gathered, faults timed, figures
read back (throughput during the fault, samples whose publish was retried, checkpoints kept).

The cluster is secured as the chart's default is (issue 29; support.nats_cluster.SecuredCluster):
each service has its own identity and the CA, the evidence is read as the operator (the
decision's checkpoints and partition leases as decision, whose buckets they are), and stream
leaders are moved by a test-only identity allowed that alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from nats.js.errors import ServiceUnavailableError

from chaos.faults import ScenarioFigures, seconds_until_ready
from chaos.invariants import Findings, check, read_all, wait_drained
from chaos.test_pipeline_chaos import expected_sample_ids
from fracpilot_cli.demo import DemoConfig
from fracpilot_cli.processes import ServiceProcess
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.kv_snapshot import read_kv
from fracpilot_libs.nats.usage_batch import as_samples
from fracpilot_libs.server_process import free_port
from helpers import NatsAccess, connect
from support.nats_cluster import FAULT_INJECTOR, ClusterNode, SecuredCluster, stream_info

LONG = os.environ.get("FRACPILOT_CHAOS_LONG", "") not in ("", "0", "false")
PARTITIONS = 4
ORDER = ("actuator", "decision", "ingest")


async def js_request(url: NatsAccess, subject: str, body: bytes = b"") -> dict[str, object]:
    nc = await connect(url)
    try:
        reply = await nc.request(subject, body, timeout=5)
    finally:
        await nc.close()
    return dict(json.loads(reply.data))


async def stream_names(url: NatsAccess) -> list[str]:
    reply = await js_request(url, "$JS.API.STREAM.NAMES")
    return sorted(str(n) for n in (reply.get("streams") or []))  # type: ignore[attr-defined]


async def leader_of(url: NatsAccess, stream: str) -> str | None:
    try:
        info = await stream_info(url, stream)
    except Exception:  # no answer while it is elected
        return None
    leader = (info.get("cluster") or {}).get("leader")
    return str(leader) if leader else None


async def gather_leadership(
    url: NatsAccess, admin: NatsAccess, node: str, streams: list[str]
) -> list[str]:
    """Move the leader of each stream to ``node`` (a step-down with a preferred peer, asked
    as ``admin``, tried again until it lands there); the streams it leads in the end."""
    led = []
    for stream in streams:
        for _ in range(10):
            if await leader_of(url, stream) == node:
                led.append(stream)
                break
            body = json.dumps({"placement": {"preferred": node}}).encode()
            with contextlib.suppress(Exception):  # no leader to step down: try again
                await js_request(admin, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body)
            await asyncio.sleep(0.5)
    return led


async def wait_streams_current(url: NatsAccess, timeout_s: float = 30.0) -> float:
    """Until every stream has its leader and two current followers (a restarted node caught
    up); seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            names = await stream_names(url)
            infos = [await stream_info(url, s) for s in names]
        except Exception:
            await asyncio.sleep(0.2)
            continue
        if all(
            (i.get("cluster") or {}).get("leader")
            and len([r for r in i["cluster"].get("replicas") or [] if r.get("current")]) == 2
            for i in infos
        ):
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    raise TimeoutError("streams not current in time")


def metric_sum(port: int, name: str) -> float:
    """The sum of a metric's series on a service's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


T = TypeVar("T")


async def read_back(read: Callable[[], Awaitable[T]], attempts: int = 5) -> T:
    """Read the evidence, again when JetStream answers 503: an ephemeral consumer on an R3
    stream may be asked for messages before its leader is up."""
    for attempt in range(1, attempts + 1):
        try:
            return await read()
        except ServiceUnavailableError:
            if attempt == attempts:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


@dataclass
class ClusterPipeline:
    """Three nats-server nodes and the services; ``decision_nodes`` runs one decision replica
    per named node, each connected to that node only (default: one, to every node)."""

    tmp_path: Path
    config: DemoConfig
    figures: ScenarioFigures
    decision_nodes: tuple[str, ...] = ()
    cluster: SecuredCluster = field(default_factory=SecuredCluster)
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    checkpoints_before: dict[str, int] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def reader(self) -> ServiceSettings:
        """The operator (read-only), connecting to any node."""
        return self.cluster.settings("operator")

    @property
    def admin(self) -> ServiceSettings:
        """The test's fault injector: stream leader step-downs only."""
        return self.cluster.settings(FAULT_INJECTOR)

    def live_url(self) -> str:
        return ",".join(n.url for n in self.cluster.nodes if n.running)

    async def start(self) -> None:
        self.cluster.start()  # returns once every JetStream peer is current
        envs = self.config.service_env(self.cluster.url)
        common = {
            "FRACPILOT_ACK_WAIT_S": "3",
            "FRACPILOT_CHECKPOINT_INTERVAL_S": "1",
            "FRACPILOT_DECISION_PARTITIONS": str(PARTITIONS),
            **self.extra_env,
        }
        for name in ORDER:
            replicas = self.decision_nodes if name == "decision" and self.decision_nodes else ("",)
            for node in replicas:
                key = f"{name}-{node}" if node else name
                self.ports[key] = free_port()
                url = self.cluster.node(node).url if node else self.cluster.url
                env = {
                    **envs[name],
                    **self.cluster.env(name, url),  # its own identity and the CA
                    **common,
                    "FRACPILOT_METRICS_PORT": str(self.ports[key]),
                }
                log_dir = self.tmp_path / key
                self.procs[key] = ServiceProcess(name, env, log_dir)
        for key in sorted(self.procs, key=lambda k: ORDER.index(k.split("-")[0])):
            await asyncio.to_thread(self.procs[key].start().wait_for_log, "service ready", 90)

    async def ready_after(self, ports: list[int] | None = None) -> float:
        return await seconds_until_ready(ports or list(self.ports.values()))

    async def usage_and_kv_streams(self) -> list[str]:
        names = await stream_names(self.reader)
        return [n for n in names if n.startswith("KV_") or n.startswith("FRACPILOT_USAGE")]

    async def checkpoints(self) -> dict[str, int]:
        """Every key of the checkpoint bucket (groups of workload states, partition marks) and the
        revision of its value."""
        nc = await connect(self.cluster.settings("decision", self.live_url()))
        try:
            entries = await read_kv(nc, subjects.DECISION_STATE_BUCKET, name_prefix="test")
        finally:
            await nc.close()
        return {key: m.sequence for key, m in entries.items()}

    async def before_the_fault(self) -> None:
        """Read the checkpoints written so far (each acknowledged by the cluster)."""
        self.checkpoints_before = await self.checkpoints()

    def lost_checkpoints(self, after: dict[str, int]) -> list[str]:
        """Checkpoints written before the fault that are gone, or older, after it."""
        return [k for k, rev in self.checkpoints_before.items() if after.get(k, 0) < rev]

    def terminate_node(self, node: ClusterNode) -> None:
        """SIGTERM, as Kubernetes stops a pod; the node shuts down in order."""
        assert node.proc is not None
        node.proc.terminate()
        node.proc.wait(timeout=30)
        node.proc = None

    async def partition_owners(self) -> dict[int, str]:
        """partition -> the replica holding its lease."""
        nc = await connect(self.cluster.settings("decision", self.live_url()))
        try:
            entries = await read_kv(nc, subjects.DECISION_PARTITION_BUCKET, name_prefix="test")
        finally:
            await nc.close()
        prefix = "partition."
        return {
            int(k[len(prefix) :]): m.data.decode()
            for k, m in entries.items()
            if k.startswith(prefix)
        }

    async def finish(self) -> Findings:
        """Wait for the load to end and the pipeline to drain; the invariants' findings."""
        ingest = self.procs["ingest"]
        await asyncio.to_thread(ingest.wait_for_log, "simulation finished", 180)
        url = self.cluster.settings("operator", self.cluster.nodes[0].url)
        drained = await wait_drained(url, timeout_s=90)
        self.figures.extra["drained after the load ended"] = f"{drained:.1f} s"
        retried = metric_sum(self.ports["ingest"], "fracpilot_bus_publish_retry_seconds_count")
        self.figures.extra["samples delayed (publish retried)"] = int(retried)
        findings = await read_back(
            lambda: check(url, expected_sample_ids=expected_sample_ids(self.config))
        )
        self.figures.findings = findings
        for p in self.procs.values():
            assert p.running, f"{p.name} died; see {p.log_path}"
        return findings

    async def throughput(self, start: float, end: float) -> tuple[float, float]:
        """Samples stored per second in [start, end] (unix time) and over the whole run."""
        return await read_back(lambda: self._throughput(start, end))

    async def _throughput(self, start: float, end: float) -> tuple[float, float]:
        nc = await connect(self.cluster.settings("operator", self.cluster.nodes[0].url))
        try:
            times = [  # each sample of a usage batch at the batch's time
                m.published_at
                for p in range(PARTITIONS)
                for m in await read_all(nc, subjects.usage_stream(p))
                for _ in as_samples(m.subject, m.data)
            ]
        finally:
            await nc.close()
        during = sum(1 for t in times if start <= t <= end) / max(end - start, 1e-3)
        overall = len(times) / max(max(times) - min(times), 1e-3) if times else 0.0
        return during, overall

    def cleanup(self) -> None:
        for p in self.procs.values():
            p.kill()
        self.cluster.cleanup()
