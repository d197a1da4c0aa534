"""The chart stands alone: no link out of it, its copies equal their sources, its README is
what scripts/chart_readme.py writes from values.yaml (``make chart-sync`` fixes all three)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "fracpilot"


def _chart_readme() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "chart_readme", ROOT / "scripts" / "chart_readme.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_readme"] = module
    spec.loader.exec_module(module)
    return module


def test_no_link_leads_out_of_the_chart() -> None:
    links = [p.relative_to(CHART) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == []


def test_the_rbac_copies_equal_deploy_rbac() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "deploy" / "rbac").glob("*.yaml")}
    copy = {p.name: p.read_bytes() for p in (CHART / "files" / "rbac").glob("*.yaml")}
    assert source, "deploy/rbac has no files"
    assert copy.keys() == source.keys(), "run make chart-sync"
    stale = [name for name in source if copy[name] != source[name]]
    assert stale == [], f"stale copies in the chart (run make chart-sync): {stale}"


def test_the_nats_permissions_are_deploy_nats_permissions() -> None:
    """One source: the chart's built-in NATS includes the very lists deploy/nats/ documents and
    tests/integration/test_nats_auth.py proves (the chart renders the copy into its ConfigMap:
    tests/integration/k8s/test_helm_nats_auth.py runs it)."""
    source = (ROOT / "deploy" / "nats" / "permissions.conf").read_bytes()
    copy = (CHART / "files" / "nats" / "permissions.conf").read_bytes()
    assert copy == source, "stale copy of deploy/nats/permissions.conf (run make chart-sync)"


def test_the_chart_readme_is_generated_from_the_values() -> None:
    readme = _chart_readme()
    expected = readme.render(
        (CHART / "Chart.yaml").read_text(), (CHART / "values.yaml").read_text()
    )
    assert (CHART / "README.md").read_text() == expected, "run make chart-readme"


def test_documented_keys_follow_the_helm_docs_comments() -> None:
    readme = _chart_readme()
    text = """# A section heading, not a value's description.
top:
  # -- Lower bound,
  # in seconds.
  low: 1
  # plain comment
  high: 2

# -- A map.
other:
  # -- Nested.
  inner:
    leaf: x
"""
    assert readme.documented_keys(text) == {
        "top.low": "Lower bound, in seconds.",
        "other": "A map.",
        "other.inner": "Nested.",
    }
    table = readme.render("name: c\nversion: 1.0.0\nappVersion: '1'\ndescription: d\n", text)
    assert "| `top.low` | number | `1` | Lower bound, in seconds. |" in table
    assert "| `top.high` | number | `2` |  |" in table
    assert '| `other.inner.leaf` | string | `"x"` |  |' in table
