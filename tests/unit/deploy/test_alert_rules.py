"""The alert rules (deploy/prometheus/fracpilot-alerts.yml): valid for Prometheus, each alert
proven by ``promtool test rules`` to fire when it should and not otherwise
(alert_rules_test.yml beside this file), built on metrics and label values the services really
export, with a runbook section in docs/runbooks.md, and the chart's copy the same file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from fracpilot_actuator.admission import AdmissionOutcome
from fracpilot_actuator.metrics import (
    ActuatorMetrics,
    LeaderMetrics,
    PolicySyncMetrics,
    WebhookMetrics,
)
from fracpilot_decision.metrics import (
    CheckpointMetrics,
    DecisionMetrics,
    HeapMetrics,
    ownership_metrics,
)
from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_libs.contracts import Outcome, ReasonCode
from fracpilot_libs.nats.bus_metrics import BusMetrics
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.telemetry import service_ready_gauge

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "fracpilot-alerts.yml"
CHART_COPY = ROOT / "helm" / "fracpilot" / "files" / "fracpilot-alerts.yml"
RULE_TESTS = Path(__file__).resolve().parent / "alert_rules_test.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/fracpilot/fracpilot/blob/main/docs/runbooks.md"

# The label values an alert selects on, as the services spell them.
LABEL_VALUES: dict[tuple[str, str], set[str]] = {
    ("fracpilot_actuator_actions_total", "outcome"): {o.value for o in Outcome},
    ("fracpilot_decision_decisions_total", "reason"): {r.value for r in ReasonCode},
    ("fracpilot_webhook_admissions_total", "outcome"): {o.value for o in AdmissionOutcome},
    ("fracpilot_webhook_tls_reloads_total", "result"): {"failed", "reloaded"},  # webhook.py
    # ServiceRuntime(SERVICE, ...) of each service
    ("fracpilot_service_ready", "component"): {"ingest", "decision", "actuator"},
}


def promtool() -> str:
    from support.prometheus_server import find_prometheus

    return shutil.which("promtool") or str(Path(find_prometheus()).parent / "promtool")


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def exported_names() -> set[str]:
    """Every sample name the services' metrics can have in /metrics (all of them registered,
    the Kubernetes retry counter included)."""
    registry = CollectorRegistry()
    BusMetrics(registry)
    ActuatorMetrics(registry).track_kube_retries()
    LeaderMetrics(registry)
    WebhookMetrics(registry)
    PolicySyncMetrics(registry)
    DecisionMetrics(registry)
    CheckpointMetrics(registry)
    ownership_metrics(registry)
    HeapMetrics(registry)
    IngestMetrics(registry, GpuPrices(), workload_limit=10)
    service_ready_gauge(registry, "ingest")
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
    }
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, the text inside its braces) for each ``name{...}`` in the expression."""
    return re.findall(r"\b(fracpilot_\w+)\{([^}]*)\}", expr)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_prometheus_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_promtool_tests_load_these_rules() -> None:
    spec = yaml.safe_load(RULE_TESTS.read_text())
    assert [(RULE_TESTS.parent / f).resolve() for f in spec["rule_files"]] == [RULES]


def test_every_alert_is_tested_firing_and_silent() -> None:
    spec = yaml.safe_load(RULE_TESTS.read_text())
    fired: set[str] = set()
    silent: set[str] = set()
    for case in spec["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert fired == names
    assert silent == names


def test_the_alerts_asked_for_exist() -> None:
    """Consumer lag growing, dead letters, decisions not applied, actuator without a leader,
    memory overruns, webhook errors (issue 18), a stalled pipeline (issue 30), and a few
    more."""
    names = {rule["alert"] for rule in alerts()}
    assert names >= {
        "FracpilotConsumerLagGrowing",
        "FracpilotDeadLetters",
        "FracpilotDecisionsNotApplied",
        "FracpilotActuatorWithoutLeader",
        "FracpilotMemoryOverrun",
        "FracpilotWebhookErrors",
        # a stalled pipeline (issue 30)
        "FracpilotServiceAbsent",
        "FracpilotServiceNotReady",
        "FracpilotIngestLagging",
        "FracpilotIngestSourceErrors",
        "FracpilotDecisionsNotFlowing",
    }
    assert len(names) == len(alerts())  # no name used twice


def test_every_metric_an_alert_reads_is_exported_by_a_service() -> None:
    exported = exported_names()
    assert "fracpilot_consumer_pending_messages" in exported  # the collection itself works
    for rule in alerts():
        names = set(re.findall(r"\bfracpilot_\w+", without_strings(rule["expr"])))
        assert names, rule["alert"]
        assert names <= exported, f"{rule['alert']}: {sorted(names - exported)}"


def test_every_label_value_an_alert_selects_is_one_a_service_sets() -> None:
    seen = 0
    for rule in alerts():
        for name, matchers in selectors(rule["expr"]):
            for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
                assert (name, label) in LABEL_VALUES, f"{rule['alert']}: {name}{{{label}}}"
                assert op == "=", rule["alert"]
                assert value in LABEL_VALUES[(name, label)], f"{rule['alert']}: {value}"
                seen += 1
    assert seen >= 4


def test_the_services_are_the_components_the_absent_alert_looks_for() -> None:
    from fracpilot_actuator.app import SERVICE as ACTUATOR
    from fracpilot_decision.service import SERVICE as DECISION
    from fracpilot_ingest.service import SERVICE as INGEST

    (rule,) = [r for r in alerts() if r["alert"] == "FracpilotServiceAbsent"]
    looked_for = {value for _, value in re.findall(r'(component)="([^"]*)"', rule["expr"])}
    assert looked_for == {INGEST, DECISION, ACTUATOR}


def test_a_wrong_name_or_label_value_would_be_caught() -> None:
    assert "fracpilot_dead_letter_total" not in exported_names()
    assert "fail" not in LABEL_VALUES[("fracpilot_actuator_actions_total", "outcome")]
    assert selectors('sum(rate(fracpilot_a_total{outcome="failed"}[5m]))') == [
        ("fracpilot_a_total", 'outcome="failed"')
    ]


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_every_alert_has_a_severity_a_summary_and_a_runbook_section(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    url = rule["annotations"]["runbook_url"]
    base, _, anchor = url.partition("#")
    assert base == RUNBOOK_URL
    assert anchor == rule["alert"].lower()
    sections = runbook_sections()
    assert anchor in sections, f"docs/runbooks.md has no section #{anchor}"
    body = sections[anchor]
    for part in ("**What it means.**", "**How to check.**", "**What to do.**"):
        assert part in body, f"{rule['alert']}: {part}"


def runbook_sections() -> dict[str, str]:
    """Each ``## `` section of docs/runbooks.md by its anchor."""
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOKS.read_text().splitlines():
        if line.startswith("## "):
            current = slug(line[3:])
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def test_every_runbook_section_is_an_alert() -> None:
    assert set(runbook_sections()) == {rule["alert"].lower() for rule in alerts()}


def test_slug_is_githubs() -> None:
    assert slug("FracpilotDeadLetters") == "fracpilotdeadletters"
    assert slug("What it means: a (test)") == "what-it-means-a-test"


def test_the_chart_ships_the_same_rules() -> None:
    """The chart reads its copy (a chart must not reach outside its folder): keep them equal,
    cp deploy/prometheus/fracpilot-alerts.yml helm/fracpilot/files/."""
    assert CHART_COPY.read_bytes() == RULES.read_bytes()
