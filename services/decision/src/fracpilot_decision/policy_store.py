"""Policies as messages: the decision service's policy store.

Policies live in the KV bucket ``fracpilot_policies`` under their scope's key: ``cluster``,
``namespace.<ns>`` or ``workload.<ns>.<name>``.

**Resolution.** A workload is sized by the *most specific* stored policy, taken *as a whole*:
workload > namespace > cluster > the configured cluster default (``FRACPILOT_POLICY_JSON``) >
the built-in defaults of :class:`~fracpilot_libs.contracts.Policy`. Fields are never merged
across levels (a namespace policy that sets only ``max_fraction`` still brings every other
field's default), so the policy ``fracpilot policy get`` shows is exactly the one the engine
uses, and its ``scope`` says where it came from.

**Requests** (core NATS request/reply in the queue group ``subjects.POLICY_QUEUE``, so decision
replicas share them; every reply is a :class:`~fracpilot_libs.contracts.PolicyReply`):

* ``subjects.POLICY_SET``: a ``Policy``. It is validated and stored under its scope's key with
  ``revision`` = the stored revision + 1 (or 1); the ``revision`` in the request is ignored.
  Concurrent sets are serialised by a compare-and-set on the KV entry. Reply: the stored policy.
* ``subjects.POLICY_GET``: a ``PolicyScope``, a ``WorkloadRef`` (its workload scope) or an
  empty payload (the cluster scope). Reply: the effective policy for that scope, read from the
  bucket (so a get right after a set sees it, whichever replica answers).
* ``subjects.POLICY_LIST``: any payload. Reply: every stored policy, ordered by scope key.

An invalid request is answered ``ok=False`` with the reason, dead-lettered with the raw
payload, and changes nothing. Functions above :class:`LivePolicies` are pure.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from fracpilot_libs import subjects
from fracpilot_libs.bus import Bus, DecodeError, ErrorKind, decode
from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyReply, PolicyScope, WorkloadRef

log = logging.getLogger(__name__)

_NAMESPACE = re.compile(r"[-/_=A-Za-z0-9]+")
_WORKLOAD = re.compile(r"[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*")
_CAS_ATTEMPTS = 5

# --- pure resolution ------------------------------------------------------------------------


def scope_chain(scope: PolicyScope) -> tuple[PolicyScope, ...]:
    """The scope and the scopes above it, most specific first."""
    chain = [scope]
    if scope.level is PolicyLevel.WORKLOAD:
        chain.append(PolicyScope(level=PolicyLevel.NAMESPACE, namespace=scope.namespace))
    if scope.level is not PolicyLevel.CLUSTER:
        chain.append(PolicyScope())
    return tuple(chain)


def workload_scope(workload: WorkloadRef) -> PolicyScope:
    return PolicyScope(
        level=PolicyLevel.WORKLOAD, namespace=workload.namespace, workload=workload.owner_name
    )


def _chain_keys(namespace: str, name: str) -> tuple[str, str, str]:
    """The keys of a workload's scope chain, as ``PolicyScope.key`` spells them; plain string
    work, no model (this runs for every sample, of every one of 100,000 workloads)."""
    return (
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

    Raises :class:`~fracpilot_libs.bus.DecodeError` with a readable reason.
    """
    if not data.strip():
        return PolicyScope()
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # also too deep, or an integer too long
        raise DecodeError("decode", f"not valid JSON: {str(exc)[:500]}") from exc
    if isinstance(body, dict) and "owner_name" in body:
        return workload_scope(decode(WorkloadRef, data))
    return decode(PolicyScope, data)


def next_revision(policy: Policy, previous: Policy | None) -> Policy:
    """The policy as the store keeps it: the previous revision + 1, or 1."""
    return policy.model_copy(update={"revision": (previous.revision if previous else 0) + 1})


class LivePolicies:
    """The stored policies as last seen, kept current by the KV watch; resolves per workload."""

    def __init__(self, default: Policy) -> None:
        self.default = default
        self.stored: dict[str, Policy] = {}

    def apply(self, key: str, policy: Policy | None) -> None:
        if policy is None:
            self.stored.pop(key, None)
        else:
            self.stored[key] = policy

    def for_workload(self, workload: WorkloadRef) -> Policy:
        if not self.stored:
            return self.default
        keys = _chain_keys(workload.namespace, workload.owner_name)
        return resolve(self.stored, keys, self.default)


# --- the KV adapter and the request endpoints -----------------------------------------------


class PolicyConflictError(RuntimeError):
    """The entry kept changing under a set: too many concurrent writers."""


