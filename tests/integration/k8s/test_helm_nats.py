"""The chart's built-in NATS (helm/fracpilot/templates/nats.yaml, _nats.tpl), rendered by the real
helm, and its rendered nats.conf run by three real nats-servers (issue 17).

By default it is a 3-server JetStream cluster: a StatefulSet of 3 whose routes name every pod
through the headless Service, a PodDisruptionBudget, anti-affinity, an exporter scraped like
the services, FRACPILOT_NATS_REPLICAS=3 for the services. ``replicas: 1`` renders one server
without a cluster block. The ConfigMap's nats.conf, adapted only for loopback ports, routes and
paths (tests/support/nats_config_cluster.py), forms a cluster with a meta leader, and the
services' own stream set-up (Bus.ensure_streams) makes every stream R3 on it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from prometheus_client import CollectorRegistry

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from k8s_control_plane import REPO_ROOT, ensure_testbin
from support.nats_config_cluster import ConfigFileCluster

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
NS = "gpu"
NAME = "fp-fracpilot-nats"  # release "fp"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_testbin() / "helm"


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(helm), "template", "fp", str(CHART), "--namespace", NS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def nats_conf(docs: list[dict[str, Any]]) -> str:
    return str(find(docs, "ConfigMap", NAME)["data"]["nats.conf"])


def routes_in(conf: str) -> list[str]:
    block = re.search(r"(?s)routes: \[(.*?)\]", conf)
    return block.group(1).split() if block else []


def service_env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    deployment = find(docs, "Deployment", f"fp-fracpilot-{component}")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.fixture(scope="module")
def default(helm: Path) -> list[dict[str, Any]]:
    return render(helm, "--api-versions=monitoring.coreos.com/v1/ServiceMonitor")


def test_the_default_is_a_three_server_cluster_routed_over_the_headless_service(
    default: list[dict[str, Any]],
) -> None:
    sts = find(default, "StatefulSet", NAME)
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == f"{NAME}-headless"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    conf = nats_conf(default)
    assert "server_name: $POD_NAME" in conf
    assert re.search(rf"(?s)cluster \{{\s*name: {NAME}\s*port: 6222", conf), conf
    # every pod, by its DNS name under the headless Service, on the route port
    assert routes_in(conf) == [f"nats://{NAME}-{i}.{NAME}-headless.{NS}.svc:6222" for i in range(3)]
    headless = find(default, "Service", f"{NAME}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["cluster"] == 6222
    nats_container = sts["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "cluster", "containerPort": 6222, "protocol": "TCP"} in nats_container["ports"]
    # JetStream's limits are per server
    assert re.search(r"max_memory_store: 256M\s+max_file_store: 8G", conf)


def test_a_disruption_budget_and_anti_affinity_keep_the_quorum(
    default: list[dict[str, Any]], helm: Path
) -> None:
    pdb = find(default, "PodDisruptionBudget", NAME)
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "nats"
    pod = find(default, "StatefulSet", NAME)["spec"]["template"]["spec"]
    preferred = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == selector
    required = render(helm, "--set", "nats.podAntiAffinity.type=required")
    anti = find(required, "StatefulSet", NAME)["spec"]["template"]["spec"]["affinity"]
    assert anti["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ] == {"matchLabels": selector}
    spread_off = render(helm, "--set", "nats.podAntiAffinity.type=none")
    assert "affinity" not in find(spread_off, "StatefulSet", NAME)["spec"]["template"]["spec"]


def test_the_services_get_three_replicas_and_the_exporter_is_scraped(
    default: list[dict[str, Any]], helm: Path
) -> None:
    for component in ("ingest", "decision", "actuator"):
        assert service_env(default, component)["FRACPILOT_NATS_REPLICAS"] == "3"
    metrics = find(default, "Service", f"{NAME}-metrics")
    assert metrics["metadata"]["labels"]["fracpilot.io/metrics"] == "true"  # what it selects
    monitor = next(d for d in default if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]
    pod = find(default, "StatefulSet", NAME)["spec"]["template"]["spec"]
    exporter = next(c for c in pod["containers"] if c["name"] == "metrics")
    assert "http://localhost:8222/" in exporter["args"]
    assert "-jsz=all" in exporter["args"]
    pod_monitor = render(
        helm,
        "--api-versions=monitoring.coreos.com/v1/PodMonitor",
        "--set",
        "metrics.podMonitor.enabled=true",
    )
    selected = next(d for d in pod_monitor if d["kind"] == "PodMonitor")["spec"]["selector"]
    assert "nats" in selected["matchExpressions"][0]["values"]
    # an explicit value wins; with your own NATS the services detect it
    explicit = render(helm, "--set", "nats.streamReplicas=1")
    assert service_env(explicit, "decision")["FRACPILOT_NATS_REPLICAS"] == "1"
    external = render(helm, "--set", "nats.deploy=false", "--set", "nats.url=nats://n:4222")
    assert "FRACPILOT_NATS_REPLICAS" not in service_env(external, "decision")


def test_one_server_has_no_cluster_block(helm: Path) -> None:
    docs = render(helm, "--set", "nats.replicas=1")
    conf = nats_conf(docs)
    assert "cluster" not in conf
    assert "routes" not in conf
    sts = find(docs, "StatefulSet", NAME)
    assert sts["spec"]["replicas"] == 1
    assert "podManagementPolicy" not in sts["spec"]
    assert "affinity" not in sts["spec"]["template"]["spec"]
    assert not [
        d for d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == NAME
    ]
    headless = find(docs, "Service", f"{NAME}-headless")
    assert [p["name"] for p in headless["spec"]["ports"]] == ["client"]
    assert service_env(docs, "decision")["FRACPILOT_NATS_REPLICAS"] == "1"


def test_the_network_policy_lets_the_servers_route_to_one_another(helm: Path) -> None:
    docs = render(helm, "--set", "networkPolicy.egress.enabled=true")
    policy = find(docs, "NetworkPolicy", NAME)["spec"]
    routes = next(r for r in policy["ingress"] if r["ports"][0]["port"] == "cluster")
    assert routes["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "nats"
    egress_ports = [p["port"] for rule in policy["egress"] for p in rule["ports"]]
    assert 6222 in egress_ports
    assert 53 in egress_ports


async def test_the_rendered_nats_conf_forms_a_cluster_with_r3_streams(helm: Path) -> None:
    # Without identities and TLS, to look at the cluster alone: the default (both on) runs in
    # test_helm_nats_auth.py.
    docs = render(helm, "--set", "nats.auth.type=none", "--set", "nats.tls.enabled=false")
    conf = nats_conf(docs)
    replicas = int(service_env(docs, "decision")["FRACPILOT_NATS_REPLICAS"])
    with ConfigFileCluster(conf, prefix=NAME) as cluster:
        leader = cluster.wait_for_meta_leader()
        assert leader in {f"{NAME}-{i}" for i in range(3)}  # server_name: $POD_NAME
        for node in cluster.nodes:
            meta = (node.jsz() or {})["meta_cluster"]
            assert meta["cluster_size"] == 3
            assert meta["name"] == NAME
        settings = ServiceSettings(
            nats={"url": cluster.url, "replicas": replicas}, decision_partitions=2
        )
        bus = Bus("decision", settings, CollectorRegistry())
        await bus.connect(retry_for_s=10)
        try:
            await bus.ensure_streams()
            await bus.kv(subjects.DECISION_STATE_BUCKET)
        finally:
            await bus.close()
        nc = await nats.connect(cluster.url.split(","))
        try:
            infos = {i.config.name: i for i in await nc.jetstream().streams_info()}
        finally:
            await nc.close()
        for name in (
            subjects.DECISION_STREAM,
            subjects.ACTUATION_STREAM,
            subjects.DEADLETTER_STREAM,
            subjects.usage_stream(0),
            subjects.usage_stream(1),
            f"KV_{subjects.DECISION_STATE_BUCKET}",
        ):
            assert infos[name].config.num_replicas == 3, name
            cluster_info = infos[name].cluster
            assert cluster_info is not None, name
            assert cluster_info.leader, name


def test_stream_limits_reach_every_service_and_zero_is_left_out(
    default: list[dict[str, Any]], helm: Path
) -> None:
    assert not [k for k in service_env(default, "decision") if k.startswith("FRACPILOT_STREAMS_")]
    docs = render(
        helm,
        "--set",
        "nats.streams.usage.maxBytes=2147483648,nats.streams.deadLetters.maxAgeSeconds=604800",
    )
    for component in ("ingest", "decision", "actuator"):
        env = service_env(docs, component)
        assert env["FRACPILOT_STREAMS_USAGE_MAX_BYTES"] == "2147483648"
        assert env["FRACPILOT_STREAMS_DEADLETTERS_MAX_AGE_S"] == "604800"
        assert "FRACPILOT_STREAMS_DECISIONS_MAX_BYTES" not in env


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["nats.replicas=2"], "/nats/replicas"),
        (["nats.replicas=1", "nats.streamReplicas=3"], "/nats/streamReplicas"),
        (["nats.podAntiAffinity.type=sometimes"], "/nats/podAntiAffinity/type"),
        (["nats.streams.usage.maxBytes=-1"], "/nats/streams/usage/maxBytes"),
    ],
)
def test_wrong_nats_values_are_refused(helm: Path, values: list[str], complaint: str) -> None:
    args = [a for v in values for a in ("--set", v)]
    proc = subprocess.run(
        [str(helm), "template", "fp", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert complaint in proc.stderr
