"""Every policy object and the policy bucket in, the bucket writes and each status out.

Pure (time is an argument). The rules:

- a valid object sets the policy of its scope under ``kubernetes.<scope key>``; two objects of
  one scope (FractionPolicies naming the same workload, or two without a target in one
  namespace): the older wins (then the name), the other is **Shadowed**;
- an **Invalid** object sets nothing: its scope falls back to the next source;
- a ``kubernetes.`` entry no valid object sets any more is deleted (the object was deleted or
  became invalid), so the policy set over NATS at that scope, or the default, is in force
  again; a policy set over NATS is never touched;
- an entry is rewritten only when its settings changed, with the next revision;
- each object's status says what is in force for its scope (``inForce``: itself, the object
  that shadows it, ``nats:<key>`` or ``default``, resolved up the scope chain as the decision
  engine resolves it), with the Ready / Invalid / Shadowed conditions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fracpilot_actuator.policy_sync.objects import (
    InvalidPolicyError,
    PolicyObject,
    scope_of,
    to_policy,
)
from fracpilot_libs.contracts import Policy, PolicyScope
from fracpilot_libs.kube.policy_crd import CLUSTER_KIND, NAMESPACED_KIND
from fracpilot_libs.sizing.policies import (
    KUBERNETES_PREFIX,
    kubernetes_key,
    next_revision,
    scope_chain,
)

READY, INVALID, SHADOWED = "Ready", "Invalid", "Shadowed"
STATES = ("ready", "shadowed", "invalid")
ObjectKey = tuple[str, str, str]  # kind, namespace, name


@dataclass(frozen=True)
class SyncPlan:
    puts: dict[str, Policy]  # KV key -> policy (revision numbered)
    deletes: tuple[str, ...]  # KV keys
    statuses: dict[ObjectKey, dict[str, Any]]  # only the statuses that change
    newly_invalid: tuple[tuple[PolicyObject, str], ...]  # invalid at a generation not reported
    states: dict[tuple[str, str], int]  # (kind, ready / shadowed / invalid) -> objects


def _settings(policy: Policy) -> Policy:
    return policy.model_copy(update={"revision": 0})


def _time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(
    obj: PolicyObject, wanted: list[tuple[str, bool, str, str]], now: datetime
) -> list[dict[str, Any]]:
    """Conditions in the metav1.Condition shape; a transition time moves only on a change."""
    before = {c.get("type"): c for c in obj.status.get("conditions") or () if isinstance(c, dict)}
    out = []
    for kind, true, reason, message in wanted:
        status = "True" if true else "False"
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": kind,
                "status": status,
                "observedGeneration": obj.generation,
                "lastTransitionTime": since or _time(now),
                "reason": reason,
                "message": message,
            }
        )
    return out


class _Sources:
    """What is in force at a scope: a winning object, a NATS policy, or the default."""

    def __init__(self, winners: Mapping[str, PolicyObject], nats: Mapping[str, Policy]) -> None:
        self.winners, self.nats = winners, nats

    def in_force(self, scope: PolicyScope) -> str:
        for link in scope_chain(scope):
            if (winner := self.winners.get(link.key)) is not None:
                return winner.ref
            if link.key in self.nats:
                return f"nats:{link.key}"
        return "default"


def plan_sync(
    objects: Iterable[PolicyObject], stored: Mapping[str, Policy], now: datetime
) -> SyncPlan:
    """See the module doc. ``stored``: the bucket's entries, decoded, by key."""
    synced = {
        k.removeprefix(KUBERNETES_PREFIX): p
        for k, p in stored.items()
        if k.startswith(KUBERNETES_PREFIX)
    }
    nats = {k: p for k, p in stored.items() if not k.startswith(KUBERNETES_PREFIX)}
    valid: dict[ObjectKey, Policy] = {}
    invalid: dict[ObjectKey, str] = {}
    scopes: dict[ObjectKey, PolicyScope | None] = {}
    ordered = sorted(objects, key=lambda o: (o.created, o.name, o.kind, o.namespace))
    for obj in ordered:
        try:
            scopes[obj.key] = scope_of(obj)
        except InvalidPolicyError:
            scopes[obj.key] = None
        try:
            valid[obj.key] = to_policy(obj)
        except InvalidPolicyError as exc:
            invalid[obj.key] = str(exc)
    winners: dict[str, PolicyObject] = {}
    for obj in ordered:  # oldest first: the first valid object of a scope wins
        if obj.key in valid:
            winners.setdefault(valid[obj.key].scope.key, obj)

    puts: dict[str, Policy] = {}
    revisions: dict[str, int] = {}
    for scope_key, obj in winners.items():
        policy, previous = valid[obj.key], synced.get(scope_key)
        if previous is not None and _settings(previous) == _settings(policy):
            revisions[scope_key] = previous.revision
            continue
        stored_policy = next_revision(policy, previous)
        puts[kubernetes_key(scope_key)] = stored_policy
        revisions[scope_key] = stored_policy.revision
    deletes = tuple(sorted(kubernetes_key(k) for k in synced if k not in winners))

    sources = _Sources(winners, nats)
    statuses: dict[ObjectKey, dict[str, Any]] = {}
    newly_invalid = []
    states = {(k, s): 0 for k in (NAMESPACED_KIND, CLUSTER_KIND) for s in STATES}
    for obj in ordered:
        scope = scopes[obj.key]
        status: dict[str, Any] = {
            "observedGeneration": obj.generation,
            "target": obj.target,
        }
        if scope is not None:
            status["scope"] = scope.key
            status["inForce"] = sources.in_force(scope)
        if (reason := invalid.get(obj.key)) is not None:
            states[obj.kind, "invalid"] += 1
            wanted = [
                (READY, False, "Invalid", "not in force: the policy is invalid"),
                (INVALID, True, "ValidationFailed", reason[:4000]),
                (SHADOWED, False, "Invalid", "the policy is invalid"),
            ]
            if not _reported_invalid(obj):
                newly_invalid.append((obj, reason))
        else:
            policy = valid[obj.key]
            winner = winners[policy.scope.key]
            status |= {
                "policyRevision": revisions[policy.scope.key],
                "mode": policy.mode.value,
                "minFraction": policy.min_fraction,
                "maxFraction": policy.max_fraction,
            }
            if winner is obj:
                states[obj.kind, "ready"] += 1
                message = f"in force at scope {policy.scope.key}"
                if policy.scope.key in nats:
                    message += " (over the policy set over NATS at the same scope)"
                wanted = [
                    (READY, True, "InForce", message),
                    (INVALID, False, "Valid", "the policy is valid"),
                    (SHADOWED, False, "InForce", "no older object sets this scope"),
                ]
            else:
                states[obj.kind, "shadowed"] += 1
                message = f"{winner.ref} (older) sets scope {policy.scope.key}"
                wanted = [
                    (READY, False, "Shadowed", message),
                    (INVALID, False, "Valid", "the policy is valid"),
                    (SHADOWED, True, "OlderPolicyWins", message),
                ]
        status["conditions"] = _conditions(obj, wanted, now)
        if status != dict(obj.status):
            statuses[obj.key] = status
    return SyncPlan(puts, deletes, statuses, tuple(newly_invalid), states)


def _reported_invalid(obj: PolicyObject) -> bool:
    """Its status already says Invalid at this generation (reported before a restart)."""
    for c in obj.status.get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == INVALID and c.get("status") == "True":
            return bool(c.get("observedGeneration") == obj.generation)
    return False


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from one status to the next (fields gone are nulled)."""
    return {"status": {**{k: None for k in old if k not in new}, **new}}
