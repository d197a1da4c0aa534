"""The admission webhook's pure core: an AdmissionReview and the targets in, a JSONPatch out.

No I/O here (the HTTPS server is :mod:`fracpilot_actuator.webhook`): :func:`admit` answers an
``admission.k8s.io/v1`` AdmissionReview for a Pod CREATE from the targets map, and never
denies; :func:`webhook_configuration` builds the MutatingWebhookConfiguration that registers it,
with ``failurePolicy: Ignore`` so that the webhook being down never blocks pod creation.

Which workload a pod belongs to comes from its controller owner reference: a ReplicaSet named
``<deployment>-<pod-template-hash>`` (the pod's ``pod-template-hash`` label) stands for its
Deployment; StatefulSets, DaemonSets and Jobs are used directly (a Job whose name ends in a
CronJob's scheduled-time suffix is also looked up as that CronJob, as ingest names it); a
pod without an owner has no workload.

How a target is written (only forms the pod already uses are touched):

KAI (annotations; KAI refuses ``gpu-fraction`` >= 1 and any combination of ``gpu-fraction``,
``gpu-memory`` and an ``nvidia.com/gpu`` limit):

- a pod with ``gpu-memory`` gets ``gpu-memory`` = the target's MiB (no change when the target
  has no memory size);
- a pod with ``gpu-fraction`` gets ``gpu-fraction`` = the fraction (``"0.375"``). A whole GPU
  (fraction 1) cannot be a ``gpu-fraction``, so the pod becomes a whole-GPU pod:
  ``gpu-fraction``, ``gpu-fraction-num-devices`` and ``mps`` are removed and the fraction's
  container (``gpu-fraction-container-name``, else the first) gets the limit
  ``nvidia.com/gpu: <num-devices or 1>``, unless a container already has such a limit;
- a whole-GPU pod (an ``nvidia.com/gpu`` limit, no KAI annotation) with a fraction below 1
  becomes a fractional pod only when KAI schedules it (``schedulerName: kai-scheduler``):
  the limit and request are removed and ``gpu-fraction`` set (plus ``gpu-fraction-num-devices``
  for N > 1 GPUs and ``gpu-fraction-container-name`` when it is not the first container).
  Under another scheduler the annotation would lose the pod its GPU, so it is left alone;
- a pod without any GPU request is left alone.

HAMi (container limits): in the first container with an ``nvidia.com/gpu`` limit, each of
``nvidia.com/gpumem`` (the target's MiB), ``nvidia.com/gpumem-percentage`` and
``nvidia.com/gpucores`` (the fraction in whole percent, rounded up) that the container already
sets is updated, in ``limits`` and, where present, ``requests`` (which must equal the limits
for extended resources). A container with none of them holds whole GPUs and is left alone.

A pod that takes the target also gets the annotation ``fracpilot.io/target: <decision id>``;
admitting it again changes nothing (the webhook may be reinvoked). A pod labelled or
annotated ``fracpilot.io/opt-out: "true"`` is left alone.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal
from enum import StrEnum
from typing import Any

from fracpilot_libs import subjects
from fracpilot_libs.contracts import GpuBackend, WorkloadRef, WorkloadTarget

ADMISSION_API_VERSION = "admission.k8s.io/v1"
WEBHOOK_CONFIGURATION_NAME = "fracpilot-targets"
WEBHOOK_NAME = "targets.fracpilot.io"  # a webhook's name must be fully qualified
MUTATE_PATH = "/mutate"

OPT_OUT = "fracpilot.io/opt-out"  # label or annotation "true" on a pod (label on a namespace)
TARGET_ANNOTATION = "fracpilot.io/target"  # the decision id of the target a pod was given
POD_TEMPLATE_HASH = "pod-template-hash"

KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER = "gpu-fraction-container-name"
KAI_MPS = "mps"
KAI_SCHEDULER = "kai-scheduler"
GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"

# CronJob controller v2 names a Job ``<cronjob>-<scheduled time in minutes since the epoch>``.
_CRONJOB_JOB = re.compile(r"^(?P<cronjob>.+)-(?P<minutes>\d{8,})$")
_INTEGER = re.compile(r"^\d+$")


class AdmissionOutcome(StrEnum):
    PATCHED = "patched"  # the pod's GPU request was changed to the target
    UNCHANGED = "unchanged"  # a target applies but nothing changes, or the pod cannot take it
    OPTED_OUT = "opted_out"
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


# --- JSON Pointer / JSON Patch -----------------------------------------------------------------

Token = str | int


def escape_token(token: Token) -> str:
    """One RFC 6901 reference token: ``~`` -> ``~0``, ``/`` -> ``~1`` (in that order)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(tokens: Iterable[Token]) -> str:
    """An RFC 6901 JSON Pointer: ``("metadata", "annotations", "a/b")`` ->
    ``/metadata/annotations/a~1b``."""
    return "".join("/" + escape_token(t) for t in tokens)


