"""Which policy sizes a workload: scopes, their keys, and resolution over the stored policies.

Policies are stored under their scope's key: ``cluster``, ``namespace.<ns>`` or
``workload.<ns>.<name>``. A workload is sized by the *most specific* stored policy, taken *as a
whole*: workload > namespace > cluster > the configured cluster default
(``FRACPILOT_POLICY_JSON``, :func:`cluster_default`) > the built-in defaults of
:class:`~fracpilot_libs.contracts.Policy`. Fields are never merged across levels, so the policy
``fracpilot policy get`` shows is the one the engine uses, and its ``scope`` says where it came
from; under ``isolation: enforced`` the engine adds the mode's headroom and resize budget where
the policy keeps the defaults (:mod:`fracpilot_libs.sizing.isolation_policies`). The decision
service keeps the store (KV) and answers requests; ``fracpilot status`` resolves with the same
:class:`LivePolicies`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError

from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyScope, WorkloadRef
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.sizing.isolation_policies import sizing_policy

_NAMESPACE = re.compile(r"[-/_=A-Za-z0-9]+")
_WORKLOAD = re.compile(r"[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*")


class ClusterPolicySettings(BaseModel):
    """The cluster-default policy setting, read by the decision service and ``fracpilot``
    alike (a settings class mixes it in: ``FRACPILOT_POLICY_JSON``)."""

    policy_json: str | None = Field(
        default=None,
        description="cluster-default policy as JSON, used when the policy bucket has no "
        "cluster policy",
    )


def cluster_default(policy_json: str | None) -> Policy:
    """The policy behind every stored one: ``FRACPILOT_POLICY_JSON``, else the built-in
    defaults. Raises ValueError when it is not a valid cluster-scope policy."""
    if not policy_json:
        return Policy()
    policy = Policy.model_validate_json(policy_json)
    if policy.scope.level is not PolicyLevel.CLUSTER:
        raise ValueError("FRACPILOT_POLICY_JSON must be a cluster-scope policy")
    return policy


def scope_chain(scope: PolicyScope) -> tuple[PolicyScope, ...]:
    """The scope and the scopes above it, most specific first: a workload of one kind, that
    name of any kind, its namespace, the cluster."""
    chain = [scope]
    if scope.level is PolicyLevel.WORKLOAD and scope.kind is not None:
        chain.append(scope.model_copy(update={"kind": None}))
    if scope.level is PolicyLevel.WORKLOAD:
        chain.append(PolicyScope(level=PolicyLevel.NAMESPACE, namespace=scope.namespace))
    if scope.level is not PolicyLevel.CLUSTER:
        chain.append(PolicyScope())
    return tuple(chain)


def workload_scope(workload: WorkloadRef) -> PolicyScope:
    return PolicyScope(
        level=PolicyLevel.WORKLOAD,
        namespace=workload.namespace,
        workload=workload.owner_name,
        kind=workload.owner_kind,
    )


def workload_chain_keys(namespace: str, name: str, kind: str) -> tuple[str, str, str, str]:
    """The keys of a workload's scope chain, as ``PolicyScope.key`` spells them; plain string
    work, no model (this runs for every sample, of every one of 100,000 workloads)."""
    return (
        f"{PolicyLevel.WORKLOAD.value}.{namespace}.{kind}/{name}",
        f"{PolicyLevel.WORKLOAD.value}.{namespace}.{name}",
        f"{PolicyLevel.NAMESPACE.value}.{namespace}",
        PolicyLevel.CLUSTER.value,
    )


def resolve(stored: Mapping[str, Policy], keys: tuple[str, ...], default: Policy) -> Policy:
    """The first policy stored under ``keys`` (most specific first), else ``default``."""
    for key in keys:
        if (policy := stored.get(key)) is not None:
            return policy
    return default


def scope_problem(scope: PolicyScope) -> str | None:
    """Why a scope cannot name a KV entry (None when it can)."""
    if scope.namespace is not None and not _NAMESPACE.fullmatch(scope.namespace):
        return f"scope.namespace {scope.namespace!r} may contain only letters, digits and '-_=/'"
    if scope.workload is not None and not _WORKLOAD.fullmatch(scope.workload):
        return (
            f"scope.workload {scope.workload!r} may contain only letters, digits, '-_=/' "
            "and single dots inside the name"
        )
    return None


def parse_scope(data: bytes) -> PolicyScope:
    """A get request: empty (the cluster), a PolicyScope, or a WorkloadRef (its workload).

    Raises :class:`~fracpilot_libs.nats.decoding.DecodeError` with a readable reason.
    """
    if not data.strip():
        return PolicyScope()
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # also too deep, or an integer too long
        raise DecodeError("decode", f"not valid JSON: {str(exc)[:500]}") from exc
    if isinstance(body, dict) and "owner_name" in body:
        try:
            return workload_scope(decode(WorkloadRef, data))
        except ValidationError as exc:  # an owner kind no scope can name
            raise DecodeError("validation", str(exc)[:500]) from exc
    return decode(PolicyScope, data)


# Policies synced from Kubernetes objects (FractionPolicy, ClusterFractionPolicy) are stored
# under their scope's key with this prefix, beside those set over NATS; at the same scope the
# Kubernetes one wins, and when it goes the NATS one (or the default) is in force again.
KUBERNETES_PREFIX = "kubernetes."


def kubernetes_key(scope_key: str) -> str:
    """The KV key of the policy a Kubernetes object sets at ``scope_key``."""
    return KUBERNETES_PREFIX + scope_key


def source_keys(scope_key: str) -> tuple[str, str]:
    """The KV keys that may hold the policy of one scope, the one that wins first."""
    return kubernetes_key(scope_key), scope_key


def next_revision(policy: Policy, previous: Policy | None) -> Policy:
    """The policy as the store keeps it: the previous revision + 1, or 1."""
    return policy.model_copy(update={"revision": (previous.revision if previous else 0) + 1})


class LivePolicies:
    """The stored policies as last seen (the decision service keeps them current from the KV
    watch; ``fracpilot status`` reads them once); resolves per workload, to the policy the
    engine sizes with (:func:`~fracpilot_libs.sizing.isolation_policies.sizing_policy`: an
    ``isolation: enforced`` policy with the mode's headroom and resize budget where it sets
    none), made once per stored policy, not per sample."""

    def __init__(self, default: Policy) -> None:
        self.default = default
        self.stored: dict[str, Policy] = {}  # scope key -> the policy in force there
        self._by_source: tuple[dict[str, Policy], dict[str, Policy]] = ({}, {})  # kube, NATS
        self._sized: dict[str, Policy] = {}  # scope key -> sizing_policy(the stored one)

    @property
    def default(self) -> Policy:
        return self._default

    @default.setter
    def default(self, policy: Policy) -> None:
        self._default, self._default_sized = policy, sizing_policy(policy)

    def apply(self, key: str, policy: Policy | None) -> None:
        """A KV entry changed (``policy`` None: deleted); a ``kubernetes.`` key wins over the
        plain one of the same scope."""
        from_kube = key.startswith(KUBERNETES_PREFIX)
        scope_key = key.removeprefix(KUBERNETES_PREFIX)
        source = self._by_source[0 if from_kube else 1]
        if policy is None:
            source.pop(scope_key, None)
        else:
            source[scope_key] = policy
        kube, nats_ = self._by_source
        in_force = kube.get(scope_key)
        if in_force is None:
            in_force = nats_.get(scope_key)
        if in_force is None:
            self.stored.pop(scope_key, None)
            self._sized.pop(scope_key, None)
        else:
            self.stored[scope_key] = in_force
            self._sized[scope_key] = sizing_policy(in_force)

    def for_workload(self, workload: WorkloadRef) -> Policy:
        """The policy ``workload``'s engine sizes with."""
        if not self._sized:
            return self._default_sized
        keys = workload_chain_keys(workload.namespace, workload.owner_name, workload.owner_kind)
        return resolve(self._sized, keys, self._default_sized)
