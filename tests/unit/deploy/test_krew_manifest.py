"""deploy/krew/fracpilot.yaml, the krew plugin manifest of ``kubectl fracpilot``: valid as krew
validates a manifest, and pointing at the archive scripts/krew_plugin.py builds (its sha256).
Its version is the release's: tests/unit/test_version.py.

The checker is krew's own rules, written from kubernetes-sigs/krew:
- internal/index/validation/validate.go @ 65de93ccbe5764fed2fbe7c4b61ed33ef2dba0db
  (ValidatePlugin, validatePlatform, validateFiles, validateSelector, IsSafePluginName);
- pkg/constants/constants.go @ 1269a298f0896f544a3cdc06166b8f2a177b50c6 (apiVersion, kind);
- internal/installation/semver/version.go @ bf6e29d2c6e281c54549b2aa1885f7cd01653824 (a version
  is "v" + a semantic version, k8s.io/apimachinery's ParseSemantic);
- pkg/index/types.go @ 0a63f98b7e069c8257c684c7bb8729897be3d50c (the fields; an unknown one is
  refused here, so a typo such as ``shortDescripton`` cannot pass as an empty description).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MANIFEST_PATH = ROOT / "deploy" / "krew" / "fracpilot.yaml"
RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
PLUGIN_KIND = "Plugin"
SAFE_NAME = re.compile(r"^[\w-]+$")
WINDOWS_FORBIDDEN = {"CON", "PRN", "AUX", "NUL"} | {f"COM{i}" for i in range(1, 10)}
WINDOWS_FORBIDDEN |= {f"LPT{i}" for i in range(1, 10)}
SHA256 = re.compile(r"^[a-f0-9]{64}$")
# k8s.io/apimachinery/pkg/util/version ParseSemantic: MAJOR.MINOR.PATCH[-pre][+build].
SEMANTIC = re.compile(
    r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
)
FIELDS = {
    "plugin": {"apiVersion", "kind", "metadata", "spec"},
    "spec": {"version", "shortDescription", "description", "caveats", "homepage", "platforms"},
    "platform": {"uri", "sha256", "selector", "files", "license", "bin"},
    "file": {"from", "to"},
    "selector": {"matchLabels", "matchExpressions"},
}


class InvalidManifestError(ValueError):
    pass


def _only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    if unknown := set(obj) - allowed:
        raise InvalidManifestError(f"{where}: unknown field(s) {sorted(unknown)}")


def validate_plugin(name: str, plugin: dict[str, Any]) -> None:
    """krew's ValidatePlugin; raises InvalidManifestError with krew's reason."""
    _only(plugin, FIELDS["plugin"], "plugin")
    if plugin.get("apiVersion") != API_VERSION:
        raise InvalidManifestError(f"plugin manifest has apiVersion={plugin.get('apiVersion')!r}")
    if plugin.get("kind") != PLUGIN_KIND:
        raise InvalidManifestError(f"plugin manifest has kind={plugin.get('kind')!r}")
    if not SAFE_NAME.match(name) or name.upper() in WINDOWS_FORBIDDEN:
        raise InvalidManifestError(f"the plugin name {name!r} is not allowed")
    if (plugin.get("metadata") or {}).get("name") != name:
        raise InvalidManifestError(f"plugin should be named {name!r}")
    spec = plugin.get("spec") or {}
    _only(spec, FIELDS["spec"], "spec")
    short = spec.get("shortDescription") or ""
    if not short:
        raise InvalidManifestError("should have a short description")
    if "\r" in short or "\n" in short:
        raise InvalidManifestError("should not have line breaks in short description")
    if not spec.get("platforms"):
        raise InvalidManifestError("should have a platform specified")
    if not spec.get("version"):
        raise InvalidManifestError("should have a version specified")
    if not SEMANTIC.match(str(spec["version"])):
        raise InvalidManifestError(f"failed to parse plugin version {spec['version']!r}")
    for platform in spec["platforms"]:
        validate_platform(platform)


def validate_platform(platform: dict[str, Any]) -> None:
    _only(platform, FIELDS["platform"], "platform")
    if not platform.get("uri"):
        raise InvalidManifestError("`uri` has to be set")
    if not platform.get("sha256"):
        raise InvalidManifestError("`sha256` sum has to be set")
    if not SHA256.match(str(platform["sha256"])):
        raise InvalidManifestError(f"`sha256` value {platform['sha256']} is not valid")
    if not platform.get("bin"):
        raise InvalidManifestError("`bin` has to be set")
    files = platform.get("files")
    if files is not None:
        if len(files) == 0:
            raise InvalidManifestError("`files` has to be unspecified or non-empty")
        for op in files:
            _only(op, FIELDS["file"], "files")
            if not op.get("from"):
                raise InvalidManifestError("`from` field has to be set")
            if not op.get("to"):
                raise InvalidManifestError("`to` field has to be set")
    validate_selector(platform.get("selector"))


def validate_selector(selector: dict[str, Any] | None) -> None:
    if selector is None:
        raise InvalidManifestError("nil selector is not supported")
    _only(selector, FIELDS["selector"], "selector")
    labels, expressions = selector.get("matchLabels"), selector.get("matchExpressions")
    if labels is None and not expressions:
        raise InvalidManifestError("empty selector is not supported")
    keys = list(labels or {}) + [e.get("key") for e in expressions or []]
    for key in keys:
        if key not in ("os", "arch"):
            raise InvalidManifestError(f"key {key!r} not supported")
    if labels is not None and len(labels) == 0:
        raise InvalidManifestError("`matchLabels` specified but empty")
    if expressions is not None and len(expressions) == 0:
        raise InvalidManifestError("`matchExpressions` specified but empty")


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "krew_plugin", ROOT / "scripts" / "krew_plugin.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["krew_plugin"] = module
    spec.loader.exec_module(module)
    return module


MANIFEST: dict[str, Any] = yaml.safe_load(MANIFEST_PATH.read_text())


def test_the_manifest_is_valid_as_krew_validates_it() -> None:
    validate_plugin("fracpilot", MANIFEST)
    (platform,) = MANIFEST["spec"]["platforms"]
    expressions = platform["selector"]["matchExpressions"]
    assert expressions == [{"key": "os", "operator": "In", "values": ["linux", "darwin"]}]
    assert platform["bin"] == "kubectl-fracpilot"


def test_the_manifest_is_what_the_script_writes_with_the_archives_sha256() -> None:
    builder = _builder()
    assert MANIFEST_PATH.read_text() == builder.manifest(RELEASE), "run scripts/krew_plugin.py"
    archive = builder.archive(RELEASE)
    assert archive == builder.archive(RELEASE)  # reproducible: the sha256 is known in advance
    (platform,) = MANIFEST["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        launcher = tar.extractfile("kubectl-fracpilot")
        assert launcher is not None
        text = launcher.read().decode()
        mode = tar.getmember("kubectl-fracpilot").mode
    # Every file krew copies is in the archive, and bin is executable.
    assert {op["from"] for op in platform["files"]} <= set(names)
    assert mode & 0o111
    assert f'"fracpilot=={RELEASE}"' in text


def test_the_launcher_says_what_it_needs_when_neither_uvx_nor_pipx_is_there(
    tmp_path: Path,
) -> None:
    with tarfile.open(fileobj=io.BytesIO(_builder().archive(RELEASE))) as tar:
        tar.extractall(tmp_path, filter="data")
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = subprocess.run(
        ["/bin/sh", str(tmp_path / "kubectl-fracpilot"), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(empty)},
        check=False,
    )
    assert proc.returncode == 127
    assert "needs uv (uvx) or pipx" in proc.stderr


def broken(path: str, value: Any) -> dict[str, Any]:
    """The manifest with one value changed (None: removed); path like spec.platforms.0.bin."""
    plugin = copy.deepcopy(MANIFEST)
    *parents, leaf = path.split(".")
    node: Any = plugin
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return plugin


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("apiVersion", "krew.googlecontainertools.github.com/v1alpha1", "apiVersion="),
        ("kind", "Plugins", "kind="),
        ("metadata.name", "other", "plugin should be named"),
        ("spec.shortDescription", None, "should have a short description"),
        ("spec.shortDescription", "two\nlines", "line breaks"),
        ("spec.platforms", [], "should have a platform specified"),
        ("spec.version", None, "should have a version specified"),
        ("spec.version", RELEASE, "failed to parse plugin version"),  # no leading v
        ("spec.shortDescripton", "typo", "unknown field"),
        ("spec.platforms.0.uri", None, "`uri` has to be set"),
        ("spec.platforms.0.sha256", None, "`sha256` sum has to be set"),
        ("spec.platforms.0.sha256", "A" * 64, "is not valid"),
        ("spec.platforms.0.sha256", "a" * 63, "is not valid"),
        ("spec.platforms.0.bin", None, "`bin` has to be set"),
        ("spec.platforms.0.files", [], "`files` has to be unspecified or non-empty"),
        ("spec.platforms.0.files", [{"from": "x"}], "`to` field has to be set"),
        ("spec.platforms.0.selector", None, "nil selector is not supported"),
        ("spec.platforms.0.selector", {}, "empty selector is not supported"),
        ("spec.platforms.0.selector", {"matchLabels": {"distro": "x"}}, "not supported"),
        (
            "spec.platforms.0.selector",
            {"matchLabels": {}, "matchExpressions": [{"key": "os"}]},
            "`matchLabels` specified but empty",
        ),
    ],
)
def test_the_checker_refuses_what_krew_refuses(path: str, value: Any, reason: str) -> None:
    with pytest.raises(InvalidManifestError, match=re.escape(reason)):
        validate_plugin("fracpilot", broken(path, value))


@pytest.mark.parametrize("name", ["frac.pilot", "con", "a b"])
def test_the_checker_refuses_unsafe_plugin_names(name: str) -> None:
    with pytest.raises(InvalidManifestError, match="is not allowed"):
        validate_plugin(name, broken("metadata.name", name))
