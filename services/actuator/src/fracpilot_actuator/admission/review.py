"""The AdmissionReview: parse it, answer it from the targets (:func:`admit`). Pure.

:func:`admit` answers an ``admission.k8s.io/v1`` AdmissionReview for a Pod CREATE from the
targets map, and never denies. A pod that takes the target also gets the annotation
``fracpilot.io/target: <decision id>``; admitting it again changes nothing (the webhook may be
reinvoked). A pod labelled or annotated ``fracpilot.io/opt-out: "true"`` is left alone, and so
is one whose opt-in answer (:mod:`fracpilot_actuator.opt_in`) is not auto: the apiserver's
selectors send only those, and the webhook checks again with the same rule.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from fracpilot_actuator.admission.pods import (
    OPT_OUT,
    TARGET_ANNOTATION,
    as_mapping,
    opted_out,
    workload_candidates,
)
from fracpilot_actuator.admission.sizing import sizing_patch
from fracpilot_actuator.opt_in import MODE_LABEL, selector_mode
from fracpilot_actuator.settings import OptInSettings
from fracpilot_libs.contracts import WorkloadRef, WorkloadTarget
from fracpilot_libs.llm_servers import FlagRewrite
from fracpilot_libs.nats import subjects

ADMISSION_API_VERSION = "admission.k8s.io/v1"
# The Event reason for a pod whose LLM server's memory flag asks for more than its fraction.
LLM_FLAG_ABOVE_FRACTION = "LlmServerFlagAboveFraction"


class AdmissionOutcome(StrEnum):
    PATCHED = "patched"  # the pod's GPU request was changed to the target
    UNCHANGED = "unchanged"  # a target applies but nothing changes, or the pod cannot take it
    OPTED_OUT = "opted_out"
    NOT_OPTED_IN = "not_opted_in"  # the opt-in rule says recommend or off
    NO_TARGET = "no_target"  # no owner, or no target for the owner
    ERROR = "error"  # malformed review (HTTP 400) or a failure while building the patch


class MalformedReviewError(ValueError):
    """The request body is not an admission.k8s.io/v1 AdmissionReview this webhook can answer."""


@dataclass(frozen=True)
class Admission:
    """The answer to one AdmissionReview, with what the webhook made of it (for logs and tests)."""

    review: dict[str, Any]  # the AdmissionReview response to send
    outcome: AdmissionOutcome
    reason: str
    patch: tuple[dict[str, Any], ...] = ()
    workload: WorkloadRef | None = None
    target: WorkloadTarget | None = None
    error: Exception | None = None  # what went wrong, for outcome ERROR
    llm: FlagRewrite | None = None  # the LLM server's memory flag, read and rewritten
    llm_warning: str = ""  # for an Event with reason LLM_FLAG_ABOVE_FRACTION and a metric


def parse_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in a body; raises :class:`MalformedReviewError` saying why not."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON, too deep, too long a number
        raise MalformedReviewError(f"body is not JSON: {exc}") from exc
    if not isinstance(review, dict):
        raise MalformedReviewError("body is not a JSON object")
    if review.get("apiVersion") != ADMISSION_API_VERSION or review.get("kind") != "AdmissionReview":
        raise MalformedReviewError(
            f"expected apiVersion {ADMISSION_API_VERSION} kind AdmissionReview, got "
            f"apiVersion {review.get('apiVersion')!r} kind {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError("request.uid is missing or not a string")
    if is_pod_create(request) and not isinstance(request.get("object"), dict):
        raise MalformedReviewError("a Pod CREATE request has no object")
    return review


def is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = as_mapping(request.get("kind"))
    return (
        request.get("operation") == "CREATE"
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and not request.get("subResource")
    )


def review_response(
    uid: str, patch: Sequence[Mapping[str, Any]] = (), warnings: Sequence[str] = ()
) -> dict[str, Any]:
    """An allowing AdmissionReview response, with the JSONPatch when there is one and the
    warnings the API server passes on to the client (``kubectl`` prints them)."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


