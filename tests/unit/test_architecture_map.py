"""docs/architecture.md is a true map: every path it names exists, every package of the house
and every entry point is named in it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
SOURCE_ROOTS = [
    ROOT / "libs" / "src",
    ROOT / "services" / "ingest" / "src",
    ROOT / "services" / "decision" / "src",
    ROOT / "services" / "actuator" / "src",
    ROOT / "src",
]
PYPROJECTS = [
    ROOT / "pyproject.toml",
    ROOT / "libs" / "pyproject.toml",
    *(ROOT / "services" / s / "pyproject.toml" for s in ("ingest", "decision", "actuator")),
]
# A backticked repo path: starts at a top-level folder of the repository.
_TOP = ("libs/", "services/", "src/", "tests/", "docs/", "deploy/", "helm/", "bench/", "scripts/")


def _named_paths(text: str) -> list[str]:
    return [
        p.rstrip(".,:;")
        for p in re.findall(r"`([^`\s]+)`", text)
        if p.startswith(_TOP) and "<" not in p and "*" not in p
    ]


def _packages() -> list[str]:
    """Every package folder (one with an __init__.py) below the source roots, as a repo path."""
    found = []
    for root in SOURCE_ROOTS:
        for init in root.rglob("__init__.py"):
            found.append(init.parent.relative_to(ROOT).as_posix() + "/")
    return sorted(found)


def test_every_path_the_map_names_exists() -> None:
    paths = _named_paths(MAP.read_text())
    assert len(paths) > 30, "the map names too few paths: was the room table dropped?"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_is_named() -> None:
    text = MAP.read_text()
    named = set(_named_paths(text))
    unnamed = [p for p in _packages() if p not in named]
    assert not unnamed, f"packages docs/architecture.md does not name: {unnamed}"


def test_every_entry_point_is_named() -> None:
    text = MAP.read_text()
    scripts: dict[str, str] = {}
    for pyproject in PYPROJECTS:
        scripts |= tomllib.loads(pyproject.read_text()).get("project", {}).get("scripts", {})
    assert "fracpilot" in scripts
    unnamed = [
        f"{name} = {target}"
        for name, target in scripts.items()
        if f"`{name}`" not in text or f"`{target}`" not in text
    ]
    assert not unnamed, f"entry points docs/architecture.md does not name: {unnamed}"


def test_the_check_sees_a_missing_path() -> None:
    """The path check reads the same forms the map uses (so a wrong path could not pass)."""
    assert _named_paths("see `libs/src/nowhere.py`, and `services/x/<y>` and `fracpilot`") == [
        "libs/src/nowhere.py"
    ]
