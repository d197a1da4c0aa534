"""The chart's ServiceMonitor and PodMonitor keep the labels the dashboard and alerts read.

The services label per-workload series with the workload's ``namespace`` (and ``component``,
``source``, ...). A Prometheus Operator scrape attaches target labels of its own (the pod's
``namespace``, ``pod``, ``service``, ``container``, ``endpoint``, ``job``, ``instance``); without
``honorLabels: true`` the target's ``namespace`` wins and the workload's becomes
``exported_namespace``. Rendered with the real helm (the cached build, as
tests/integration/k8s/test_helm_chart.py finds it) and the Operator's APIs announced, every
monitor endpoint honours the labels and relabels none of those the dashboard
(deploy/grafana/dashboards/fracpilot.json) and the alerts (deploy/prometheus/fracpilot-alerts.yml)
name. Then a real Prometheus scrapes the services' metric classes as each monitor says (honour
and the target labels the Operator attaches) and the series keep the workload's labels, while
a scrape without honorLabels would not (the control).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from fracpilot_decision.metrics import DecisionMetrics, RecommendationMetrics
from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.server_process import free_port
from fracpilot_libs.telemetry import service_ready_gauge
from k8s_control_plane import cached_bin_dir
from support.prometheus_server import PrometheusServer, ScrapeTarget

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fracpilot"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "fracpilot.json"
ALERTS = ROOT / "deploy" / "prometheus" / "fracpilot-alerts.yml"
OPERATOR_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
)
# The target labels the Operator attaches to every series of a monitor's targets.
TARGET_LABELS = {"namespace", "pod", "service", "container", "endpoint", "job", "instance"}
# Labels the scrape or the user's Prometheus adds (external labels), not the services.
FROM_THE_SCRAPE = {"job", "instance", "cluster"}


def helm_template(*args: str) -> list[dict[str, Any]]:
    helm = cached_bin_dir() / "helm"
    if not helm.is_file():
        pytest.skip(f"no helm at {helm}: build it with scripts (see tests/k8s_control_plane.py)")
    proc = subprocess.run(
        [str(helm), "template", "fr", str(CHART), "--namespace", "apps", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def monitors(*args: str) -> list[dict[str, Any]]:
    docs = helm_template(*args)
    return [d for d in docs if d["kind"] in {"ServiceMonitor", "PodMonitor"}]


def endpoints(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    spec = monitor["spec"]
    found: list[dict[str, Any]] = spec.get("endpoints") or spec.get("podMetricsEndpoints")
    return found


def with_operator() -> list[dict[str, Any]]:
    announced = [f"--api-versions={api}" for api in OPERATOR_APIS]
    return monitors(*announced, "--set", "metrics.podMonitor.enabled=true")


# --- the label names the dashboard and the alerts read ---------------------------------------


def promql_labels(expr: str) -> set[str]:
    """Label names in a PromQL expression: matchers, ``by``/``without``/``on``/``ignoring``
    lists, and the label argument of Grafana's ``label_values``."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"\"", text))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        names |= {n.strip() for n in group.split(",") if n.strip()}
    if match := re.match(r"\s*label_values\(.*,\s*(\w+)\s*\)\s*$", expr):
        names.add(match.group(1))
    return names


def dashboard_labels() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            names |= promql_labels(target["expr"])
            names |= set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            names |= promql_labels(variable["query"]["query"])
    return names


def alert_labels() -> set[str]:
    names: set[str] = set()
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            names |= promql_labels(rule["expr"])
            for text in rule["annotations"].values():
                names |= set(re.findall(r"\$labels\.(\w+)", text))
    return names


def test_the_label_names_are_found() -> None:
    assert promql_labels('sum by (a, b) (m{c="x", d=~"$v"}) / on (e) n') == {
        "a",
        "b",
        "c",
        "d",
        "e",
    }
    assert promql_labels('label_values(m{ns=~"$namespace"}, workload)') == {"ns", "workload"}
    assert {"namespace", "workload", "component", "cluster"} <= dashboard_labels()
    assert {"namespace", "workload", "component", "source", "stream"} <= alert_labels()


# --- the rendered monitors -------------------------------------------------------------------


def test_without_the_operators_api_no_monitor_is_rendered() -> None:
    assert monitors("--set", "metrics.podMonitor.enabled=true") == []


