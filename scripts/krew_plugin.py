"""Writes deploy/krew/fracpilot.yaml, the krew plugin manifest of ``kubectl fracpilot``, and
builds the archive it points at.

fracpilot is a Python package, so the archive holds no binary: ``kubectl-fracpilot``, a POSIX
launcher that runs this release's CLI through ``uvx`` (or ``pipx run``), pinned to the version.
The archive is reproducible (fixed file times, owner and gzip header), so its sha256 is known
from the repository alone: tests/unit/deploy/test_krew_manifest.py rebuilds it and fails when
the manifest's sha256 or version is stale. After a version change:

    .venv/bin/python scripts/krew_plugin.py                 # rewrite the manifest
    .venv/bin/python scripts/krew_plugin.py --archive DIR   # and write the archive (release)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "krew" / "fracpilot.yaml"
HOME = "https://github.com/fracpilot/fracpilot"


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def archive_name(release: str) -> str:
    return f"kubectl-fracpilot_v{release}.tar.gz"


def launcher(release: str) -> str:
    return f"""#!/bin/sh
# kubectl fracpilot {release}, installed by krew: runs the fracpilot CLI of this release.
set -e
if command -v uvx >/dev/null 2>&1; then
  exec uvx --from "fracpilot=={release}" kubectl-fracpilot "$@"
elif command -v pipx >/dev/null 2>&1; then
  exec pipx run --spec "fracpilot=={release}" kubectl-fracpilot "$@"
fi
echo "kubectl fracpilot needs uv (uvx) or pipx: https://docs.astral.sh/uv/" >&2
exit 127
"""


def archive(release: str) -> bytes:
    """The tar.gz krew downloads: the launcher and the licence, byte-for-byte reproducible."""
    files = {
        "kubectl-fracpilot": (launcher(release).encode(), 0o755),
        "LICENSE": ((ROOT / "LICENSE").read_bytes(), 0o644),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def manifest(release: str) -> str:
    sha256 = hashlib.sha256(archive(release)).hexdigest()
    uri = f"{HOME}/releases/download/v{release}/{archive_name(release)}"
    return f"""# The krew plugin manifest of `kubectl fracpilot` (a copy goes to krew-index as
# plugins/fracpilot.yaml). Written by scripts/krew_plugin.py: do not edit by hand.
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: fracpilot
spec:
  version: v{release}
  homepage: {HOME}
  shortDescription: Right-size fractional GPU workloads (KAI, HAMi)
  description: |
    Shows what fracpilot recommends for each GPU workload: the fraction it needs, its memory
    and compute peaks, what resizing would save and the cards packing would free
    (`kubectl fracpilot recommend` against your Prometheus, nothing installed), and, once
    fracpilot runs in the cluster, its decisions and their state (`kubectl fracpilot status`,
    `report`, `explain`, `policy`).
  caveats: |
    The plugin runs the fracpilot {release} Python package through uv (uvx) or pipx, one of
    which must be on PATH (Python 3.11 or later).
  platforms:
    - selector:
        matchExpressions:
          - key: os
            operator: In
            values: [linux, darwin]
      uri: {uri}
      sha256: {sha256}
      bin: kubectl-fracpilot
      files:
        - from: kubectl-fracpilot
          to: .
        - from: LICENSE
          to: .
"""


def main(argv: list[str]) -> int:
    release = version()
    MANIFEST.write_text(manifest(release))
    if argv[:1] == ["--archive"] and len(argv) == 2:
        out = Path(argv[1]) / archive_name(release)
        out.write_bytes(archive(release))
        sys.stdout.write(f"{out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
