"""A recommend-only install shows its recommendations where platform teams look, and changes
nothing (issue 30).

The three services run as processes (ingest with the simulated source, decision, actuator with
the simulated cluster) on a bus secured as the chart's default is (tests/support/nats_auth.py:
deploy/nats/'s configuration, one identity per service, TLS), and a real Prometheus scrapes
their /metrics with ``honor_labels`` as the chart's monitors do. What decides whether anything
is applied comes from the chart as ``helm template`` renders it with its default values: the
actuator's opt-in rule (``FRACPILOT_OPTIN_*``, from ``optIn.defaultMode``), its dry-run switch
and the decision service's policy. The simulated namespace carries no ``fracpilot.io/mode``
label: a cluster nobody has opted in yet.

Then the decision service's /metrics has each simulated workload's recommended fraction and
what it would free, the dashboard's "Held vs recommended vs used" panel (and the one of what the
recommendations would free) returns them from Prometheus, and nothing was applied: every
decision became a recommendation held back as not opted in, and every fraction of the simulated
cluster is still its seed.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fracpilot_cli.demo import DemoConfig
from fracpilot_cli.processes import ServiceProcess
from fracpilot_libs.contracts import ActuationResult, Allocation, FractionDecision, Outcome
from fracpilot_libs.nats import subjects
from fracpilot_libs.server_process import free_port
from fracpilot_libs.simulation.workloads import demo_workloads
from helpers import connect, read_stream
from support.chart_render import container_env, render
from support.grafana_dashboard import queries
from support.nats_auth import SecuredNats, chart_tls_files
from support.pipeline_idle import wait_pipeline_idle
from support.prometheus_server import PrometheusServer, ScrapeTarget, Series, values_by

pytestmark = pytest.mark.e2e

SERVICES = ("actuator", "decision", "ingest")  # start order
# What the chart sets that decides whether a decision is applied.
CHART_SETTINGS = {
    "actuator": (
        "FRACPILOT_OPTIN_DEFAULT_MODE",
        "FRACPILOT_OPTIN_EXCLUDED_NAMESPACES",
        "FRACPILOT_DRY_RUN",
    ),
    "decision": ("FRACPILOT_POLICY_JSON",),
}
RECOMMENDED = "fracpilot_workload_recommended_ratio"
SAVING = "fracpilot_workload_recommended_saving_ratio"
NOT_OPTED_IN = 'fracpilot_actuator_held_back_total{reason="not_opted_in"}'
Key = tuple[str, str]  # (namespace, workload)


def chart_defaults() -> dict[str, dict[str, str]]:
    docs = render()
    return {
        name: {k: v for k, v in container_env(docs, name).items() if k in keys}
        for name, keys in CHART_SETTINGS.items()
    }


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return text


def gauge(text: str, name: str) -> dict[Key, float]:
    """One per-workload gauge of a /metrics text, by (namespace, workload)."""
    return {
        (s.labels["namespace"], s.labels["workload"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def sample(text: str, name: str, **labels: str) -> float:
    (value,) = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    return value


def by_workload(result: list[Series]) -> dict[tuple[str, ...], float]:
    return values_by(result, "namespace", "workload")


async def test_recommend_only_shows_recommendations_and_applies_nothing(tmp_path: Path) -> None:
    chart = chart_defaults()
    assert chart["actuator"]["FRACPILOT_OPTIN_DEFAULT_MODE"] == "recommend"  # the chart's default
    config = DemoConfig(workloads=8, sim_hours=6, speed=2400, log_dir=tmp_path)
    assert config.namespace not in chart["actuator"]["FRACPILOT_OPTIN_EXCLUDED_NAMESPACES"]
    workloads = {
        (w.workload.namespace, w.workload.owner_name)
        for w in demo_workloads(config.namespace, config.cluster)[: config.workloads]
    }
    bus = SecuredNats(tmp_path / "nats", tls=chart_tls_files(tmp_path / "tls")).start()
    operator = bus.settings("operator")  # the test reads as the operator
    ports = {name: free_port() for name in SERVICES}
    envs = config.service_env(bus.url)
    # Nobody opted in: the simulated namespace has no fracpilot.io/mode label (the demo's has).
    del envs["actuator"]["FRACPILOT_SIM_NAMESPACE_LABELS"]
    procs = {
        name: ServiceProcess(
            name,
            envs[name]
            | chart.get(name, {})
            | bus.env(name)
            | {"FRACPILOT_METRICS_HOST": "127.0.0.1", "FRACPILOT_METRICS_PORT": str(ports[name])},
            tmp_path,
        )
        for name in SERVICES
    }
    prometheus = PrometheusServer(
        [
            ScrapeTarget(f"fracpilot-{n}", f"127.0.0.1:{p}", honor_labels=True)
            for n, p in ports.items()
        ],
        base_dir=tmp_path / "prometheus",
    )
    try:
        prometheus.start()
        for p in procs.values():
            p.start().wait_for_log("service ready", timeout_s=60)
        procs["ingest"].wait_for_log("simulation finished", timeout_s=120)
        await wait_pipeline_idle(operator)
        decision_text = scrape(ports["decision"])
        actuator_text = scrape(ports["actuator"])

        # (1) The decision service exports each simulated workload's recommendation and what it
        # would free. Held is the seed everywhere (nothing applied), so the saving is the seed
        # minus the recommendation; the engine recommends a change somewhere.
        recommended_in_metrics = gauge(decision_text, RECOMMENDED)
        saving_in_metrics = gauge(decision_text, SAVING)
        assert set(recommended_in_metrics) == workloads, decision_text
        assert saving_in_metrics == pytest.approx(
            {k: config.initial_fraction - v for k, v in recommended_in_metrics.items()}
        )
        assert any(v != config.initial_fraction for v in recommended_in_metrics.values())

        # The dashboard's panels, as Grafana asks Prometheus (once it has scraped it all).
        held_vs = queries("Held vs recommended")
        recommended = prometheus.wait_for_series(
            held_vs["B"],
            timeout=30,
            predicate=lambda r: by_workload(r) == recommended_in_metrics,
        )
        held = prometheus.wait_for_series(held_vs["A"], min_series=len(workloads))
        used = {
            ref: prometheus.wait_for_series(held_vs[ref], min_series=len(workloads))
            for ref in ("C", "D")
        }
        (saving_query,) = queries("GPU the recommendations would free").values()
        saving = prometheus.wait_for_series(saving_query, min_series=len(workloads))
        not_opted_in = prometheus.wait_for_series(
            f"sum({NOT_OPTED_IN})", predicate=lambda r: float(r[0]["value"][1]) > 0
        )

        decisions = [
            FractionDecision.model_validate_json(d)
            for _, d in await read_stream(operator, subjects.DECISION_STREAM)
        ]
        results = [
            ActuationResult.model_validate_json(d)
            for _, d in await read_stream(operator, subjects.ACTUATION_STREAM)
        ]
        nc = await connect(operator)
        kv = await nc.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        allocations = [
            Allocation.model_validate_json((await kv.get(k)).value or b"") for k in await kv.keys()
        ]
        await nc.close()
        exit_codes = {name: p.stop() for name, p in procs.items()}
        lacked = {name: bus.violations(name) for name in (*SERVICES, "operator")}
    finally:
        for p in procs.values():
            p.kill()
        prometheus.cleanup()
        bus.server.cleanup()

    # (2) The dashboard shows them: held, recommended, used and what would be freed.
    assert by_workload(recommended) == recommended_in_metrics
    assert by_workload(held) == {k: config.initial_fraction for k in workloads}
    for result in used.values():
        assert set(by_workload(result)) == workloads
    assert by_workload(saving) == pytest.approx(saving_in_metrics)

    # (3) Nothing was applied: every decision became a recommendation held back as not opted
    # in, the counter says so, and the simulated cluster holds its seed fractions.
    assert decisions
    assert {r.decision_id for r in results} == {d.decision_id for d in decisions}
    assert {r.outcome for r in results} == {Outcome.DRY_RUN}
    assert all(r.detail.startswith("not opted in: ") for r in results), results[0].detail
    assert sample(actuator_text, "fracpilot_actuator_held_back_total", reason="not_opted_in") == (
        len(results)
    )
    assert float(not_opted_in[0]["value"][1]) == len(results)
    assert {(a.workload.namespace, a.workload.owner_name) for a in allocations} == workloads
    assert {a.fraction for a in allocations} == {config.initial_fraction}

    assert exit_codes == {"actuator": 0, "decision": 0, "ingest": 0}
    assert lacked == {"ingest": [], "decision": [], "actuator": [], "operator": []}