class PolicyStore:
    """The policy bucket, and the set/get/list endpoints over it."""

    def __init__(
        self,
        bus: Bus,
        kv: KeyValue,
        default: Policy,
        on_stored: Callable[[str, Policy], None] | None = None,
    ) -> None:
        self._bus = bus
        self._kv = kv
        self.default = default
        self._on_stored = on_stored

    @classmethod
    async def open(
        cls,
        bus: Bus,
        default: Policy,
        on_stored: Callable[[str, Policy], None] | None = None,
    ) -> PolicyStore:
        return cls(bus, await bus.kv(subjects.POLICY_BUCKET), default, on_stored)

    async def serve(self) -> None:
        for subject, handler in (
            (subjects.POLICY_SET, self.handle_set),
            (subjects.POLICY_GET, self.handle_get),
            (subjects.POLICY_LIST, self.handle_list),
        ):
            await self._bus.serve(subject, subjects.POLICY_QUEUE, handler)

    # --- storage ----------------------------------------------------------------------------

    async def _entry(self, key: str) -> tuple[Policy | None, int | None]:
        """The stored policy (None if absent or unreadable) and its KV revision (None: absent)."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None, None
        try:
            return decode(Policy, entry.value or b""), entry.revision
        except DecodeError as exc:
            log.error(
                "stored policy does not decode, ignoring it",
                extra={"key": key, "reason": exc.reason},
            )
            return None, entry.revision

    async def get(self, key: str) -> Policy | None:
        return (await self._entry(key))[0]

    async def effective(self, scope: PolicyScope) -> Policy:
        """The policy that applies at ``scope``, read from the bucket (see the module doc)."""
        for s in scope_chain(scope):
            if (policy := await self.get(s.key)) is not None:
                return policy
        return self.default

    async def put(self, policy: Policy) -> Policy:
        """Store a valid policy with the next revision (compare-and-set against the entry)."""
        key = policy.scope.key
        for _ in range(_CAS_ATTEMPTS):
            previous, kv_revision = await self._entry(key)
            stored = next_revision(policy, previous)
            try:
                if kv_revision is None:
                    await self._kv.create(key, stored.to_json())
                else:
                    await self._kv.update(key, stored.to_json(), last=kv_revision)
            except KeyWrongLastSequenceError:
                continue  # another replica wrote it meanwhile: read again
            return stored
        raise PolicyConflictError(f"policy {key} changed {_CAS_ATTEMPTS} times during a set")

    async def all(self) -> list[Policy]:
        policies = []
        for key, value in sorted((await self._bus.kv_values(subjects.POLICY_BUCKET)).items()):
            try:
                policies.append(decode(Policy, value))
            except DecodeError as exc:
                log.error("stored policy does not decode", extra={"key": key, "reason": exc.reason})
        return policies

    # --- endpoints --------------------------------------------------------------------------

    async def handle_set(self, data: bytes, headers: Mapping[str, str]) -> bytes:
        try:
            policy = decode(Policy, data)
        except DecodeError as exc:
            return await self._refuse(subjects.POLICY_SET, data, headers, exc.kind, exc.reason)
        if problem := scope_problem(policy.scope):
            return await self._refuse(subjects.POLICY_SET, data, headers, "validation", problem)
        stored = await self.put(policy)
        if self._on_stored is not None:  # this replica decides with it at once
            self._on_stored(stored.scope.key, stored)
        log.info(
            "policy stored",
            extra={"scope": stored.scope.key, "revision": stored.revision},
        )
        return PolicyReply(ok=True, policy=stored).to_json()

    async def handle_get(self, data: bytes, headers: Mapping[str, str]) -> bytes:
        try:
            scope = parse_scope(data)
        except DecodeError as exc:
            return await self._refuse(subjects.POLICY_GET, data, headers, exc.kind, exc.reason)
        if problem := scope_problem(scope):
            return await self._refuse(subjects.POLICY_GET, data, headers, "validation", problem)
        return PolicyReply(ok=True, policy=await self.effective(scope)).to_json()

    async def handle_list(self, _data: bytes, _headers: Mapping[str, str]) -> bytes:
        return PolicyReply(ok=True, policies=await self.all()).to_json()

    async def _refuse(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str],
        kind: ErrorKind,
        reason: str,
    ) -> bytes:
        """Dead-letter an invalid request and answer it with the reason."""
        what = "policy" if subject == subjects.POLICY_SET else "policy scope"
        reason = f"invalid {what}: {reason}"
        try:
            await self._bus.dead_letter(subject, data, headers, kind, reason)
        except Exception as exc:  # the refusal still reaches the requester
            log.warning("could not dead-letter a policy request", extra={"error": repr(exc)})
        return PolicyReply(ok=False, error=reason).to_json()
