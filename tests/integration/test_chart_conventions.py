"""The chart's conventional values, rendered by the real helm (the cached build, as
tests/integration/k8s/test_helm_chart.py finds it): what each changes in the objects.

- ``global.imageRegistry`` replaces the registry of every image the release pulls: the three
  services, the hook Jobs, the helm test pods, NATS and its exporter, and the placeholder pods'
  image the actuator is told;
- ``<component>.serviceAccount.create: false`` makes no ServiceAccount, runs the pods as
  ``name`` and binds the component's RBAC to that name;
- ``topologySpreadConstraints`` reach each pod template as given;
- the decision Deployment rolls one pod at a time (replicas share partitions by leases);
- ``policy:`` takes what ``fracpilot policy get`` prints (against a real decision service, as
  JSON and as YAML), and the decision service reads back that policy.

The apiserver accepting these objects (ci/all-on-values.yaml and ci/builtin-nats-values.yaml set
them) is tests/integration/k8s/test_helm_chart.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fracpilot_cli.main import app
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.contracts import MemoryHeadroom, MemoryHeadroomMode, Mode, Policy
from fracpilot_libs.sizing.policies import cluster_default
from helpers import reset_nats, running
from k8s_control_plane import cached_bin_dir

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "helm" / "fracpilot"

COMPONENTS = ("ingest", "decision", "actuator")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = cached_bin_dir() / "helm"
    assert binary.is_file(), f"no helm at {binary}: scripts/k8s-testbin.sh builds it"
    return subprocess.run(
        [str(binary), "template", "fr", str(CHART), "--namespace", "apps", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def helm_template(*args: str) -> list[dict[str, Any]]:
    proc = helm(*args)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec the release makes: ``Kind/name`` and the spec."""
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc["kind"] == "Pod":
            yield f"Pod/{doc['metadata']['name']}", spec
        elif "template" in spec:
            yield f"{doc['kind']}/{doc['metadata']['name']}", spec["template"]["spec"]


def images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """``Kind/name/container`` -> image, over every container of every pod spec."""
    found = {}
    for where, spec in pod_specs(docs):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            found[f"{where}/{container['name']}"] = container["image"]
    return found


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def env_of(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    spec = find(docs, "Deployment", f"fr-fracpilot-{component}")["spec"]["template"]["spec"]
    return {e["name"]: e.get("value", "") for e in spec["containers"][0]["env"]}


# --- global.imageRegistry -------------------------------------------------------------------

# Hook Jobs (secretGeneration job) and the helm test pods (tests.enabled, the default) too.
EVERY_IMAGE = (
    "--set",
    "secretGeneration=job,nats.metrics.enabled=true,nats.reloader.enabled=true",
)


def test_global_image_registry_replaces_the_registry_of_every_image() -> None:
    own = images(helm_template(*EVERY_IMAGE))
    mirrored_docs = helm_template(*EVERY_IMAGE, "--set", "global.imageRegistry=mirror.corp:5000")
    mirrored = images(mirrored_docs)
    assert own.keys() == mirrored.keys()
    # Each kind of image the release pulls is here: services, hooks, tests, NATS, exporter.
    kinds = {key.split("/")[0] for key in own}
    assert kinds >= {"Deployment", "StatefulSet", "Job", "Pod"}, kinds
    assert any(i.startswith("nats:") for i in own.values())
    assert any(i.startswith("natsio/prometheus-nats-exporter:") for i in own.values())
    assert any(i.startswith("natsio/nats-server-config-reloader:") for i in own.values())
    expected_paths = {
        "ghcr.io/fracpilot/": "fracpilot/",  # a registry host: replaced
        "nats:": "nats:",  # Docker Hub, no host: the path as written
        "natsio/": "natsio/",
    }
    for key, image in own.items():
        (prefix,) = [p for p in expected_paths if image.startswith(p)]
        assert mirrored[key] == "mirror.corp:5000/" + expected_paths[prefix] + image.removeprefix(
            prefix
        ), key
    # The actuator's placeholder pods pull through the mirror too.
    assert env_of(mirrored_docs, "actuator")["FRACPILOT_PLACEHOLDER_IMAGE"] == (
        "mirror.corp:5000/pause:3.10"
    )
    assert env_of(helm_template(), "actuator")["FRACPILOT_PLACEHOLDER_IMAGE"] == (
        "registry.k8s.io/pause:3.10"
    )


def test_global_image_registry_keeps_a_pinned_digest() -> None:
    digest = "sha256:" + "a" * 64
    docs = helm_template(
        "--set", f"global.imageRegistry=mirror.corp/team,decision.image.digest={digest}"
    )
    spec = find(docs, "Deployment", "fr-fracpilot-decision")["spec"]["template"]["spec"]
    assert spec["containers"][0]["image"] == (
        f"mirror.corp/team/fracpilot/fracpilot-decision:0.1.0@{digest}"
    )


# --- serviceAccount.create / name -----------------------------------------------------------


def test_service_accounts_are_the_charts_by_default() -> None:
    docs = helm_template()
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for component in COMPONENTS:
        name = f"fr-fracpilot-{component}"
        assert name in accounts
        spec = find(docs, "Deployment", name)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == name
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = find(docs, kind, "fr-fracpilot-actuator")
        assert binding["subjects"][0]["name"] == "fr-fracpilot-actuator"


@pytest.mark.parametrize("component", ["actuator", "ingest", "decision"])
def test_a_service_account_of_yours_is_used_and_bound(component: str) -> None:
    docs = helm_template(
        "--set",
        f"{component}.serviceAccount.create=false,{component}.serviceAccount.name=platform-sa",
    )
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert f"fr-fracpilot-{component}" not in accounts
    assert "platform-sa" not in accounts  # yours: the chart does not make it
    others = [c for c in COMPONENTS if c != component]
    assert {f"fr-fracpilot-{c}" for c in others} <= accounts
    deployment = find(docs, "Deployment", f"fr-fracpilot-{component}")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "platform-sa"
    # Whether a token is mounted stays the chart's call, whatever your ServiceAccount says.
    assert spec["automountServiceAccountToken"] is (component != "decision")
    bindings = [
        d
        for d in docs
        if d["kind"] in {"ClusterRoleBinding", "RoleBinding"}
        and d["metadata"]["name"] == f"fr-fracpilot-{component}"
    ]
    assert len(bindings) == {"actuator": 2, "ingest": 1, "decision": 0}[component]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "platform-sa", "namespace": "apps"}
        ]


