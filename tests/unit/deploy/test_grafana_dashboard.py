"""The chart ships the Grafana dashboard as a ConfigMap for Grafana's dashboard sidecar.

The chart reads its copy, helm/fracpilot/files/fracpilot-dashboard.json (a chart must not reach
outside its folder): it must equal deploy/grafana/dashboards/fracpilot.json. Rendered with the
real helm (the cached build, tests/k8s_control_plane.py), the ConfigMap carries the sidecar's
label (grafana_dashboard: "1", the grafana chart's and kube-prometheus-stack's default) and the
dashboard byte for byte (helm does not template it: ``${datasource}`` and ``{{namespace}}``
reach Grafana); the values turn it off, move it and change its label.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s_control_plane import cached_bin_dir

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "fracpilot.json"
CHART = ROOT / "helm" / "fracpilot"
CHART_COPY = CHART / "files" / "fracpilot-dashboard.json"


def test_the_chart_ships_the_same_dashboard() -> None:
    """Keep them equal: cp deploy/grafana/dashboards/fracpilot.json
    helm/fracpilot/files/fracpilot-dashboard.json."""
    assert not CHART_COPY.is_symlink()
    assert CHART_COPY.read_bytes() == DASHBOARD.read_bytes()


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


def dashboards(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    ]


def test_the_configmap_holds_the_dashboard_labelled_for_the_sidecar() -> None:
    (config_map,) = dashboards(helm_template())
    meta = config_map["metadata"]
    assert meta["name"] == "fr-fracpilot-dashboard"
    assert meta["namespace"] == "apps"
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["labels"]["app.kubernetes.io/component"] == "metrics"
    assert "annotations" not in meta
    assert config_map["data"] == {"fracpilot.json": DASHBOARD.read_text().rstrip("\n")}


def test_the_values_move_relabel_annotate_or_drop_it() -> None:
    (config_map,) = dashboards(
        helm_template(
            "--set",
            "metrics.grafanaDashboard.namespace=monitoring",
            "--set",
            "metrics.grafanaDashboard.label=dashboards",
            "--set",
            "metrics.grafanaDashboard.labelValue=fracpilot",
            "--set",
            "metrics.grafanaDashboard.annotations.grafana_folder=GPU",
        )
    )
    meta = config_map["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["dashboards"] == "fracpilot"
    assert "grafana_dashboard" not in meta["labels"]
    assert meta["annotations"] == {"grafana_folder": "GPU"}
    assert dashboards(helm_template("--set", "metrics.grafanaDashboard.enabled=false")) == []
