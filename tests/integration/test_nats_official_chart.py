"""fracpilot's services against a NATS cluster configured the way the official NATS chart does
it (docs/nats.md; issue 17).

tests/support/official_chart_nats.conf is the chart's JSON-shaped nats.conf for the values in
docs/nats.md (cluster of 3 with routes, JetStream with store_dir, the FRACPILOT account with
one user per identity bound to deploy/nats/permissions.conf, and a system account), run by three
nats-servers on loopback. An earlier version's streams and buckets (R1) are made under the
services' identities; then the services, with the settings docs/nats.md gives them (every URL,
their identity, FRACPILOT_NATS_REPLICAS left to detection), run a pipeline on it: every stream
and KV bucket is R3, raised in place under the same identities (their permissions allow
$JS.API.STREAM.UPDATE.KV_<bucket>), with no permission violation in any server's log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from prometheus_client import CollectorRegistry

from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from helpers import running, wait_for
from support.nats_auth import EXAMPLE_DIR, IDENTITIES
from support.nats_config_cluster import OFFICIAL_CHART_CONF, ConfigFileCluster

pytestmark = pytest.mark.integration

PASSWORDS = {name: f"test-{name}-password" for name in IDENTITIES}
SERVER_ENV = {
    f"FRACPILOT_NATS_{name.upper().replace('-', '_')}_PASSWORD": password
    for name, password in PASSWORDS.items()
} | {"SYS_PASSWORD": "test-sys-password"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ConfigFileCluster]:
    files = {"permissions.conf": (EXAMPLE_DIR / "permissions.conf").read_text()}
    c = ConfigFileCluster(OFFICIAL_CHART_CONF.read_text(), SERVER_ENV, files)
    with c:
        yield c


def identity(cluster: ConfigFileCluster, name: str, replicas: int | None = None) -> dict[str, Any]:
    """A service's settings as docs/nats.md gives them."""
    nats_settings: dict[str, Any] = {"url": cluster.url, "user": name, "password": PASSWORDS[name]}
    # two usage partitions (of the 16 the permissions name) keep the raise in place short
    nats_settings |= {"replicas": replicas} if replicas else {}
    return {"nats": nats_settings, "decision_partitions": 2}


def violations(cluster: ConfigFileCluster) -> list[str]:
    lines: list[str] = []
    for node in cluster.nodes:
        text = Path(node.log_path).read_text(errors="replace")
        lines += [line for line in text.splitlines() if "Permissions Violation" in line]
    return lines


async def replicas_of(cluster: ConfigFileCluster) -> dict[str, int]:
    nc = await nats.connect(cluster.url.split(","), user="operator", password=PASSWORDS["operator"])
    try:
        infos = await nc.jetstream().streams_info()
    finally:
        await nc.close()
    return {str(i.config.name): i.config.num_replicas or 1 for i in infos}


async def run_the_pipeline(cluster: ConfigFileCluster, replicas: int | None) -> None:
    actuator = ActuatorService(
        ActuatorSettings(
            **identity(cluster, "actuator", replicas),
            sim={"pods": "inference/chat-llama-8b=0.5,inference/embed-bge=0.5", "cluster": "demo"},
        )
    )
    decision = DecisionService(DecisionSettings(**identity(cluster, "decision", replicas)))
    ingest = IngestService(
        IngestSettings(
            **identity(cluster, "ingest", replicas),
            sim={"workloads": 2, "duration_s": 2 * 3600, "speed": 3600},
        )
    )
    async with running(actuator), running(decision), running(ingest):
        await wait_for(ingest.finished.is_set, timeout=60)


# The KV buckets each identity may create (deploy/nats/permissions.conf); the partition
# leases' bucket, made with its TTL by the decision service alone, is made in the second run.
BUCKETS = {
    "ingest": (subjects.ALLOCATION_BUCKET, subjects.INGEST_STATE_BUCKET),
    "decision": (subjects.POLICY_BUCKET, subjects.DECISION_STATE_BUCKET),
    "actuator": (subjects.ACTUATOR_STATE_BUCKET, subjects.TARGET_BUCKET),
}


async def open_buckets(cluster: ConfigFileCluster, replicas: int | None) -> None:
    """Each identity declares the streams and opens the buckets it may create."""
    for name, buckets in BUCKETS.items():
        settings = ServiceSettings(**identity(cluster, name, replicas))
        bus = Bus(name, settings, CollectorRegistry())
        await bus.connect(retry_for_s=10)
        try:
            await bus.ensure_streams(assign_partitions=name == "decision")
            for bucket in buckets:
                await bus.kv(bucket)
        finally:
            await bus.close()


def test_the_official_charts_shape_forms_one_cluster(cluster: ConfigFileCluster) -> None:
    leader = cluster.wait_for_meta_leader()
    assert leader in {"nats-0", "nats-1", "nats-2"}  # server_name: $POD_NAME
    for node in cluster.nodes:
        assert (node.jsz() or {})["meta_cluster"]["cluster_size"] == 3


async def test_the_services_run_on_it_with_r3_streams_raised_in_place_from_r1(
    cluster: ConfigFileCluster,
) -> None:
    # An earlier version's streams and buckets (all R1), declared under each identity; then
    # the services of this one, detecting the cluster.
    await open_buckets(cluster, replicas=1)
    before = await replicas_of(cluster)
    assert before, "the services made no stream"
    assert set(before.values()) == {1}, before
    await run_the_pipeline(cluster, replicas=None)
    # buckets this pipeline does not use (the Prometheus cursor, the webhook's targets) are
    # raised when a service opens them
    await open_buckets(cluster, replicas=None)
    after = await replicas_of(cluster)
    assert set(after) == set(before) | {f"KV_{subjects.DECISION_PARTITION_BUCKET}"}
    assert {name for name, r in after.items() if r != 3} == set(), after
    assert any(name.startswith("KV_") for name in after)
    assert violations(cluster) == []
