"""Which workloads fracpilot may change: the opt-in rule, one copy for the actuator and the webhook.

Pure. A fresh install is recommend-only: decisions are published and shown, nothing is applied
until a namespace or a workload opts in with the label ``fracpilot.io/mode``:

- ``auto``: decisions are applied (the actuator resizes, the webhook sizes new pods);
- ``recommend``: decisions are recorded as recommendations, nothing is changed;
- ``off``: fracpilot leaves the workload alone (no action, new pods are not sized).

Precedence (:func:`automation_of`):

1. ``fracpilot.io/opt-out: "true"`` on the pod or the namespace: off (the older switch);
   Namespaces in ``FRACPILOT_OPTIN_EXCLUDED_NAMESPACES`` are off too;
2. the selector, most specific first: the pod's label (set it in the pod template), else the
   namespace's label, else the default (``FRACPILOT_OPTIN_DEFAULT_MODE``, recommend unless
   set). A value other than auto / recommend / off is ignored, as the webhook's label selectors
   ignore it;
3. the policy's mode caps the answer: the least automatic of the policy and the selector wins,
   so ``mode: recommend`` in a policy always wins over an opt-in.

The workload's own label is read from its pods, not from the Deployment object: the webhook
sees only the pod being created, and both must give the same answer (a workload the actuator
resizes by eviction must get its new size from the webhook when its pods come back).

:func:`webhook_selectors` gives the same rule as label selectors, for the apiserver to send the
webhook only the pods whose answer is auto (the chart's ``templates/webhook.yaml`` renders the
same two webhooks from the same value, ``optIn.defaultMode``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from fracpilot_actuator.settings import OptInSettings
from fracpilot_libs.contracts import Mode

MODE_LABEL = "fracpilot.io/mode"
OPT_OUT = "fracpilot.io/opt-out"  # "true" on a pod or a namespace: off, whatever else says
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the apiserver on every namespace


class Automation(StrEnum):
    """What fracpilot does with a workload's decisions, least automatic first."""

    OFF = "off"
    RECOMMEND = "recommend"
    AUTO = "auto"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Automation.OFF: 0, Automation.RECOMMEND: 1, Automation.AUTO: 2}
_BY_VALUE = {a.value: a for a in Automation}


@dataclass(frozen=True)
class Selected:
    """The answer for one workload (or pod): its mode, why, and which level said it."""

    mode: Automation
    reason: str
    source: Literal["excluded", "opt-out", "pod", "namespace", "default", "policy"]

    @property
    def applies(self) -> bool:
        return self.mode is Automation.AUTO

    @property
    def held_back(self) -> str:
        """Why a decision is not applied, as a bounded metric label: ``policy`` (the policy's
        mode is recommend), ``not_opted_in`` (recommend from a label or the default), ``off``;
        "" when it is applied."""
        if self.mode is Automation.AUTO:
            return ""
        if self.mode is Automation.OFF:
            return "off"
        return "policy" if self.source == "policy" else "not_opted_in"