def test_a_named_service_account_the_chart_makes() -> None:
    docs = helm_template(
        "--set",
        "actuator.serviceAccount.name=resizer,serviceAccount.annotations.shared=a",
        "--set",
        "actuator.serviceAccount.annotations.own=b",
    )
    account = find(docs, "ServiceAccount", "resizer")
    assert account["metadata"]["annotations"] == {"shared": "a", "own": "b"}
    assert account["automountServiceAccountToken"] is True
    spec = find(docs, "Deployment", "fr-fracpilot-actuator")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "resizer"
    assert find(docs, "ClusterRoleBinding", "fr-fracpilot-actuator")["subjects"][0]["name"] == (
        "resizer"
    )


# --- topologySpreadConstraints --------------------------------------------------------------


def test_topology_spread_constraints_reach_each_pod_template_as_given() -> None:
    default = helm_template()
    assert all("topologySpreadConstraints" not in s for _, s in pod_specs(default))
    constraint = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "gpu"}},
        "matchLabelKeys": ["pod-template-hash"],
    }
    values = {c: {"topologySpreadConstraints": [constraint]} for c in (*COMPONENTS, "nats")}
    docs = helm_template("--set-json", f"ingest={json.dumps(values['ingest'])}",
                         "--set-json", f"decision={json.dumps(values['decision'])}",
                         "--set-json", f"actuator={json.dumps(values['actuator'])}",
                         "--set-json", f"nats={json.dumps(values['nats'])}")  # fmt: skip
    for component in COMPONENTS:
        spec = find(docs, "Deployment", f"fr-fracpilot-{component}")["spec"]["template"]["spec"]
        assert spec["topologySpreadConstraints"] == [constraint], component
        assert "affinity" in spec or component != "actuator"  # beside the default anti-affinity
    nats = find(docs, "StatefulSet", "fr-fracpilot-nats")["spec"]["template"]["spec"]
    assert nats["topologySpreadConstraints"] == [constraint]
    assert "podAntiAffinity" in nats["affinity"]


# --- the decision Deployment's update -------------------------------------------------------


def test_the_decision_deployment_rolls_one_pod_at_a_time() -> None:
    """Partitions move between replicas by leases, handed over checkpointed: a surge pod joins
    before an old one leaves, and decisions never stop (Recreate would stop them all)."""
    for args in ((), ("--set", "decision.replicas=3")):
        docs = helm_template(*args)
        strategy = find(docs, "Deployment", "fr-fracpilot-decision")["spec"]["strategy"]
        assert strategy == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
        }


# --- policy: what `fracpilot policy get` prints ---------------------------------------------


@pytest.fixture
async def decision(nats_url: str) -> AsyncIterator[DecisionService]:
    await reset_nats(nats_url)
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as svc:
        yield svc


async def fracpilot(url: str, *args: str, stdin: str | None = None) -> str:
    result = await asyncio.to_thread(
        CliRunner().invoke, app, list(args), input=stdin, env={"FRACPILOT_NATS_URL": url}
    )
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.usefixtures("decision")
async def test_policy_takes_what_policy_get_prints(nats_url: str, tmp_path: Path) -> None:
    stored = Policy(
        mode=Mode.RECOMMEND,
        max_fraction=0.5,
        memory_headroom=MemoryHeadroom(mode=MemoryHeadroomMode.LEARNED, factor=2.0),
        resize_budget_per_day=12,
    )
    await fracpilot(nats_url, "policy", "set", "-", stdin=stored.model_dump_json())
    for output in ("json", "yaml"):
        printed = await fracpilot(nats_url, "policy", "get", "-o", output)
        # Pasted under `policy:` as it is (indented), as a platform engineer would.
        values = tmp_path / f"policy-{output}.yaml"
        indented = "".join(f"  {line}\n" for line in printed.splitlines())
        values.write_text(f"policy:\n{indented}")
        got = yaml.safe_load(values.read_text())["policy"]
        assert got["revision"] == 1, got
        assert got["scope"]["level"] == "cluster", got
        docs = await asyncio.to_thread(helm_template, "--values", str(values))  # schema-checked
        policy = cluster_default(env_of(docs, "decision")["FRACPILOT_POLICY_JSON"])
        # The store's revision is not the chart's: the default starts at 0.
        assert policy == stored, output


def test_a_namespace_policy_is_not_the_cluster_default(tmp_path: Path) -> None:
    values = tmp_path / "namespace.yaml"
    values.write_text(
        yaml.safe_dump({"policy": {"scope": {"level": "namespace", "namespace": "team-a"}}})
    )
    proc = helm("--values", str(values))
    assert proc.returncode != 0
    assert "at '/policy/scope/level': value must be 'cluster'" in proc.stderr, proc.stderr
