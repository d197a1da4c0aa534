"""One version for the release: the CLI, every package of the workspace, the chart and the
images' labels say the same (the root pyproject.toml is the one to change; this test names
every other place that must follow)."""

from __future__ import annotations

import importlib.metadata
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fracpilot_cli import main
from support.dockerfile import parse

ROOT = Path(__file__).resolve().parents[2]
RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
MEMBERS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
DOCKERFILES = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))


def labels(path: Path) -> dict[str, str]:
    """The final stage's LABEL key="value" pairs."""
    found: dict[str, str] = {}
    for args in parse(path).final.all("LABEL"):
        for pair in shlex.split(args):
            key, sep, value = pair.partition("=")
            assert sep, f"LABEL in the legacy 'key value' form: {args!r}"
            found[key] = value
    return found


def test_the_release_is_a_semantic_version() -> None:
    parts = RELEASE.split(".")
    assert len(parts) == 3
    assert all(p.isdigit() for p in parts), RELEASE


@pytest.mark.parametrize("member", MEMBERS)
def test_every_workspace_member_has_the_release_version(member: str) -> None:
    project = tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]
    assert project["version"] == RELEASE, member
    assert importlib.metadata.version(project["name"]) == RELEASE, "re-run uv sync"


def test_the_chart_and_its_app_have_the_release_version() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "fracpilot" / "Chart.yaml").read_text())
    assert chart["version"] == RELEASE
    assert chart["appVersion"] == RELEASE  # the image tag when image.tag is empty


def test_the_krew_manifest_has_the_release_version() -> None:
    """krew's manifest (deploy/krew/fracpilot.yaml, scripts/krew_plugin.py writes it): krew's
    "v" + the release, in the version and in the archive's release URL."""
    manifest = yaml.safe_load((ROOT / "deploy" / "krew" / "fracpilot.yaml").read_text())
    assert manifest["spec"]["version"] == f"v{RELEASE}"
    for platform in manifest["spec"]["platforms"]:
        assert platform["uri"].endswith(f"/v{RELEASE}/kubectl-fracpilot_v{RELEASE}.tar.gz")


def test_every_image_is_labelled_with_the_release_version() -> None:
    assert len(DOCKERFILES) == 3
    for path in DOCKERFILES:
        assert labels(path)["org.opencontainers.image.version"] == RELEASE, path.name


def test_fracpilot_version_prints_the_release() -> None:
    result = CliRunner().invoke(main.app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"fracpilot {RELEASE}\n"
    assert main.version() == importlib.metadata.version("fracpilot") == RELEASE


def test_the_version_option_answers_before_any_command_runs() -> None:
    result = CliRunner().invoke(main.app, ["--version", "status"])
    assert result.exit_code == 0, result.output
    assert result.output == f"fracpilot {RELEASE}\n"


def test_the_chart_and_the_images_name_the_same_licence_and_source() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "fracpilot" / "Chart.yaml").read_text())
    license = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert chart["annotations"]["artifacthub.io/license"] == license
    for path in DOCKERFILES:
        image = labels(path)
        assert image["org.opencontainers.image.licenses"] == license, path.name
        assert image["org.opencontainers.image.source"] == chart["home"], path.name
    assert chart["sources"] == [chart["home"]]


def test_the_charts_image_list_names_the_images_it_deploys() -> None:
    """Artifact Hub's image list (Chart.yaml) follows the release and the NATS values."""
    chart = yaml.safe_load((ROOT / "helm" / "fracpilot" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm" / "fracpilot" / "values.yaml").read_text())
    listed = {
        i["name"]: i["image"] for i in yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    }
    registry = values["image"]["registry"]
    nats = values["nats"]["image"]
    assert listed == {
        **{
            f"fracpilot-{s}": f"{registry}/fracpilot-{s}:{RELEASE}"
            for s in ("ingest", "decision", "actuator")
        },
        "nats": f"{nats['repository']}:{nats['tag']}",
    }
