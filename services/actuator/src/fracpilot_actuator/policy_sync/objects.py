"""A FractionPolicy or ClusterFractionPolicy, as the API returns it, read as a ``Policy``.

Pure: no API calls. The apiserver's schema already rejects most bad objects; everything the
schema cannot say (or an object stored under an older schema) is caught here by ``Policy``'s
own validation, and the object is reported Invalid with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyScope
from fracpilot_libs.kube.policy_crd import (
    CLUSTER_DEFAULT_NAME,
    CLUSTER_KIND,
    NAMESPACED_KIND,
    TARGET_KINDS,
    spec_fields,
    spec_words,
)
from fracpilot_libs.sizing.policies import scope_problem

_SPEC_FIELDS = spec_fields()


class InvalidPolicyError(ValueError):
    """The object does not make a valid Policy; the message says why."""


@dataclass(frozen=True)
class PolicyObject:
    """What the sync reads of one object."""

    kind: str
    namespace: str  # "" for the ClusterFractionPolicy
    name: str
    uid: str = ""
    generation: int = 0
    created: str = ""  # creationTimestamp (RFC 3339, UTC: sorts as text)
    spec: Mapping[str, Any] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> PolicyObject:
        meta = obj.get("metadata") or {}
        spec, status = obj.get("spec"), obj.get("status")
        return cls(
            kind=str(obj.get("kind") or ""),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            created=str(meta.get("creationTimestamp") or ""),
            spec=spec if isinstance(spec, dict) else {},
            status=status if isinstance(status, dict) else {},
        )

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.namespace, self.name

    @property
    def ref(self) -> str:
        """How a status names it: ``FractionPolicy/<name>`` (its namespace is the scope's),
        ``ClusterFractionPolicy/default``."""
        return f"{self.kind}/{self.name}"

    @property
    def target_name(self) -> str | None:
        ref = self.spec.get("targetRef")
        return str(ref.get("name")) if isinstance(ref, dict) and ref.get("name") else None

    @property
    def target(self) -> str:
        """What the policy sizes, for ``kubectl get`` (the Target column)."""
        if self.kind == CLUSTER_KIND:
            return "(cluster)"
        if (name := self.target_name) is None:
            return "(namespace)"
        ref = self.spec.get("targetRef") or {}
        return f"{ref.get('kind')}/{name}" if ref.get("kind") else name


def scope_of(obj: PolicyObject) -> PolicyScope:
    """The scope an object sets the policy of. Raises InvalidPolicyError."""
    if obj.kind == CLUSTER_KIND:
        if obj.name != CLUSTER_DEFAULT_NAME:
            raise InvalidPolicyError(
                f"the one {CLUSTER_KIND} is named {CLUSTER_DEFAULT_NAME!r}, not {obj.name!r}"
            )
        return PolicyScope()
    if obj.kind != NAMESPACED_KIND:
        raise InvalidPolicyError(f"not a policy kind: {obj.kind!r}")
    ref = obj.spec.get("targetRef")
    kind = ref.get("kind") if isinstance(ref, dict) else None
    if kind is not None and kind not in TARGET_KINDS:
        raise InvalidPolicyError(f"targetRef.kind {kind!r} is not one of {TARGET_KINDS}")
    try:
        if (name := obj.target_name) is None:
            scope = PolicyScope(level=PolicyLevel.NAMESPACE, namespace=obj.namespace)
        else:
            # With a kind, that kind's workload only (a Deployment and a StatefulSet may share
            # a name); without, every workload of that name.
            scope = PolicyScope(
                level=PolicyLevel.WORKLOAD, namespace=obj.namespace, workload=name, kind=kind
            )
    except ValidationError as exc:
        raise InvalidPolicyError(_reasons(exc)) from exc
    if problem := scope_problem(scope):
        raise InvalidPolicyError(problem)
    return scope


def to_policy(obj: PolicyObject) -> Policy:
    """The Policy an object sets (revision 0: the sync numbers it). Raises
    InvalidPolicyError with every reason, spelled with the spec's field names."""
    scope = scope_of(obj)
    unknown = sorted(set(obj.spec) - set(_SPEC_FIELDS) - {"targetRef"})
    if unknown or (obj.kind == CLUSTER_KIND and "targetRef" in obj.spec):
        extra = unknown or ["targetRef"]
        raise InvalidPolicyError(f"unknown spec field(s): {', '.join(extra)}")
    values = {_SPEC_FIELDS[k]: v for k, v in obj.spec.items() if k in _SPEC_FIELDS}
    try:
        return Policy.model_validate({**values, "scope": scope})
    except ValidationError as exc:
        raise InvalidPolicyError(_reasons(exc)) from exc


_POLICY_TO_SPEC = {v: k for k, v in _SPEC_FIELDS.items()}


def _reasons(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(_POLICY_TO_SPEC.get(str(p), str(p)) for p in error["loc"])
        msg = spec_words(str(error["msg"]))
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)
