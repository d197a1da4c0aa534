"""The chart's safe defaults, rendered by the real helm: recommend-only and opt-in.

One value (``optIn.defaultMode``) drives both the actuator (``FRACPILOT_OPTIN_*``) and the
webhook's selectors; the rendered selectors are exactly
:func:`fracpilot_actuator.opt_in.webhook_selectors` of the same value, so the apiserver sends
the webhook the pods the actuator would resize. The NOTES say how to turn on auto mode for one
namespace and how to see the recommendations.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracpilot_actuator.opt_in import webhook_selectors
from fracpilot_actuator.settings import ActuatorSettings
from k8s_control_plane import REPO_ROOT, ControlPlane
from support.chart_render import SHARED_CLUSTER_VALUES

pytestmark = pytest.mark.integration

CHART = REPO_ROOT / "helm" / "fracpilot"
RELEASE_NS = "gpu-platform"


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(helm), "template", "fp", str(CHART), "--namespace", RELEASE_NS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def webhooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    hooks: list[dict[str, Any]] = config["webhooks"]
    return hooks


def actuator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "actuator"
    ]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e.get("value", "") for e in env}


@pytest.fixture(scope="module")
def helm(kube: ControlPlane) -> Path:
    return kube.helm


@pytest.mark.parametrize(
    ("args", "mode", "excluded"),
    [
        ((), "recommend", ["gpu-platform", "kube-system"]),
        (
            ("--values", str(CHART / "ci" / "all-on-values.yaml")),
            "auto",
            ["gpu-operator", "gpu-platform", "kube-public", "kube-system"],
        ),
        (("--set", "optIn.defaultMode=auto"), "auto", ["gpu-platform", "kube-system"]),
    ],
    ids=["defaults", "all-on", "set-auto"],
)
def test_the_webhook_selects_what_the_actuator_resizes(
    helm: Path, args: tuple[str, ...], mode: str, excluded: list[str]
) -> None:
    docs = render(helm, *args)
    env = actuator_env(docs)
    assert env["FRACPILOT_OPTIN_DEFAULT_MODE"] == mode
    assert json.loads(env["FRACPILOT_OPTIN_EXCLUDED_NAMESPACES"]) == excluded
    settings = ActuatorSettings(
        optin={
            "default_mode": env["FRACPILOT_OPTIN_DEFAULT_MODE"],
            "excluded_namespaces": json.loads(env["FRACPILOT_OPTIN_EXCLUDED_NAMESPACES"]),
        }
    )
    expected = webhook_selectors(settings.optin.default_mode, settings.optin.excluded_namespaces)
    hooks = webhooks(docs)
    assert [h["name"] for h in hooks] == ["targets.fracpilot.io", "pods.targets.fracpilot.io"]
    for hook, selector in zip(hooks, expected, strict=True):
        assert hook["namespaceSelector"] == {"matchExpressions": selector.namespace}
        assert hook["objectSelector"] == {"matchExpressions": selector.pod}
        assert hook["failurePolicy"] == "Ignore"


def test_the_default_render_is_recommend_only(helm: Path) -> None:
    """grep-level, on the text helm prints: the actuator's default and the webhook's label."""
    text = subprocess.run(
        [str(helm), "template", "fp", str(CHART), "--namespace", RELEASE_NS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert 'name: FRACPILOT_OPTIN_DEFAULT_MODE\n              value: "recommend"' in text
    assert (
        "- key: fracpilot.io/mode\n          operator: In\n          values:\n          - auto"
        in (text)
    )


def test_the_actuator_may_watch_namespaces(helm: Path) -> None:
    docs = render(helm)
    (role,) = [
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("actuator")
    ]
    assert {
        "apiGroups": [""],
        "resources": ["namespaces"],
        "verbs": ["get", "list", "watch"],
    } in role["rules"]


@pytest.mark.parametrize("scope", ["opted-in", "all", "off"])
def test_the_actuator_writes_recommendation_objects_as_the_chart_says(
    helm: Path, scope: str
) -> None:
    """The chart's default is the actuator's (opted-in namespaces only), and the value reaches
    the actuator's settings as it is (the env its pydantic settings read)."""
    args = () if scope == "opted-in" else ("--set", f"fractionPolicies.recommendations={scope}")
    env = actuator_env(render(helm, *args))
    assert env["FRACPILOT_POLICYSYNC_RECOMMENDATIONS"] == scope
    settings = ActuatorSettings(policysync={"recommendations": scope})
    assert settings.policysync.recommendations == scope
    if scope == "opted-in":
        assert ActuatorSettings().policysync.recommendations == scope


def test_the_chart_refuses_an_unknown_recommendations_scope(helm: Path) -> None:
    wrong = "fractionPolicies.recommendations=true"  # the setting's boolean of before
    proc = subprocess.run(
        [str(helm), "template", "fp", str(CHART), "--namespace", RELEASE_NS, "--set", wrong],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "recommendations" in proc.stderr


def notes(kube: ControlPlane, *args: str) -> str:
    proc = subprocess.run(
        [
            str(kube.helm),
            "install",
            "fp",
            str(CHART),
            "--namespace",
            RELEASE_NS,
            "--dry-run=client",
            *SHARED_CLUSTER_VALUES,
            "--kubeconfig",
            str(kube.write_kubeconfig()),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return proc.stdout.split("NOTES:", 1)[1]


def test_the_notes_say_how_to_turn_on_auto_mode_and_see_recommendations(
    kube: ControlPlane,
) -> None:
    text = notes(kube)
    assert "Nothing is resized yet: fracpilot is recommend-only" in text
    assert "kubectl label namespace team-a fracpilot.io/mode=auto" in text
    assert "fracpilot status" in text
    # The objects: only where a namespace asked for them, by default.
    assert "kubectl label namespace team-a fracpilot.io/mode=recommend" in text
    assert "kubectl get fractionrecommendations -n team-a" in text
    everywhere = notes(kube, "--set", "fractionPolicies.recommendations=all")
    assert "kubectl get fractionrecommendations -A" in everywhere
    none = notes(kube, "--set", "fractionPolicies.recommendations=off")
    assert "fractionrecommendations" not in none
    opted_out = notes(kube, "--set", "optIn.defaultMode=auto")
    assert "recommend-only" not in opted_out
    assert "optIn.defaultMode is auto" in opted_out
