"""The Grafana dashboard (deploy/grafana/dashboards/fracpilot.json) shows what the services
really export.

Its JSON is checked for the structure Grafana provisions (panels with titles, unique ids, a
24-column grid), for a ``datasource`` variable (type prometheus) that every panel, query and
variable uses (so it works with any Prometheus, not only the Compose one), and for counters read
only through ``rate`` / ``increase`` (a raw counter is a number since some restart, not a
figure). Then the Compose stack runs
as local processes (tests/support/compose_stack.py: real nats-server and Prometheus, the
simulator and the three services) with samples, decisions, results and one dead letter
flowing, and every metric name any PromQL expression of the dashboard names must be in the
live ``/metrics`` of a service (or of the dcgm-exporter simulator), with a series; every
expression must also run in that Prometheus and return data.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fracpilot_libs.contracts import ActuationResult, Outcome, WorkloadRef
from fracpilot_libs.nats import subjects
from helpers import read_stream
from support.compose_stack import OUR_SERVICES, ComposeStack, scrape
from support.grafana_dashboard import dashboard, with_variables
from support.grafana_dashboard import panel as dashboard_panel
from support.prometheus_server import PrometheusError

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"

# Counters that count only faults: the stack runs without any, so these are declared (HELP and
# TYPE in /metrics) but have no series. Every other metric must have one.
FAULT_ONLY = {"fracpilot_ingest_samples_rejected_total"}

# PromQL's keywords; a name followed by '(' is a function or an aggregation, never a metric
# (a misspelt function is caught when Prometheus runs the expression).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
DATASOURCE = "${datasource}"
COUNTER_SERIES = re.compile(r"_(total|bucket|sum|count)$")


def expressions(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and query variables (``label_values``)."""
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if t.get("expr")]
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query":
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "({["
        depth -= ch in ")}]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana ``label_values(...)`` query)."""
    expr = expr.strip()
    if expr.startswith("label_values("):
        args = _split_top_level(expr[len("label_values(") : expr.rindex(")")])
        return metric_names(args[0]) if len(args) == 2 else set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = match.group(0)
        if word in KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


# --- the dashboard's JSON --------------------------------------------------------------------


def test_metric_names_are_found_and_functions_labels_and_numbers_are_not() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, consumer) (rate(a_seconds_bucket{x="y"}[5m])))'
    ) == {"a_seconds_bucket"}
    assert metric_names(
        '100 * sum(b_total) / clamp_min(sum without (pod) (c_total{d=~"$namespace"}), 1e-9)'
    ) == {"b_total", "c_total"}
    assert metric_names("x_total offset 5m and on (job) up == bool 1") == {"x_total", "up"}
    assert metric_names('label_values(m{ns=~"$namespace"}, workload)') == {"m"}
    assert metric_names("label_values(workload)") == set()