# The apiserver sent the pod: its namespace matched a selector of opt_in.webhook_selectors.
_SELECTED_NAMESPACE = {MODE_LABEL: "auto"}


def admit(
    review: Mapping[str, Any],
    targets: Mapping[str, WorkloadTarget],
    cluster: str,
    *,
    opt_in: OptInSettings | None = None,
    namespace_labels: Mapping[str, Any] | None = None,
    hami_memory_factor: int = 1,
) -> Admission:
    """Answer a parsed AdmissionReview (see :func:`parse_review`): always allowed.

    ``targets`` maps ``subjects.kv_key(workload)`` to the workload's target. Any failure
    while building the patch is answered with an unpatched, allowed pod and outcome ERROR.
    ``namespace_labels``: the pod's namespace's labels when known (the actuator's namespace
    cache); None trusts the apiserver's namespaceSelector, which sent only pods of namespaces
    in auto mode or pods labelled ``fracpilot.io/mode=auto`` (for those, the namespace's label
    does not change the answer). ``opt_in``: the rule's settings; None: the defaults with no
    excluded namespace (the apiserver leaves those out). ``hami_memory_factor``: HAMi's
    ``memoryFactor`` (it reads ``nvidia.com/gpumem`` in units of that many MiB).
    """
    request = as_mapping(review.get("request"))
    uid = str(request.get("uid", ""))

    def answer(
        outcome: AdmissionOutcome,
        reason: str,
        patch: Sequence[dict[str, Any]] = (),
        workload: WorkloadRef | None = None,
        target: WorkloadTarget | None = None,
    ) -> Admission:
        return Admission(
            review_response(uid, patch), outcome, reason, tuple(patch), workload, target
        )

    if not is_pod_create(request):
        return answer(AdmissionOutcome.UNCHANGED, "not a Pod CREATE")
    pod = as_mapping(request.get("object"))
    try:
        if opted_out(pod):
            return answer(AdmissionOutcome.OPTED_OUT, f"{OPT_OUT} is true")
        namespace = str(
            request.get("namespace") or as_mapping(pod.get("metadata")).get("namespace") or ""
        )
        selected = selector_mode(
            namespace,
            _SELECTED_NAMESPACE if namespace_labels is None else namespace_labels,
            as_mapping(as_mapping(pod.get("metadata")).get("labels")),
            opt_in or OptInSettings(excluded_namespaces=[]),
        )
        if not selected.applies:
            return answer(AdmissionOutcome.NOT_OPTED_IN, selected.reason)
        candidates = workload_candidates(pod, namespace, cluster)
        if not candidates:
            return answer(AdmissionOutcome.NO_TARGET, "the pod has no owner")
        found = next(
            ((w, t) for w in candidates if (t := targets.get(subjects.kv_key(w))) is not None),
            None,
        )
        if found is None:
            return answer(
                AdmissionOutcome.NO_TARGET, f"no target for {candidates[0].key}", (), candidates[0]
            )
        workload, target = found
        sizing = sizing_patch(pod, target, hami_memory_factor=hami_memory_factor)
        if not sizing.applies:
            return answer(AdmissionOutcome.UNCHANGED, sizing.reason, (), workload, target)
        sizing.builder.set(("metadata", "annotations", TARGET_ANNOTATION), target.decision_id)
        outcome = AdmissionOutcome.PATCHED if sizing.changed else AdmissionOutcome.UNCHANGED
        warnings = (
            (f"{LLM_FLAG_ABOVE_FRACTION}: {sizing.llm_warning}",) if sizing.llm_warning else ()
        )
        patch = sizing.builder.ops
        return replace(
            answer(outcome, sizing.reason, patch, workload, target),
            review=review_response(uid, patch, warnings),
            llm=sizing.llm,
            llm_warning=sizing.llm_warning,
        )
    except Exception as exc:  # never block a pod on our bug: admit it as it is
        failed = answer(AdmissionOutcome.ERROR, f"internal error: {exc!r}"[:500])
        return replace(failed, error=exc)