def _child(node: Any, token: Token) -> Any:
    """The member or element ``token`` of ``node``; None when there is none."""
    if isinstance(node, dict) and isinstance(token, str):
        return node.get(token)
    if isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
        return node[token]
    return None


class _PatchBuilder:
    """Builds an RFC 6902 patch against a working copy, so that each op is valid in sequence."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = copy.deepcopy(dict(document))
        self.ops: list[dict[str, Any]] = []

    def _walk(self, tokens: Sequence[Token]) -> Any:
        node: Any = self.doc
        for token in tokens:
            node = _child(node, token)
            if node is None:
                return None
        return node

    def set(self, tokens: Sequence[Token], value: Any) -> None:
        """Set an object member, creating missing (or null) parent objects on the way."""
        node: Any = self.doc
        for i, token in enumerate(tokens[:-1]):
            child = _child(node, token)
            if child is None:  # build the rest and add it in one op
                if not isinstance(node, dict) or not isinstance(token, str):
                    raise ValueError(f"{pointer(tokens[: i + 1])} does not exist")
                nested: Any = value
                for inner in reversed(tokens[i + 1 :]):
                    nested = {inner: nested}
                self.ops.append({"op": "add", "path": pointer(tokens[: i + 1]), "value": nested})
                node[token] = copy.deepcopy(nested)
                return
            if not isinstance(child, dict | list):
                raise ValueError(f"{pointer(tokens[: i + 1])} is not an object")
            node = child
        last = tokens[-1]
        if not isinstance(node, dict) or not isinstance(last, str):
            raise ValueError(f"{pointer(tokens[:-1])} is not an object")
        if last in node and node[last] == value:
            return
        op = "replace" if node.get(last) is not None else "add"  # add replaces a null member
        self.ops.append({"op": op, "path": pointer(tokens), "value": value})
        node[last] = copy.deepcopy(value)

    def remove(self, tokens: Sequence[Token]) -> None:
        """Remove an object member if it is there."""
        parent = self._walk(tokens[:-1])
        last = tokens[-1]
        if isinstance(parent, dict) and isinstance(last, str) and last in parent:
            self.ops.append({"op": "remove", "path": pointer(tokens)})
            del parent[last]


# --- reading a pod ------------------------------------------------------------------------------


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _annotations(pod: Mapping[str, Any]) -> dict[str, Any]:
    return _mapping(_mapping(pod.get("metadata")).get("annotations"))


def _labels(pod: Mapping[str, Any]) -> dict[str, Any]:
    return _mapping(_mapping(pod.get("metadata")).get("labels"))


def _is_true(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "true"


def opted_out(pod: Mapping[str, Any]) -> bool:
    """``fracpilot.io/opt-out: "true"`` as a label or an annotation."""
    return _is_true(_labels(pod).get(OPT_OUT)) or _is_true(_annotations(pod).get(OPT_OUT))


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or its generateName prefix (a controller's pod has no name yet)."""
    meta = _mapping(pod.get("metadata"))
    return str(meta.get("name") or meta.get("generateName") or "")


