"""Policies as messages: the decision service's policy store.

Policies live in the KV bucket ``fracpilot_policies`` under their scope's key: ``cluster``,
``namespace.<ns>`` or ``workload.<ns>.<name>``.

**Resolution** is :mod:`fracpilot_libs.sizing.policies` (pure): the most specific stored policy,
taken as a whole, else the configured cluster default, else the built-in defaults. At one scope
a policy synced from a Kubernetes object (key ``kubernetes.<scope key>``, written by the
actuator's policy sync) wins over the one set here, which is stored all the same.

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
payload, and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from fracpilot_libs.contracts import Policy, PolicyReply, PolicyScope
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.decoding import DecodeError, ErrorKind, decode
from fracpilot_libs.nats.kv import KvBucket, RevisionMismatchError
from fracpilot_libs.sizing.policies import (
    next_revision,
    parse_scope,
    resolve,
    scope_chain,
    scope_problem,
    source_keys,
)

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 5

# --- the KV adapter and the request endpoints -----------------------------------------------


class PolicyConflictError(RuntimeError):
    """The entry kept changing under a set: too many concurrent writers."""


class PolicyStore:
    """The policy bucket, and the set/get/list endpoints over it."""

    def __init__(
        self,
        bus: Bus,
        kv: KvBucket,
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
        entry = await self._kv.get(key)
        if entry is None:
            return None, None
        try:
            return decode(Policy, entry.value), entry.revision
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
        keys = tuple(k for s in scope_chain(scope) for k in source_keys(s.key))
        stored = {key: policy for key in keys if (policy := await self.get(key)) is not None}
        return resolve(stored, keys, self.default)

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
            except RevisionMismatchError:
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
