"""helm/fracpilot rendered by the real helm (``helm template``, no cluster needed), for tests that
run a service with what the chart gives it. The helm binary is the cached build of
tests/k8s_control_plane.py (built once per machine when missing)."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from k8s_control_plane import REPO_ROOT, ensure_testbin

CHART = REPO_ROOT / "helm" / "fracpilot"

# ``helm install`` on a test session's shared apiserver: leave out the cluster-wide objects the
# chart makes once per cluster (the policy CRDs, the aggregated roles, the placeholders'
# PriorityClass), which other tests of that apiserver may have made already without this
# release's ownership (helm then refuses to install, even with --dry-run=client).
SHARED_CLUSTER_VALUES = (
    "--set=fractionPolicies.crds.install=false",
    "--set=fractionPolicies.roles=false",
    "--set=priorityClass.create=false",
)


def render(*args: str, namespace: str = "gpu-platform") -> list[dict[str, Any]]:
    helm = ensure_testbin() / "helm"
    proc = subprocess.run(
        [str(helm), "template", "fp", str(CHART), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"helm template failed: {proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def container_env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    """The literal ``env`` values of the component's Deployment (``valueFrom`` entries, which
    read Secrets and the pod's own fields, are left out)."""
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}