def _controller_ref(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    owners = _list(_mapping(pod.get("metadata")).get("ownerReferences"))
    refs: list[dict[str, Any]] = [r for r in owners if isinstance(r, dict)]
    controllers = [r for r in refs if r.get("controller") is True]
    if controllers:
        return controllers[0]
    return refs[0] if len(refs) == 1 else None


def workload_candidates(
    pod: Mapping[str, Any], namespace: str, cluster: str
) -> tuple[WorkloadRef, ...]:
    """The workloads a pod may belong to, most specific first; empty for a pod without owner.

    A ReplicaSet named ``<deployment>-<pod-template-hash>`` stands for its Deployment (without
    the label or the suffix it is a bare ReplicaSet). A Job whose name ends in a CronJob's
    scheduled-time suffix may be a CronJob's: that CronJob is the second candidate.
    """
    ref = _controller_ref(pod)
    if ref is None:
        return ()
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    if not kind or not name:
        return ()

    def of(owner_kind: str, owner_name: str) -> WorkloadRef:
        return WorkloadRef(
            cluster=cluster, namespace=namespace, owner_kind=owner_kind, owner_name=owner_name
        )

    if kind == "ReplicaSet":
        template_hash = _labels(pod).get(POD_TEMPLATE_HASH)
        suffix = f"-{template_hash}" if isinstance(template_hash, str) and template_hash else ""
        if suffix and name.endswith(suffix) and len(name) > len(suffix):
            return (of("Deployment", name[: -len(suffix)]),)
        return (of("ReplicaSet", name),)
    if kind == "Job" and (m := _CRONJOB_JOB.match(name)):
        return (of("Job", name), of("CronJob", m.group("cronjob")))
    return (of(kind, name),)


def _int_quantity(value: Any) -> int | None:
    """A plain integer quantity ("3000", 3000); None for anything else ("3k", "1.5")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None


def _gpu_limit(container: Any) -> Any:
    return _mapping(_mapping(_mapping(container).get("resources")).get("limits")).get(GPU)


# --- the values KAI and HAMi expect ---------------------------------------------------------------

_NANO = Decimal("1e-9")  # a Kubernetes quantity's finest precision
_MAX_PORTION = Decimal("0.999999999")


def format_fraction(fraction: float) -> str:
    """A KAI ``gpu-fraction``: plain decimal, at most 9 places, rounded up, 0 < value < 1.

    ``0.375`` -> ``"0.375"``, ``1e-05`` -> ``"0.00001"``. Rounding up never gives a pod less
    than its target; KAI refuses 1, so a fraction just below 1 stays below it.
    """
    if not 0.0 < fraction < 1.0 or not math.isfinite(fraction):
        raise ValueError(f"a gpu-fraction must be in (0, 1), not {fraction!r}")
    value = min(Decimal(repr(fraction)).quantize(_NANO, rounding=ROUND_CEILING), _MAX_PORTION)
    return format(value.normalize(), "f")


def percent(fraction: float) -> int:
    """A fraction as HAMi's whole percent (gpumem-percentage, gpucores): rounded up, 1..100."""
    if not 0.0 < fraction <= 1.0 or not math.isfinite(fraction):
        raise ValueError(f"a fraction must be in (0, 1], not {fraction!r}")
    return max(1, min(100, math.ceil(round(fraction * 100, 9))))


# --- the patch ------------------------------------------------------------------------------------


@dataclass
class Sizing:
    """The sizing ops for a pod; ``applies`` is False when the pod cannot take the target."""

    applies: bool
    reason: str
    builder: _PatchBuilder
    changed: bool = field(default=False)


def _same_fraction(current: Any, wanted: str) -> bool:
    try:
        return isinstance(current, str) and Decimal(current) == Decimal(wanted)
    except ArithmeticError:
        return False


def _kai(pod: Mapping[str, Any], target: WorkloadTarget, patch: _PatchBuilder) -> tuple[bool, str]:
    annotations = _annotations(pod)
    spec = _mapping(pod.get("spec"))
    containers = _list(spec.get("containers"))
    ann = ("metadata", "annotations")

    if KAI_MEMORY in annotations:
        if target.memory_mib <= 0:
            return False, "the pod uses gpu-memory and the target has no memory size"
        patch.set((*ann, KAI_MEMORY), str(target.memory_mib))
        return True, f"gpu-memory {target.memory_mib} MiB"

    with_limit = [i for i, c in enumerate(containers) if _gpu_limit(c) is not None]
    if KAI_FRACTION not in annotations and not with_limit:
        return False, "the pod requests no GPU"

    if KAI_FRACTION in annotations:  # a fractional pod
        if target.fraction < 1.0:
            wanted = format_fraction(target.fraction)
            if not _same_fraction(annotations.get(KAI_FRACTION), wanted):
                patch.set((*ann, KAI_FRACTION), wanted)
            return True, f"gpu-fraction {wanted}"
        # A whole GPU: KAI refuses gpu-fraction 1, so the pod asks for whole GPUs instead.
        devices = _int_quantity(annotations.get(KAI_NUM_DEVICES)) or 1
        for key in (KAI_FRACTION, KAI_NUM_DEVICES, KAI_MPS):  # mps needs a fraction
            patch.remove((*ann, key))
        if not with_limit:
            where = _kai_container(spec, annotations.get(KAI_CONTAINER))
            if where is None:
                return False, "the pod has no container for the GPU"
            patch.set((*where, "resources", "limits", GPU), str(devices))
        return True, f"whole GPU x{devices}"

    # A whole-GPU pod.
    if target.fraction >= 1.0:
        return True, "already whole GPUs"
    if spec.get("schedulerName") != KAI_SCHEDULER:
        return False, "a whole-GPU pod not scheduled by kai-scheduler cannot take a gpu-fraction"
    if len(with_limit) != 1:
        return False, "a gpu-fraction applies to one container; several request GPUs"
    index = with_limit[0]
    limits = _mapping(_mapping(_mapping(containers[index]).get("resources")).get("limits"))
    if any(share in limits for share in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)):
        return False, "the pod holds HAMi shares, not KAI's"
    devices_wanted = _int_quantity(_gpu_limit(containers[index]))
    if devices_wanted is None or devices_wanted < 1:
        return False, f"unreadable nvidia.com/gpu limit {_gpu_limit(containers[index])!r}"
    resources = ("spec", "containers", index, "resources")
    patch.remove((*resources, "limits", GPU))
    patch.remove((*resources, "requests", GPU))
    wanted = format_fraction(target.fraction)
    patch.set((*ann, KAI_FRACTION), wanted)
    if devices_wanted > 1:
        patch.set((*ann, KAI_NUM_DEVICES), str(devices_wanted))
    if index != 0:
        patch.set((*ann, KAI_CONTAINER), str(_mapping(containers[index]).get("name", "")))
    return True, f"gpu-fraction {wanted} (was whole GPUs)"