def _is_true(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "true"


def _mode_label(labels: Mapping[str, Any]) -> tuple[Automation | None, str]:
    """The label's mode (None when absent or not a mode) and its raw value."""
    raw = labels.get(MODE_LABEL)
    if not isinstance(raw, str):
        return None, ""
    return _BY_VALUE.get(raw), raw  # exact, as a label selector compares


def _said(mode: Automation, reason: str) -> str:
    """A recommendation's reason starts with "not opted in" (what status and events show)."""
    return f"not opted in: {reason}" if mode is Automation.RECOMMEND else reason


def selector_mode(
    namespace: str,
    namespace_labels: Mapping[str, Any],
    pod_labels: Mapping[str, Any],
    settings: OptInSettings,
    pod: str = "",
) -> Selected:
    """The selector's answer alone (rules 1 and 2 of the module docstring)."""
    if namespace in settings.excluded_namespaces:
        return Selected(
            Automation.OFF,
            f"namespace {namespace} is excluded (FRACPILOT_OPTIN_EXCLUDED_NAMESPACES)",
            "excluded",
        )
    if _is_true(pod_labels.get(OPT_OUT)):
        return Selected(Automation.OFF, f"pod {pod or '(new)'} has {OPT_OUT}=true", "opt-out")
    if _is_true(namespace_labels.get(OPT_OUT)):
        return Selected(Automation.OFF, f"namespace {namespace} has {OPT_OUT}=true", "opt-out")
    ignored: list[str] = []
    mode, raw = _mode_label(pod_labels)
    if mode is not None:
        return Selected(
            mode, _said(mode, f"pod {pod or '(new)'} is labelled {MODE_LABEL}={raw}"), "pod"
        )
    if raw:
        ignored.append(f"pod label {MODE_LABEL}={raw} is not auto, recommend or off: ignored")
    mode, raw = _mode_label(namespace_labels)
    if mode is not None:
        reason = _said(mode, f"namespace {namespace} is labelled {MODE_LABEL}={raw}")
        return Selected(mode, "; ".join([reason, *ignored]), "namespace")
    if raw:
        ignored.append(f"namespace label {MODE_LABEL}={raw} is not auto, recommend or off: ignored")
    default = _BY_VALUE.get(settings.default_mode, Automation.RECOMMEND)
    if default is Automation.AUTO:
        reason = f"namespace {namespace} has no label {MODE_LABEL} and the default mode is auto"
    else:
        reason = f"not opted in: namespace {namespace} has no label {MODE_LABEL}=auto"
    return Selected(default, "; ".join([reason, *ignored]), "default")


def automation_of(
    namespace: str,
    namespace_labels: Mapping[str, Any],
    pod_labels: Iterable[Mapping[str, Any]],
    policy_mode: Mode,
    settings: OptInSettings,
    pods: Iterable[str] = (),
) -> Selected:
    """The opt-in rule for a workload (the module docstring's precedence).

    ``pod_labels``: the labels of each of the workload's pods (one pod for the webhook); when
    they disagree (a rollout under way) the least automatic pod's answer is the workload's.
    No pod: the namespace and the default decide."""
    names = list(pods)
    per_pod = [
        selector_mode(
            namespace, namespace_labels, labels, settings, names[i] if i < len(names) else ""
        )
        for i, labels in enumerate(pod_labels)
    ]
    chosen = (
        min(per_pod, key=lambda s: s.mode.rank)
        if per_pod
        else selector_mode(namespace, namespace_labels, {}, settings)
    )
    if policy_mode is Mode.RECOMMEND and chosen.mode.rank > Automation.RECOMMEND.rank:
        return Selected(
            Automation.RECOMMEND, f"the policy's mode is recommend ({chosen.reason})", "policy"
        )
    return chosen


# --- the same rule as the apiserver's label selectors -----------------------------------------


def _expression(key: str, operator: str, values: Iterable[str] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if operator in ("In", "NotIn"):
        out["values"] = sorted(values)
    return out


def auto_namespaces(default_mode: str) -> list[dict[str, Any]]:
    """Namespaces whose own answer is auto, as matchExpressions (without the opt-out)."""
    if default_mode == Automation.AUTO.value:
        return [_expression(MODE_LABEL, "NotIn", ("recommend", "off"))]
    return [_expression(MODE_LABEL, "In", ("auto",))]


def other_namespaces(default_mode: str) -> list[dict[str, Any]]:
    """The complement of :func:`auto_namespaces`: namespaces whose own answer is not auto."""
    if default_mode == Automation.AUTO.value:
        return [_expression(MODE_LABEL, "In", ("recommend", "off"))]
    return [_expression(MODE_LABEL, "NotIn", ("auto",))]


@dataclass(frozen=True)
class WebhookSelector:
    """One webhook's namespaceSelector and objectSelector (matchExpressions)."""

    name_prefix: str  # "" for the namespace's pods, "pods." for pods opted in by label
    namespace: list[dict[str, Any]]
    pod: list[dict[str, Any]]


def webhook_selectors(
    default_mode: str, excluded_namespaces: Iterable[str] = ()
) -> tuple[WebhookSelector, WebhookSelector]:
    """The pods whose answer is auto (policy aside), as two disjoint webhooks' selectors:

    - pods of namespaces whose answer is auto that do not say recommend or off themselves;
    - pods labelled ``fracpilot.io/mode=auto`` in the other namespaces.

    Both leave out ``excluded_namespaces`` and pods or namespaces with ``fracpilot.io/opt-out``.
    """
    not_out = _expression(OPT_OUT, "NotIn", ("true",))
    excluded = sorted(set(excluded_namespaces))
    base = [_expression(NAMESPACE_NAME_LABEL, "NotIn", excluded)] if excluded else []
    return (
        WebhookSelector(
            "",
            [*base, *auto_namespaces(default_mode), dict(not_out)],
            [_expression(MODE_LABEL, "NotIn", ("recommend", "off")), dict(not_out)],
        ),
        WebhookSelector(
            "pods.",
            [*base, *other_namespaces(default_mode), dict(not_out)],
            [_expression(MODE_LABEL, "In", ("auto",)), dict(not_out)],
        ),
    )


def matches(expressions: Iterable[Mapping[str, Any]], labels: Mapping[str, Any]) -> bool:
    """Whether labels match matchExpressions, as the apiserver evaluates them (In, NotIn,
    Exists, DoesNotExist; NotIn matches a missing key)."""
    for e in expressions:
        key, op, values = e["key"], e["operator"], list(e.get("values") or ())
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