def test_the_dashboard_is_valid_json_grafana_provisions() -> None:
    board = dashboard()
    assert board["uid"] == "fracpilot"
    assert board["title"]
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert any(d["type"] == "prometheus" for d in datasources["datasources"])
    uids = {DATASOURCE}  # the variable, which picks any Prometheus data source
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        assert p["title"], p
        grid = p["gridPos"]
        assert grid["x"] >= 0, p["title"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p.get("description"), p["title"]
        assert p["datasource"]["uid"] in uids, p["title"]
        assert p["targets"], p["title"]
        for target in p["targets"]:
            assert target["expr"].strip(), p["title"]
            assert target["datasource"]["uid"] in uids, p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    for variable in board["templating"]["list"]:
        if variable["type"] != "datasource":
            assert variable["datasource"]["uid"] in uids
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "fracpilot.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in mounts


def test_a_datasource_variable_feeds_every_panel_query_and_variable() -> None:
    board = dashboard()
    variables = board["templating"]["list"]
    (source,) = [v for v in variables if v["type"] == "datasource"]
    assert source["name"] == "datasource"
    assert source["query"] == "prometheus"  # Grafana lists the Prometheus data sources
    assert variables[0] is source  # first: the query variables below read through it
    users = [p for p in board["panels"] if p["type"] != "row"]
    users += [t for p in board["panels"] for t in p.get("targets", [])]
    users += [v for v in variables if v["type"] == "query"]
    assert len(users) > 20
    for user in users:
        assert user["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, user
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert all("datasource" not in r for r in rows)


def counter_reads(expr: str) -> list[tuple[str, str | None]]:
    """(counter series, the function whose argument it is) for each counter series named in
    an expression: a name ending in ``_total`` or a histogram's ``_bucket``/``_sum``/``_count``.
    """
    reads = []
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for match in re.finditer(r"(?<![\w$.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        name = match.group(0)
        if not COUNTER_SERIES.search(name) or text[match.end() :].lstrip().startswith("("):
            continue
        depth, i = 0, match.start() - 1
        while i >= 0:  # back to the parenthesis the name is inside
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth < 0:
                break
            i -= 1
        words = re.findall(r"[a-zA-Z_]\w*\s*$", text[: max(i, 0)]) if i >= 0 else []
        reads.append((name, words[0].strip() if words else None))
    return reads


def test_counter_reads_finds_the_function_around_a_counter() -> None:
    assert counter_reads("sum(rate(a_total[5m]))") == [("a_total", "rate")]
    assert counter_reads("sum by (x) (a_total)") == [("a_total", None)]
    assert counter_reads("sum(a_total)") == [("a_total", "sum")]
    assert counter_reads(
        'histogram_quantile(0.9, sum by (le) (increase(b_seconds_bucket{x="a_total"}[1m])))'
    ) == [("b_seconds_bucket", "increase")]
    assert counter_reads("g_ratio > 1") == []


def test_every_counter_is_read_through_rate_or_increase() -> None:
    checked = 0
    for expr in expressions(dashboard()):
        if expr.startswith("label_values("):
            continue
        for name, function in counter_reads(expr):
            assert function in {"rate", "increase", "irate"}, f"{name} read raw in: {expr}"
            checked += 1
    assert checked >= 12


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    names = set().union(*(metric_names(e) for e in expressions(dashboard())))
    for wanted in (
        "fracpilot_workload_allocated_ratio",  # fractions against usage per workload
        "fracpilot_workload_compute_ratio",
        "fracpilot_workload_memory_ratio",
        "fracpilot_decision_decisions_total",  # decisions by reason
        "fracpilot_actuator_actions_total",  # actions by plan and outcome
        "fracpilot_gpu_saved_seconds_total",  # GPU time and money saved
        "fracpilot_cost_saved_usd_total",
        "fracpilot_dead_letters_total",  # dead letters
        "fracpilot_consumer_pending_messages",  # consumer lag
        "fracpilot_workload_recommended_ratio",  # held vs recommended vs used (issue 30)
        "fracpilot_workload_recommended_saving_ratio",  # what the recommendations would free
        "fracpilot_service_ready",  # not fracpilot_up: Prometheus' own `up` is the scrape's
    ):
        assert wanted in names, wanted


def test_held_recommended_and_used_share_one_panel() -> None:
    held = dashboard_panel("Held vs recommended")
    names = set().union(*(metric_names(t["expr"]) for t in held["targets"]))
    assert names == {
        "fracpilot_workload_allocated_ratio",
        "fracpilot_workload_recommended_ratio",
        "fracpilot_workload_compute_ratio",
        "fracpilot_workload_memory_ratio",
    }


def test_a_cluster_variable_filters_every_series_of_every_panel() -> None:
    """One dashboard for many clusters (a Thanos or Mimir, or external labels): every selector
    of a panel keeps to the clusters picked, and so do the namespace and workload lists."""
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["type"] == "query"
    assert cluster["includeAll"]
    assert cluster["allValue"] == ".*"
    order = [v["name"] for v in board["templating"]["list"]]
    assert order.index("cluster") < order.index("namespace") < order.index("workload")
    for name in ("namespace", "workload"):
        assert 'cluster=~"$cluster"' in variables[name]["query"]["query"]
    selectors = 0
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for match in re.finditer(r"\b[a-zA-Z_:][\w:]*(\{[^}]*\})?", target["expr"]):
                name, braces = match.group(0).split("{")[0], match.group(1)
                if name in metric_names(target["expr"]):
                    assert 'cluster=~"$cluster"' in (braces or ""), target["expr"]
                    selectors += 1
    assert selectors >= 25


# --- against the live services ----------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    stack = ComposeStack(tmp_path_factory.mktemp("compose-stack"))
    try:
        stack.start()
        asyncio.run(_flow(stack))
        yield stack
    finally:
        stack.stop()


async def _flow(stack: ComposeStack, within_s: float = 120.0) -> None:
    """Wait for applied actions, and send one message decision must dead-letter."""
    nc = await nats.connect(stack.nats_url)
    broken = WorkloadRef(namespace="inference", owner_name="broken")
    await nc.jetstream().publish(subjects.usage_subject(broken), b"{not json")
    await nc.close()
    deadline = time.monotonic() + within_s
    while True:
        results = [
            ActuationResult.model_validate_json(d)
            for _, d in await read_stream(stack.nats_url, subjects.ACTUATION_STREAM)
        ]
        dead = await read_stream(stack.nats_url, subjects.DEADLETTER_STREAM)
        if dead and any(r.outcome is Outcome.APPLIED for r in results):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no applied action or dead letter: {len(results)} results")
        await asyncio.sleep(1.0)


def exported(text: str) -> tuple[set[str], set[str]]:
    """(names declared by HELP/TYPE or a sample, names with at least one sample)."""
    declared: set[str] = set()
    with_series: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            declared |= {f"{family.name}{s}" for s in ("_bucket", "_sum", "_count")}
        elif family.type == "counter":
            declared.add(f"{family.name}_total")
        else:
            declared.add(family.name)
        for sample in family.samples:
            declared.add(sample.name)
            with_series.add(sample.name)
    return declared, with_series


def live_metrics(stack: ComposeStack) -> tuple[set[str], set[str]]:
    urls = [stack.url(s, 9090, "/metrics") for s in OUR_SERVICES]
    urls.append(stack.url("dcgm-exporter-simulator", 9400, "/metrics"))
    declared: set[str] = set()
    with_series: set[str] = set()
    for url in urls:
        d, w = exported(scrape(url))
        declared |= d
        with_series |= w
    return declared, with_series


def test_every_metric_of_the_dashboard_is_exported_by_a_service(stack: ComposeStack) -> None:
    names = set().union(*(metric_names(e) for e in expressions(dashboard())))
    declared, with_series = live_metrics(stack)
    assert names - declared == set(), "the dashboard names metrics no service exports"
    assert names - with_series <= FAULT_ONLY, "metrics without a series in a working pipeline"


def test_every_expression_runs_in_prometheus_and_returns_data(stack: ComposeStack) -> None:
    prometheus = stack.prometheus
    assert prometheus is not None
    for expr in expressions(dashboard()):
        if expr.startswith("label_values("):
            (name,) = metric_names(expr)
            series = prometheus.series(name)
            assert series, expr
            continue
        query = with_variables(expr)
        if metric_names(expr) <= FAULT_ONLY:
            prometheus.query(query)  # valid PromQL (a parse error raises); no data is right
            continue
        try:
            prometheus.wait_for_series(query, timeout=45)
        except PrometheusError as err:
            raise AssertionError(f"{expr}: {err}") from err