def _kai_container(spec: Mapping[str, Any], name: Any) -> tuple[Token, ...] | None:
    """Where KAI's fraction lives: the named container (init containers too), else the first."""
    if isinstance(name, str) and name:
        for section in ("containers", "initContainers"):
            for i, container in enumerate(_list(spec.get(section))):
                if _mapping(container).get("name") == name:
                    return ("spec", section, i)
    return ("spec", "containers", 0) if _list(spec.get("containers")) else None


def _hami(pod: Mapping[str, Any], target: WorkloadTarget, patch: _PatchBuilder) -> tuple[bool, str]:
    containers = _list(_mapping(pod.get("spec")).get("containers"))
    index = next((i for i, c in enumerate(containers) if _gpu_limit(c) is not None), None)
    if index is None:
        return False, "no container has an nvidia.com/gpu limit"
    resources = _mapping(_mapping(containers[index]).get("resources"))
    wanted: dict[str, int] = {HAMI_MEMORY_PERCENT: percent(target.fraction)}
    wanted[HAMI_CORES] = wanted[HAMI_MEMORY_PERCENT]
    if target.memory_mib > 0:
        wanted[HAMI_MEMORY] = target.memory_mib
    limits = _mapping(resources.get("limits"))
    used = [r for r in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES) if r in limits]
    applied = [r for r in used if r in wanted]
    if not applied:
        if used:
            return False, "the pod sets only nvidia.com/gpumem and the target has no memory size"
        return False, "the GPU container sets no HAMi share (gpumem, gpumem-percentage, gpucores)"
    for resource in applied:
        for section in ("limits", "requests"):
            current = _mapping(resources.get(section)).get(resource)
            if current is None or _int_quantity(current) == wanted[resource]:
                continue
            path = ("spec", "containers", index, "resources", section, resource)
            patch.set(path, str(wanted[resource]))
    return True, ", ".join(f"{r}={wanted[r]}" for r in applied)


def sizing_patch(pod: Mapping[str, Any], target: WorkloadTarget) -> Sizing:
    """The ops that give ``pod`` the target, and whether the pod can take it at all."""
    builder = _PatchBuilder(pod)
    if target.backend is GpuBackend.KAI:
        applies, reason = _kai(pod, target, builder)
    else:
        applies, reason = _hami(pod, target, builder)
    return Sizing(applies=applies, reason=reason, builder=builder, changed=bool(builder.ops))


def template_patch(
    workload: Mapping[str, Any], target: WorkloadTarget
) -> tuple[Sizing, list[dict[str, Any]]]:
    """The sizing of a Deployment's or StatefulSet's pod template, as ops on the workload.

    ``spec.template`` is shaped like a pod, so :func:`sizing_patch` sizes it as it sizes a pod
    (the same forms, the same refusals); the template also gets ``fracpilot.io/target`` when
    anything changes. The ops' paths start at the workload object (``/spec/template/...``);
    no ops when the template holds the target already or cannot take it.
    """
    template = _mapping(_mapping(workload.get("spec")).get("template"))
    sizing = sizing_patch(template, target)
    if not (sizing.applies and sizing.changed):
        return sizing, []
    sizing.builder.set(("metadata", "annotations", TARGET_ANNOTATION), target.decision_id)
    prefix = pointer(("spec", "template"))
    return sizing, [{**op, "path": prefix + op["path"]} for op in sizing.builder.ops]


