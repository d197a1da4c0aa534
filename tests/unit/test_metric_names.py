"""Every Prometheus metric fracpilot registers is named by Prometheus's rules.

https://prometheus.io/docs/practices/naming/: one prefix (``fracpilot_``), snake case, base
units as the last word (``_seconds``, ``_bytes``; a ratio 0..1 is ``_ratio``, never percent or
a "fraction"/"share"), counters end in ``_total`` and nothing else does. The metrics are found
by reading the source (every ``Counter(`` / ``Gauge(`` / ``Histogram(`` / ``Summary(`` /
``Info(`` / ``Enum(`` call of prometheus_client in libs/, services/ and src/), so a metric added
anywhere is checked; a metric must be named by a string literal so that this test can read it.
The runbooks must name only metrics that exist.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "libs" / "src", *sorted((ROOT / "services").glob("*/src")), ROOT / "src"]
KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}

NAME = re.compile(r"^fracpilot_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
BASE_UNITS = {"seconds", "bytes", "ratio"}
# Words that say a unit Prometheus wants in its base unit instead (or a ratio as _ratio).
NOT_BASE_UNITS = {
    "percent", "percentage", "pct", "fraction", "share", "permille",
    "ms", "millis", "milliseconds", "us", "micros", "microseconds", "ns", "nanoseconds",
    "minute", "minutes", "mins", "hour", "hours", "hrs", "day", "days",
    "kb", "mb", "gb", "kib", "mib", "gib", "kilobytes", "megabytes", "gigabytes", "bits",
}  # fmt: skip


@dataclass(frozen=True)
class Registered:
    kind: str
    name: str
    where: str


def prometheus_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> prometheus_client class, for ``from prometheus_client import ...``."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client":
            for alias in node.names:
                if alias.name in KINDS:
                    found[alias.asname or alias.name] = alias.name
    return found


def registered_in(path: Path) -> list[Registered]:
    tree = ast.parse(path.read_text(), str(path))
    local = prometheus_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in local:
            kind = local[func.id]
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in KINDS
            and isinstance(func.value, ast.Name)
            and func.value.id in {"prometheus_client", "prom"}
        ):
            kind = func.attr
        else:
            continue
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
        first = node.args[0] if node.args else None
        if first is None:
            first = next((k.value for k in node.keywords if k.arg == "name"), None)
        message = f"{where}: name the metric with a string literal (this test reads it)"
        assert isinstance(first, ast.Constant), message
        assert isinstance(first.value, str), message
        found.append(Registered(kind, first.value, where))
    return found


def every_metric() -> list[Registered]:
    return [
        m for base in SOURCES for path in sorted(base.rglob("*.py")) for m in registered_in(path)
    ]


def naming_problems(kind: str, name: str) -> list[str]:
    """What breaks Prometheus's naming rules in one metric's name (empty: nothing)."""
    problems = []
    if not NAME.match(name):
        problems.append("not fracpilot_ followed by lower-case snake case")
    words = name.split("_")[1:]
    if kind == "Counter":
        if words[-1:] != ["total"]:
            problems.append("a counter ends in _total")
        words = words[:-1]
    elif "total" in words:
        problems.append("only a counter says _total")
    for word in words:
        if word in NOT_BASE_UNITS:
            problems.append(f"'{word}' is not a base unit (seconds, bytes, _ratio for 0..1)")
    for i, word in enumerate(words):
        if word in BASE_UNITS and i != len(words) - 1:
            problems.append(f"the unit '{word}' comes last (before _total on a counter)")
    if kind in {"Histogram", "Summary"} and (not words or words[-1] not in BASE_UNITS):
        problems.append("a histogram or summary ends with its unit (_seconds, _bytes, _ratio)")
    return problems


METRICS = every_metric()


def test_the_source_scan_finds_the_metrics_of_every_service() -> None:
    names = {m.name for m in METRICS}
    assert {
        "fracpilot_service_ready",  # libs telemetry
        "fracpilot_build_info",  # libs telemetry
        "fracpilot_bus_handle_seconds",  # libs bus
        "fracpilot_workload_allocated_ratio",  # ingest
        "fracpilot_decision_sample_lag_seconds",  # decision
        "fracpilot_webhook_admissions_total",  # actuator
    } <= names
    assert len(METRICS) >= 50


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: m.name)
def test_every_metric_is_named_by_the_rules(metric: Registered) -> None:
    assert naming_problems(metric.kind, metric.name) == [], metric.where


def test_no_name_is_registered_twice() -> None:
    seen: dict[str, str] = {}
    for m in METRICS:
        assert m.name not in seen, f"{m.name}: {seen.get(m.name)} and {m.where}"
        seen[m.name] = m.where


def test_the_rules_catch_what_they_should() -> None:
    assert naming_problems("Counter", "fracpilot_a_total") == []
    assert naming_problems("Gauge", "fracpilot_cpu_ratio") == []
    assert naming_problems("Counter", "fracpilot_gpu_saved_seconds_total") == []
    assert naming_problems("Counter", "fracpilot_requests")  # no _total
    assert naming_problems("Gauge", "fracpilot_items_total")  # a gauge with _total
    assert naming_problems("Gauge", "fracpilot_workload_memory_share")  # a ratio as share
    assert naming_problems("Gauge", "fracpilot_usage_percent")
    assert naming_problems("Histogram", "fracpilot_latency_ms")
    assert naming_problems("Counter", "fracpilot_gpu_hours_saved_total")
    assert naming_problems("Gauge", "fracpilot_seconds_behind")  # unit not last
    assert naming_problems("Histogram", "fracpilot_batch_size")  # no unit
    assert naming_problems("Gauge", "FracpilotUp")
    assert naming_problems("Gauge", "other_up")


def test_the_scan_refuses_a_name_it_cannot_read(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("from prometheus_client import Gauge\nname = 'x'\nGauge(name, 'doc')\n")
    with pytest.raises(AssertionError, match="string literal"):
        registered_in(module)


def test_the_runbooks_name_only_metrics_that_exist() -> None:
    suffixes = {"Counter": [""], "Histogram": ["_bucket", "_sum", "_count", ""]}
    exported = {m.name + s for m in METRICS for s in suffixes.get(m.kind, [""])}
    text = (ROOT / "docs" / "runbooks.md").read_text()
    named = set(re.findall(r"\bfracpilot_[a-z0-9_]*[a-z0-9]", text))
    assert named, "the runbooks name no metric"
    assert named <= exported, sorted(named - exported)
