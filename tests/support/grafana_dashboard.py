"""The Grafana dashboard (deploy/grafana/dashboards/fracpilot.json) as a test reads it: its
panels by title, and a panel's PromQL with Grafana's template variables filled in as the
dashboard's "All" would (tests/integration/test_dashboard_metrics.py runs every expression so in
Prometheus; tests/e2e/test_recommend_only_metrics.py reads panels' figures)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "fracpilot.json"
)
GRAFANA_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "cluster": ".*",  # All: matches series without the label too (a single Prometheus)
    "namespace": ".*",
    "workload": ".*",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel(title_prefix: str) -> dict[str, Any]:
    """The one panel whose title starts with ``title_prefix``."""
    found: list[dict[str, Any]] = [
        p for p in dashboard()["panels"] if p["title"].startswith(title_prefix)
    ]
    (one,) = found
    return one


def queries(title_prefix: str) -> dict[str, str]:
    """The panel's expressions by refId, with the template variables filled in."""
    return {t["refId"]: with_variables(t["expr"]) for t in panel(title_prefix)["targets"]}


def with_variables(expr: str) -> str:
    def one(match: re.Match[str]) -> str:
        return GRAFANA_VARIABLES[match.group(1) or match.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)
