"""Safe defaults against a real kube-apiserver and NATS: recommend-only until a namespace opts in.

The actuator runs in-process (backend=kubernetes) with the chart's defaults for the opt-in rule
(read from ``helm template`` of the chart as installed with no values), on a namespace nobody
labelled: every decision is recorded as a recommendation saying why, nothing in the cluster
changes, and ``fracpilot status`` shows the recommendations with what they would save. Labelling
the namespace ``fracpilot.io/mode=auto`` later turns resizing on (the actuator watches the
namespaces); removing the label turns it back to recommendations.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import nats
import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from factories import decision
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_cli.main import app
from fracpilot_libs.contracts import (
    ActuationResult,
    FractionDecision,
    Outcome,
    PlanKind,
    Policy,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running, wait_for
from k8s_control_plane import REPO_ROOT, ControlPlane
from support import kube as objects
from support.operator_scenario import GPU_MODEL, WorkloadSpec, publish, record

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
MODE = "fracpilot.io/mode"
A100_USD_PER_HOUR = 3.40  # GPU_MODEL in the built-in price table
HOURS_PER_MONTH = 730


def chart_default_env(kube_cp: ControlPlane) -> dict[str, str]:
    """The actuator's FRACPILOT_OPTIN_* variables as ``helm template`` renders the defaults."""
    proc = subprocess.run(
        [str(kube_cp.helm), "template", "fracpilot", str(CHART), "--namespace", "fracpilot"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for doc in yaml.safe_load_all(proc.stdout):
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("actuator"):
            env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
            return {e["name"]: e["value"] for e in env if e["name"].startswith("FRACPILOT_OPTIN")}
    raise AssertionError("no actuator Deployment in the default render")


@pytest.fixture
def gpus(kube_admin: client.ApiClient, kube_namespace: str) -> dict[str, Any]:
    """A GPU node, KAI's reservation of its GPU, and Deployment chat with two pods at 0.5."""
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    ns = kube_namespace
    node = objects.gpu_node(core, f"gpu-{ns}", 1, {"fracpilot.io/test": ns})
    group, gpu = f"g1-{ns}", f"GPU-{uuid.uuid4()}"
    objects.kai_reservation(core, group, node, gpu)
    owner = objects.deployment(apps, ns, "chat")
    for i in range(2):
        objects.running_pod(
            core,
            ns,
            f"chat-{i}",
            node,
            labels={"app": "chat", objects.KAI_GROUP: group},
            annotations={"gpu-fraction": "0.5"},
            owner=owner,
        )
    return {"core": core, "ns": ns, "selector": f"fracpilot.io/test={ns}"}


def settings(nats_url: str, gpus: dict[str, Any], optin: dict[str, str]) -> ActuatorSettings:
    return ActuatorSettings(
        nats={"url": nats_url},
        backend="kubernetes",
        cluster="test",
        gpu_node_selector=gpus["selector"],
        namespace=gpus["ns"],  # the Lease lives in the test's namespace
        optin={
            "default_mode": optin["FRACPILOT_OPTIN_DEFAULT_MODE"],
            "excluded_namespaces": json.loads(optin["FRACPILOT_OPTIN_EXCLUDED_NAMESPACES"]),
        },
    )


def fractions(gpus: dict[str, Any]) -> list[str]:
    core: client.CoreV1Api = gpus["core"]
    pods = core.list_namespaced_pod(gpus["ns"], label_selector="app=chat").items
    return sorted(p.metadata.annotations["gpu-fraction"] for p in pods)


async def answer(nats_url: str, made: FractionDecision) -> ActuationResult:
    """Publish the decision and wait for the actuator's result."""
    nc = await nats.connect(nats_url)
    await nc.jetstream().publish(subjects.decision_subject(made.workload), made.to_json())
    await nc.close()
    found: list[ActuationResult] = []

    async def arrived() -> bool:
        found[:] = [
            r
            for _, data in await read_stream(nats_url, subjects.ACTUATION_STREAM)
            if (r := ActuationResult.model_validate_json(data)).decision_id == made.decision_id
        ]
        return bool(found)

    deadline = asyncio.get_running_loop().time() + 30
    while not await arrived():
        assert asyncio.get_running_loop().time() < deadline, "no result"
        await asyncio.sleep(0.1)
    return found[0]


def decide(ns: str, current: float, new: float) -> FractionDecision:
    wl = WorkloadRef(cluster="test", namespace=ns, owner_name="chat")
    return decision(
        current=current,
        new=new,
        name="chat",
        workload=wl,
        decision_id=f"d-{uuid.uuid4().hex[:12]}",
        decided_at=utcnow(),
        pod="chat-0",
    )


def held_back(service: ActuatorService, reason: str) -> float:
    value = service.runtime.registry.get_sample_value(
        "fracpilot_actuator_held_back_total", {"reason": reason}
    )
    return value or 0.0


async def test_recommend_only_until_the_namespace_is_labelled_and_again_once_unlabelled(
    nats_url: str, kube: ControlPlane, kube_admin: client.ApiClient, gpus: dict[str, Any]
) -> None:
    optin = chart_default_env(kube)
    assert optin["FRACPILOT_OPTIN_DEFAULT_MODE"] == "recommend"  # the chart's default
    ns, core = gpus["ns"], gpus["core"]
    await reset_nats(nats_url)
    service = ActuatorService(settings(nats_url, gpus, optin), kube_api=kube_admin)
    async with running(service):
        # A fresh install: a recommendation saying why, nothing touched.
        first = await answer(nats_url, decide(ns, 0.5, 0.25))
        assert (first.plan, first.outcome) == (PlanKind.IN_PLACE, Outcome.DRY_RUN), first.detail
        assert first.detail.startswith(
            f"not opted in: namespace {ns} has no label fracpilot.io/mode=auto: would in_place"
        )
        assert first.fraction_after == 0.5
        assert fractions(gpus) == ["0.5", "0.5"]
        assert held_back(service, "not_opted_in") == 1

        # kubectl label namespace <ns> fracpilot.io/mode=auto: the next decision is applied.
        objects.label_namespace(core, ns, {MODE: "auto"})
        namespaces = service.namespaces
        assert namespaces is not None
        await wait_for(lambda: (namespaces.cached(ns) or {}).get(MODE) == "auto", timeout=10)
        second = await answer(nats_url, decide(ns, 0.5, 0.25))
        assert (second.plan, second.outcome) == (PlanKind.IN_PLACE, Outcome.APPLIED), second.detail
        assert fractions(gpus) == ["0.25", "0.25"]

        # The label removed: back to recommendations.
        objects.label_namespace(core, ns, {MODE: None})
        await wait_for(lambda: MODE not in (namespaces.cached(ns) or {MODE: ""}), timeout=10)
        third = await answer(nats_url, decide(ns, 0.25, 0.5))
        assert third.outcome is Outcome.DRY_RUN, third.detail
        assert third.detail.startswith("not opted in:")
        assert fractions(gpus) == ["0.25", "0.25"]
        assert held_back(service, "not_opted_in") == 2


async def test_status_shows_recommendations_and_their_savings_before_anything_is_touched(
    nats_url: str, kube: ControlPlane, kube_admin: client.ApiClient, gpus: dict[str, Any]
) -> None:
    """The decision engine's real decisions for an idle workload (recorded: three hours at 10%
    of a GPU, held at half a GPU), published in auto policy mode; the actuator with the chart's
    defaults answers each with a recommendation; `fracpilot status` shows them and what they
    would save."""
    ns = gpus["ns"]
    await reset_nats(nats_url)
    idle = WorkloadSpec(
        "chat", ns, initial=0.5, minutes=180, usage=lambda _m: (0.1, 0.1), answer=lambda _n, _d: []
    )
    rec = record([idle], Policy())
    assert rec.decisions, "the engine made no decision on the recording"
    assert all(d.new_fraction < 0.5 for d in rec.decisions)
    service = ActuatorService(
        settings(nats_url, gpus, chart_default_env(kube)), kube_api=kube_admin
    )
    async with running(service):
        await publish(nats_url, rec)

        async def all_answered() -> bool:
            stored = await read_stream(nats_url, subjects.ACTUATION_STREAM)
            return len(stored) >= len(rec.decisions)

        deadline = asyncio.get_running_loop().time() + 30
        while not await all_answered():
            assert asyncio.get_running_loop().time() < deadline, "not every decision answered"
            await asyncio.sleep(0.1)
    assert fractions(gpus) == ["0.5", "0.5"]  # nothing touched

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["status", "-o", "json"],
        env={"FRACPILOT_NATS_URL": nats_url, "COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["items"]
    assert (row["namespace"], row["workload"]) == (ns, "chat")
    assert row["last_outcome"] == "dry_run"
    assert row["fraction"] == 0.5
    assert row["gpu_model"] == GPU_MODEL
    assert row["target"] < 0.5
    expected = (0.5 - row["target"]) * A100_USD_PER_HOUR * HOURS_PER_MONTH
    assert row["would_save_usd_month"] == pytest.approx(expected, abs=0.01)
    assert row["would_save_usd_month"] > 0

    table = await asyncio.to_thread(
        CliRunner().invoke, app, ["status"], env={"FRACPILOT_NATS_URL": nats_url, "COLUMNS": "250"}
    )
    assert table.exit_code == 0, table.output
    header, line = table.stdout.splitlines()[:2]
    assert "WOULD-SAVE" in header.split()
    assert line.split()[-1] == f"${expected:,.0f}"
    assert "dry_run" in line
    # the totals line (the actuator's consolidation footer, in recommend mode, may follow it)
    totals = [line for line in table.stdout.splitlines() if "/month more with" in line]
    assert len(totals) == 1
    assert totals[0].endswith(f"${expected:,.0f}/month more with the targets applied")