# --- the review -----------------------------------------------------------------------------------


def parse_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in a body; raises :class:`MalformedReviewError` saying why not."""
    try:
        review = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    if _is_pod_create(request) and not isinstance(request.get("object"), dict):
        raise MalformedReviewError("a Pod CREATE request has no object")
    return review


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = _mapping(request.get("kind"))
    return (
        request.get("operation") == "CREATE"
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and not request.get("subResource")
    )


def review_response(uid: str, patch: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """An allowing AdmissionReview response, with the JSONPatch when there is one."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def admit(
    review: Mapping[str, Any], targets: Mapping[str, WorkloadTarget], cluster: str
) -> Admission:
    """Answer a parsed AdmissionReview (see :func:`parse_review`): always allowed.

    ``targets`` maps ``subjects.kv_key(workload)`` to the workload's target. Any failure
    while building the patch is answered with an unpatched, allowed pod and outcome ERROR.
    """
    request = _mapping(review.get("request"))
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

    if not _is_pod_create(request):
        return answer(AdmissionOutcome.UNCHANGED, "not a Pod CREATE")
    pod = _mapping(request.get("object"))
    try:
        if opted_out(pod):
            return answer(AdmissionOutcome.OPTED_OUT, f"{OPT_OUT} is true")
        namespace = str(
            request.get("namespace") or _mapping(pod.get("metadata")).get("namespace") or ""
        )
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
        sizing = sizing_patch(pod, target)
        if not sizing.applies:
            return answer(AdmissionOutcome.UNCHANGED, sizing.reason, (), workload, target)
        sizing.builder.set(("metadata", "annotations", TARGET_ANNOTATION), target.decision_id)
        outcome = AdmissionOutcome.PATCHED if sizing.changed else AdmissionOutcome.UNCHANGED
        return answer(outcome, sizing.reason, sizing.builder.ops, workload, target)
    except Exception as exc:  # never block a pod on our bug: admit it as it is
        failed = answer(AdmissionOutcome.ERROR, f"internal error: {exc!r}"[:500])
        return replace(failed, error=exc)


# --- the MutatingWebhookConfiguration -------------------------------------------------------------


@dataclass(frozen=True)
class ServiceReference:
    """The in-cluster Service in front of the webhook (clientConfig.service)."""

    namespace: str
    name: str
    port: int = 443
    path: str = MUTATE_PATH


def webhook_configuration(
    *,
    ca_bundle: bytes,
    url: str | None = None,
    service: ServiceReference | None = None,
    name: str = WEBHOOK_CONFIGURATION_NAME,
    excluded_namespaces: Iterable[str] = ("kube-system",),
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The ``admissionregistration.k8s.io/v1`` MutatingWebhookConfiguration, as a plain dict.

    ``ca_bundle`` is the PEM of the CA that signed the serving certificate. Exactly one of
    ``url`` (``https://host:port/mutate``) and ``service`` says where the webhook is. Pods in
    ``excluded_namespaces``, in namespaces labelled ``fracpilot.io/opt-out=true`` and pods
    labelled so are never sent; ``failurePolicy: Ignore`` admits pods when the webhook fails.
    """
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeoutSeconds must be between 1 and 30")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if url is not None:
        if not url.startswith("https://"):
            raise ValueError("a webhook url must be https")
        client_config["url"] = url
    elif service is not None:
        client_config["service"] = {
            "namespace": service.namespace,
            "name": service.name,
            "port": service.port,
            "path": service.path,
        }
    not_opted_out = {"key": OPT_OUT, "operator": "NotIn", "values": ["true"]}
    namespace_rules = [not_opted_out]
    if excluded := sorted(set(excluded_namespaces)):
        namespace_rules.insert(
            0, {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "fracpilot"}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client_config,
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": timeout_seconds,
                # Re-run after a later webhook changed the pod; the patch is idempotent.
                "reinvocationPolicy": "IfNeeded",
                "namespaceSelector": {"matchExpressions": namespace_rules},
                "objectSelector": {"matchExpressions": [dict(not_opted_out)]},
            }
        ],
    }
