"""The opt-in rule: one answer for the actuator and the webhook (fracpilot_actuator.opt_in)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_actuator.admission import AdmissionOutcome, admit
from fracpilot_actuator.opt_in import (
    Automation,
    automation_of,
    matches,
    webhook_selectors,
)
from fracpilot_actuator.settings import OptInSettings
from fracpilot_libs.contracts import GpuSharing, Mode, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects

MODE = "fracpilot.io/mode"
OUT = "fracpilot.io/opt-out"
RECOMMEND_ONLY = OptInSettings()
AUTO_BY_DEFAULT = OptInSettings(default_mode="auto")


def rule(
    ns_labels: dict[str, str],
    pod_labels: dict[str, str] | None = None,
    policy: Mode = Mode.AUTO,
    settings: OptInSettings = RECOMMEND_ONLY,
    namespace: str = "team-a",
) -> tuple[Automation, str]:
    pods = [pod_labels] if pod_labels is not None else []
    selected = automation_of(namespace, ns_labels, pods, policy, settings, pods=["p-0"])
    return selected.mode, selected.reason


# --- the table ------------------------------------------------------------------------------------

TABLE: list[tuple[dict[str, str], dict[str, str] | None, Mode, OptInSettings, Automation, str]] = [
    # a fresh install: nothing labelled, recommend-only
    (
        {},
        {},
        Mode.AUTO,
        RECOMMEND_ONLY,
        Automation.RECOMMEND,
        "not opted in: namespace team-a has no label fracpilot.io/mode=auto",
    ),
    (
        {MODE: "auto"},
        {},
        Mode.AUTO,
        RECOMMEND_ONLY,
        Automation.AUTO,
        "namespace team-a is labelled",
    ),
    ({}, {MODE: "auto"}, Mode.AUTO, RECOMMEND_ONLY, Automation.AUTO, "pod p-0 is labelled"),
    # the pod overrides its namespace either way
    (
        {MODE: "auto"},
        {MODE: "recommend"},
        Mode.AUTO,
        RECOMMEND_ONLY,
        Automation.RECOMMEND,
        "not opted in: pod p-0 is labelled fracpilot.io/mode=recommend",
    ),
    ({MODE: "off"}, {MODE: "auto"}, Mode.AUTO, RECOMMEND_ONLY, Automation.AUTO, "pod p-0"),
    ({MODE: "auto"}, {MODE: "off"}, Mode.AUTO, RECOMMEND_ONLY, Automation.OFF, "pod p-0"),
    # the policy's recommend always wins over an opt-in; it never turns off into recommend
    (
        {MODE: "auto"},
        {MODE: "auto"},
        Mode.RECOMMEND,
        RECOMMEND_ONLY,
        Automation.RECOMMEND,
        "the policy's mode is recommend",
    ),
    ({MODE: "off"}, {}, Mode.RECOMMEND, RECOMMEND_ONLY, Automation.OFF, "namespace team-a"),
    # the default mode, when configured auto, is what unlabelled namespaces get
    ({}, {}, Mode.AUTO, AUTO_BY_DEFAULT, Automation.AUTO, "the default mode is auto"),
    (
        {MODE: "recommend"},
        {},
        Mode.AUTO,
        AUTO_BY_DEFAULT,
        Automation.RECOMMEND,
        "not opted in: namespace team-a is labelled fracpilot.io/mode=recommend",
    ),
    # the older opt-out wins over everything, on the pod or the namespace
    ({MODE: "auto"}, {OUT: "true"}, Mode.AUTO, RECOMMEND_ONLY, Automation.OFF, OUT),
    ({MODE: "auto", OUT: "true"}, {MODE: "auto"}, Mode.AUTO, RECOMMEND_ONLY, Automation.OFF, OUT),
    # values that are not modes are ignored, and said so; label values are case-sensitive
    ({MODE: "Auto"}, {}, Mode.AUTO, RECOMMEND_ONLY, Automation.RECOMMEND, "=Auto is not auto"),
    ({MODE: "auto"}, {MODE: "yes"}, Mode.AUTO, RECOMMEND_ONLY, Automation.AUTO, "=yes is not"),
    # no pod: the namespace and the default decide
    ({MODE: "auto"}, None, Mode.AUTO, RECOMMEND_ONLY, Automation.AUTO, "namespace team-a"),
]


@pytest.mark.parametrize(("ns", "pod", "policy", "settings", "mode", "reason"), TABLE)
def test_the_rule(
    ns: dict[str, str],
    pod: dict[str, str] | None,
    policy: Mode,
    settings: OptInSettings,
    mode: Automation,
    reason: str,
) -> None:
    got_mode, got_reason = rule(ns, pod, policy, settings)
    assert got_mode is mode, got_reason
    assert reason in got_reason


def test_excluded_namespaces_are_off_whatever_their_labels_say() -> None:
    mode, reason = rule({MODE: "auto"}, {MODE: "auto"}, namespace="kube-system")
    assert mode is Automation.OFF
    assert reason == "namespace kube-system is excluded (FRACPILOT_OPTIN_EXCLUDED_NAMESPACES)"


def test_pods_that_disagree_give_the_least_automatic_answer() -> None:
    selected = automation_of(
        "team-a",
        {MODE: "auto"},
        [{}, {MODE: "recommend"}, {}],
        Mode.AUTO,
        RECOMMEND_ONLY,
        pods=["a", "b", "c"],
    )
    assert (selected.mode, selected.source, selected.held_back) == (
        Automation.RECOMMEND,
        "pod",
        "not_opted_in",
    )
    assert "pod b" in selected.reason


# --- properties -----------------------------------------------------------------------------------

VALUES = st.sampled_from([None, "auto", "recommend", "off", "Auto", "banana", ""])
OPT_OUTS = st.sampled_from([None, "true", "false"])


@st.composite
def labels(draw: st.DrawFn) -> dict[str, str]:
    out = {"team": draw(st.sampled_from(["a", "b"]))}
    if (mode := draw(VALUES)) is not None:
        out[MODE] = mode
    if (opt_out := draw(OPT_OUTS)) is not None:
        out[OUT] = opt_out
    return out


NAMESPACES = st.sampled_from(["team-a", "team-b", "kube-system", "fracpilot"])
SETTINGS = st.builds(
    OptInSettings,
    default_mode=st.sampled_from(["recommend", "auto"]),
    excluded_namespaces=st.sampled_from([["kube-system"], ["kube-system", "fracpilot"], []]),
)


@given(NAMESPACES, labels(), st.lists(labels(), max_size=3), st.sampled_from(Mode), SETTINGS)
def test_the_policy_caps_and_the_answer_never_exceeds_any_pods(
    namespace: str,
    ns: dict[str, str],
    pods: list[dict[str, str]],
    policy: Mode,
    settings: OptInSettings,
) -> None:
    got = automation_of(namespace, ns, pods, policy, settings)
    if policy is Mode.RECOMMEND:
        assert got.mode is not Automation.AUTO
    uncapped = automation_of(namespace, ns, pods, Mode.AUTO, settings)
    assert got.mode.rank <= uncapped.mode.rank
    for pod in pods:  # the workload is never more automatic than any one of its pods
        alone = automation_of(namespace, ns, [pod], Mode.AUTO, settings)
        assert uncapped.mode.rank <= alone.mode.rank
    assert got.reason
    assert (got.held_back == "") is (got.mode is Automation.AUTO)


def sent_by_apiserver(
    namespace: str, ns: dict[str, str], pod: dict[str, str], settings: OptInSettings
) -> list[int]:
    """Which of the webhooks the apiserver calls for a pod (their selectors, evaluated)."""
    ns_as_stored = {**ns, "kubernetes.io/metadata.name": namespace}  # the apiserver sets it
    return [
        i
        for i, selector in enumerate(
            webhook_selectors(settings.default_mode, settings.excluded_namespaces)
        )
        if matches(selector.namespace, ns_as_stored) and matches(selector.pod, pod)
    ]


@given(NAMESPACES, labels(), labels(), SETTINGS)
def test_the_webhook_selectors_send_exactly_the_pods_the_rule_puts_in_auto(
    namespace: str, ns: dict[str, str], pod: dict[str, str], settings: OptInSettings
) -> None:
    sent = sent_by_apiserver(namespace, ns, pod, settings)
    assert len(sent) <= 1  # the two webhooks never both take a pod
    answer = automation_of(namespace, ns, [pod], Mode.AUTO, settings)
    assert bool(sent) is answer.applies, answer.reason


def review(namespace: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    pod = {
        "metadata": {
            "generateName": "chat-6b7f9c-",
            "namespace": namespace,
            "labels": {"pod-template-hash": "6b7f9c", **pod_labels},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "chat-6b7f9c", "controller": True, "uid": "u"}
            ],
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "image": "x"}],
        },
    }
    pod["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        },
    }


@given(NAMESPACES, labels(), labels(), SETTINGS, st.booleans())
def test_the_webhook_and_the_actuator_agree(
    namespace: str,
    ns: dict[str, str],
    pod: dict[str, str],
    settings: OptInSettings,
    labels_known: bool,
) -> None:
    """Same namespace labels and pod labels: the webhook sizes the pod (the apiserver sends it
    and admit patches it) exactly when the actuator would apply the workload's decision."""
    wl = WorkloadRef(cluster="c", namespace=namespace, owner_kind="Deployment", owner_name="chat")
    made = WorkloadTarget(
        workload=wl,
        fraction=0.25,
        memory_mib=20480,
        backend=GpuSharing.KAI,
        decision_id="d-1",
        updated_at=datetime(2026, 3, 2, tzinfo=UTC),
    )
    targets = {subjects.kv_key(wl): made}
    answer = admit(
        review(namespace, pod),
        targets,
        "c",
        opt_in=settings,
        namespace_labels=ns if labels_known else None,
    )
    webhook_sizes = (
        bool(sent_by_apiserver(namespace, ns, pod, settings))
        and answer.outcome is AdmissionOutcome.PATCHED
    )
    actuator_applies = automation_of(namespace, ns, [pod], Mode.AUTO, settings).applies
    assert webhook_sizes is actuator_applies, answer.reason
    if answer.outcome is AdmissionOutcome.PATCHED:
        patch = json.loads(base64.b64decode(answer.review["response"]["patch"]))
        assert {"op": "replace", "path": "/metadata/annotations/gpu-fraction", "value": "0.25"} in (
            patch
        )