def test_every_monitor_endpoint_honours_the_services_labels() -> None:
    rendered = with_operator()
    assert {m["kind"] for m in rendered} == {"ServiceMonitor", "PodMonitor"}
    for monitor in rendered:
        points = endpoints(monitor)
        assert points, monitor["kind"]
        for point in points:
            assert point.get("honorLabels") is True, (monitor["kind"], point)


def test_no_monitor_relabels_a_label_the_dashboard_or_alerts_read() -> None:
    read = (dashboard_labels() | alert_labels()) - FROM_THE_SCRAPE
    assert "namespace" in read  # the workload's, which a target label would shadow
    for monitor in with_operator():
        for point in endpoints(monitor):
            for key in ("relabelings", "metricRelabelings"):
                for rule in point.get(key, []):
                    touched = set(rule.get("sourceLabels", [])) | {rule.get("targetLabel")}
                    assert rule.get("action", "replace") not in {"labeldrop", "labelkeep"}
                    assert not touched & read, (monitor["kind"], rule)


# --- a real Prometheus scraping as the monitors say -------------------------------------------


def services_registry() -> CollectorRegistry:
    """One series of each per-workload and per-component family the dashboard and alerts
    read, from the services' own metric classes."""
    registry = CollectorRegistry()
    ingest = IngestMetrics(registry, GpuPrices(), workload_limit=10)
    ingest.usage.allocated_ratio.labels("ml", "llm").set(0.5)
    ingest.usage.memory_ratio.labels("ml", "llm").set(0.3)
    ingest.lag.labels("prometheus").set(3.0)
    ingest.source_errors.labels("prometheus").inc()
    RecommendationMetrics(registry, limit=10, ttl_s=600).set("ml", "llm", 0.5, 0.25, time.time())
    DecisionMetrics(registry).decisions.labels("down", "underused").inc()
    service_ready_gauge(registry, "decision").set(1)
    return registry


@pytest.fixture(scope="module")
def exporter() -> Iterator[tuple[str, CollectorRegistry]]:
    registry = services_registry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", registry
    finally:
        server.shutdown()
        thread.join(timeout=5)


def operator_target(job: str, address: str, honor: bool, kind: str) -> ScrapeTarget:
    """The scrape the Operator generates for one monitor endpoint: its target labels
    (a PodMonitor's targets have no ``service``)."""
    labels = {"namespace": "apps", "pod": "fr-fracpilot-decision-0", "container": "decision"}
    labels["endpoint"] = "metrics"
    if kind == "ServiceMonitor":
        labels["service"] = "fr-fracpilot-decision"
    return ScrapeTarget(job, address, labels=labels, honor_labels=honor)


def test_the_scraped_series_keep_the_workloads_namespace(
    exporter: tuple[str, CollectorRegistry],
) -> None:
    address, registry = exporter
    rendered = with_operator()
    targets = [
        operator_target(m["kind"].lower(), address, endpoints(m)[0]["honorLabels"], m["kind"])
        for m in rendered
    ]
    targets.append(operator_target("without-honour", address, False, "ServiceMonitor"))
    read = dashboard_labels() | alert_labels()
    exported = [
        sample
        for family in registry.collect()
        if family.name.startswith("fracpilot_")
        for sample in family.samples
        if sample.labels and not sample.name.endswith("_created")
    ]
    covered = {label for sample in exported for label in sample.labels} & read
    assert covered >= {"namespace", "workload", "component", "source", "direction", "reason"}
    with PrometheusServer(targets, start=True) as prometheus:
        prometheus.wait_for_targets_up(timeout=30)
        for monitor in rendered:
            job = monitor["kind"].lower()
            for sample in exported:
                selector = f'{sample.name}{{job="{job}"}}'
                found = prometheus.wait_for_series(selector, timeout=30)
                wanted = dict(sample.labels)
                kept = [s for s in found if {k: s["metric"].get(k) for k in wanted} == wanted]
                assert kept, (monitor["kind"], sample.name, wanted, found)
                for series in found:
                    assert not any(k.startswith("exported_") for k in series["metric"]), series
        # The control: without honorLabels the target's namespace shadows the workload's.
        (series,) = prometheus.wait_for_series(
            'fracpilot_workload_recommended_ratio{job="without-honour"}', timeout=30
        )
        assert series["metric"]["namespace"] == "apps"
        assert series["metric"]["exported_namespace"] == "ml"
