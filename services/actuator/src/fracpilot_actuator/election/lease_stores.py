"""Where the Lease lives: :class:`KubernetesLeaseStore` on ``coordination.k8s.io/v1`` Leases,
:class:`MemoryLeaseStore` in memory (tests and single-process runs); :class:`SeverableLeaseStore`
cuts a store off at will (tests of a leader that cannot renew)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from kubernetes.client import ApiClient, CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from fracpilot_actuator.election.core import (
    DEFAULT_LEASE_NAME,
    LeaseConflictError,
    LeaseRecord,
    LeaseStore,
)


class MemoryLeaseStore:
    """A Lease in memory (thread-safe): tests, simulations and single-process runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._record: LeaseRecord | None = None
        self._version = 0
        self.writes = 0

    def get(self) -> tuple[LeaseRecord, str] | None:
        with self._lock:
            return None if self._record is None else (self._record, str(self._version))

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        with self._lock:
            if self._record is not None:
                raise LeaseConflictError("the lease exists already")
            return self._write(record)

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        with self._lock:
            if self._record is None or str(self._version) != version:
                raise LeaseConflictError(f"the lease is not at version {version} any more")
            return self._write(record)

    def _write(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        self._record = record
        self._version += 1
        self.writes += 1
        return record, str(self._version)


class SeverableLeaseStore:
    """Another store, reached through a link that fails every call while ``down``: an
    apiserver out of reach, for tests and simulations."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("apiserver unreachable")

    def get(self) -> tuple[LeaseRecord, str] | None:
        self._check()
        return self.store.get()

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        self._check()
        return self.store.create(record)

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        self._check()
        return self.store.update(record, version)


def microtime(at: datetime) -> datetime:
    """A datetime the client serialises in a form the apiserver's MicroTime fields parse.

    The client (37.x) writes ``datetime.isoformat()``, which drops the fraction when the
    microseconds are 0, and a MicroTime field (Lease renewTime/acquireTime, events.k8s.io
    eventTime) then fails with 400 (layout ``...05.000000Z07:00``); a dict body does not help,
    the client turns it into its model first. One microsecond later is harmless: for a Lease it
    only delays the expiry, the safe direction.
    """
    at = at.astimezone(UTC)
    return at if at.microsecond else at + timedelta(microseconds=1)


class KubernetesLeaseStore:
    """A ``coordination.k8s.io/v1`` Lease; needs get, create and update on it (its namespace).

    Writes are replaces carrying the ``resourceVersion`` that was read, so the apiserver
    refuses (409) a write based on a stale read.
    """

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        request_timeout_s: float = 5.0,
    ) -> None:
        self._leases = CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.request_timeout_s = request_timeout_s

    def get(self) -> tuple[LeaseRecord, str] | None:
        try:
            lease = self._leases.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.request_timeout_s
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._record_of(lease)

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        try:
            lease = self._leases.create_namespaced_lease(
                self.namespace,
                self._lease(record, None),
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflictError(str(exc.reason)) from exc
            raise
        return self._record_of(lease)

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        try:
            lease = self._leases.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._lease(record, version),
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted or changed since it was read
                raise LeaseConflictError(str(exc.reason)) from exc
            raise
        return self._record_of(lease)

    def _lease(self, record: LeaseRecord, version: str | None) -> V1Lease:
        return V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=V1ObjectMeta(
                name=self.name, namespace=self.namespace, resource_version=version
            ),
            spec=V1LeaseSpec(
                holder_identity=record.holder or None,
                renew_time=microtime(record.renew_time) if record.renew_time else None,
                acquire_time=microtime(record.acquire_time) if record.acquire_time else None,
                lease_duration_seconds=record.lease_duration_s,
                lease_transitions=record.transitions,
            ),
        )

    @staticmethod
    def _record_of(lease: V1Lease) -> tuple[LeaseRecord, str]:
        spec = lease.spec
        version = lease.metadata.resource_version if lease.metadata else None
        if spec is None or not version:
            raise ValueError("the apiserver returned a Lease without spec or resourceVersion")
        record = LeaseRecord(
            holder=spec.holder_identity or "",
            renew_time=spec.renew_time,
            lease_duration_s=spec.lease_duration_seconds or 0,
            transitions=spec.lease_transitions or 0,
            acquire_time=spec.acquire_time,
        )
        return record, version
