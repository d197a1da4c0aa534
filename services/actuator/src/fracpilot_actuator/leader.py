"""Leader election on a Kubernetes Lease: one actuator replica acts, the others stand by.

Three layers, from pure to I/O:

- :func:`decide` is pure: the Lease as read (or none), my identity and the time in, *acquire*,
  *renew* or *stand by* out, with the reason and the record to write.
- :class:`ElectionCore` runs one elector's rounds against a :class:`LeaseStore`: read, decide,
  write with optimistic concurrency (a write carries the version it read; a conflict means
  another elector wrote first, so it reads again). It takes the time as an argument and never
  sleeps, so a simulation can interleave several cores on one store and one clock.
  :class:`KubernetesLeaseStore` is the store on ``coordination.k8s.io/v1`` Leases;
  :class:`MemoryLeaseStore` is one in a dict, for tests and single-process runs.
- :class:`LeaderElector` is the asyncio face: it runs the rounds (blocking client calls) in a
  thread of its own, renews every ``renew_period_s``, retries every ``retry_period_s`` while it
  stands by, fires ``on_started_leading`` / ``on_stopped_leading``, keeps the
  ``fracpilot_actuator_leader`` gauge, and releases the Lease on a graceful stop.

Why two leaders never overlap. A holder writes ``renewTime = t`` (its clock when it decided) and
leads until ``t + renew_deadline_s`` at the latest, unless a later write of its own succeeds;
another elector takes the Lease over only when its own clock says ``now >= renewTime +
leaseDurationSeconds``. With ``renew_deadline_s <= lease_duration_s`` the holder has stopped
before anyone may take over, whatever the request latencies, provided the electors' clocks
differ by at most ``lease_duration_s - renew_deadline_s`` (5 s with the defaults; nodes run
NTP). Every write is conditional on the version read, so of two electors racing for an
expired or released Lease exactly one succeeds. An actuator must still check
:attr:`LeaderElector.is_leader` right before each change it makes: a change already in flight
when the deadline passes is covered by that same margin, not by the Lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from kubernetes.client import ApiClient, CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "fracpilot-actuator"


# --- the pure decision ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    """The part of a Lease's spec that leader election reads and writes.

    ``holder`` is empty when nobody holds the Lease (never taken, or released).
    """

    holder: str
    renew_time: datetime | None
    lease_duration_s: int
    transitions: int = 0
    acquire_time: datetime | None = None

    def expires_at(self) -> datetime | None:
        """When another elector may take the Lease over (None: it may now)."""
        if not self.holder or self.renew_time is None:
            return None
        return self.renew_time + timedelta(seconds=self.lease_duration_s)


class Action(StrEnum):
    ACQUIRE = "acquire"
    RENEW = "renew"
    STAND_BY = "stand_by"


class Reason(StrEnum):
    NO_LEASE = "no_lease"  # the Lease does not exist yet
    RELEASED = "released"  # the Lease exists and nobody holds it
    HELD_BY_ME = "held_by_me"
    EXPIRED = "expired"  # its holder did not renew it in time
    HELD_BY_OTHER = "held_by_other"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason
    detail: str
    record: LeaseRecord | None  # what to write (acquire, renew); None to stand by
    holder: str = ""  # who holds the Lease as read
    expires_at: datetime | None = None  # standing by: when the holder's Lease runs out


def decide(
    current: LeaseRecord | None, identity: str, now: datetime, lease_duration_s: int
) -> Decision:
    """What an elector named ``identity`` does at ``now`` with the Lease it read."""
    if not identity:
        raise ValueError("an elector needs a non-empty identity")

    def mine(transitions: int, acquired: datetime) -> LeaseRecord:
        return LeaseRecord(identity, now, lease_duration_s, transitions, acquired)

    if current is None:
        return Decision(Action.ACQUIRE, Reason.NO_LEASE, "no lease yet: create it", mine(0, now))
    if current.holder == identity:
        return Decision(
            Action.RENEW,
            Reason.HELD_BY_ME,
            "held by me: renew",
            mine(current.transitions, current.acquire_time or now),
            holder=identity,
        )
    if not current.holder:
        return Decision(
            Action.ACQUIRE,
            Reason.RELEASED,
            "released: take it over",
            mine(current.transitions + 1, now),
        )
    expires = current.expires_at()  # None: a holder that never renewed
    if expires is not None and now < expires:
        return Decision(
            Action.STAND_BY,
            Reason.HELD_BY_OTHER,
            f"held by {current.holder} until {expires.isoformat()}",
            None,
            holder=current.holder,
            expires_at=expires,
        )
    return Decision(
        Action.ACQUIRE,
        Reason.EXPIRED,
        f"{current.holder} did not renew since {current.renew_time}: take it over",
        mine(current.transitions + 1, now),
        holder=current.holder,
    )


# --- stores --------------------------------------------------------------------------------------


class LeaseConflictError(Exception):
    """The Lease changed since it was read (409): another elector wrote first."""


class LeaseStore(Protocol):
    """One Lease with optimistic concurrency; versions are opaque strings."""

    def get(self) -> tuple[LeaseRecord, str] | None:
        """The record and its version, or None when there is no Lease."""
        ...

    def create(self, record: LeaseRecord) -> tuple[LeaseRecord, str]:
        """Create the Lease; raises :class:`LeaseConflictError` when it exists already."""
        ...

    def update(self, record: LeaseRecord, version: str) -> tuple[LeaseRecord, str]:
        """Write if the Lease is still at ``version``; else raise :class:`LeaseConflictError`."""
        ...


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


# --- one elector's rounds ------------------------------------------------------------------------


@dataclass(frozen=True)
class ElectionTiming:
    """Seconds. The holder renews every ``renew_period_s`` and gives up leading when it has not
    renewed for ``renew_deadline_s``; the others retry every ``retry_period_s`` and take the
    Lease over ``lease_duration_s`` after its last renewal."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    renew_period_s: float = 5.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.lease_duration_s < 1:
            raise ValueError("lease_duration_s must be at least 1 (the Lease counts seconds)")
        if not 0 < self.renew_period_s < self.renew_deadline_s <= self.lease_duration_s:
            raise ValueError(
                "need 0 < renew_period_s < renew_deadline_s <= lease_duration_s, got "
                f"{self.renew_period_s}, {self.renew_deadline_s}, {self.lease_duration_s}"
            )
        if not 0 < self.retry_period_s < self.renew_deadline_s:
            raise ValueError("need 0 < retry_period_s < renew_deadline_s")


class Outcome(StrEnum):
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    STANDING_BY = "standing_by"
    CONFLICT = "conflict"  # lost two races in a row: try again later


@dataclass(frozen=True)
class Attempt:
    """A decision taken at ``now`` on the Lease at ``version``, not written yet."""

    decision: Decision
    version: str | None
    now: datetime


@dataclass(frozen=True)
class RoundResult:
    outcome: Outcome
    decision: Decision
    leading_until: datetime | None  # when the elector stops leading unless it renews first

    @property
    def holds(self) -> bool:
        return self.outcome in (Outcome.ACQUIRED, Outcome.RENEWED)


class ElectionCore:
    """One elector's state and rounds. Not thread-safe: use it from one thread at a time."""

    def __init__(self, store: LeaseStore, identity: str, timing: ElectionTiming) -> None:
        if not identity:
            raise ValueError("an elector needs a non-empty identity")
        self.store = store
        self.identity = identity
        self.timing = timing
        self.leading_until: datetime | None = None
        self.observed: LeaseRecord | None = None
        self._version: str | None = None  # of the Lease as last read or written

    def is_leader(self, now: datetime) -> bool:
        return self.leading_until is not None and now < self.leading_until

    def observe(self, now: datetime) -> Attempt | RoundResult:
        """Read the Lease and decide; standing by ends any leadership at once."""
        found = self.store.get()
        record, version = found if found is not None else (None, None)
        self.observed, self._version = record, version
        decision = decide(record, self.identity, now, self.timing.lease_duration_s)
        if decision.action is Action.STAND_BY:
            if self.leading_until is not None:
                log.warning("lost the lease", extra={"detail": decision.detail})
            self.leading_until = None
            return RoundResult(Outcome.STANDING_BY, decision, None)
        return Attempt(decision, version, now)

    def commit(self, attempt: Attempt) -> RoundResult:
        """Write what ``attempt`` decided; raises :class:`LeaseConflictError` if the Lease moved."""
        record = attempt.decision.record
        assert record is not None
        if attempt.version is None:
            written, version = self.store.create(record)
        else:
            written, version = self.store.update(record, attempt.version)
        self.observed, self._version = written, version
        # Lead until the deadline counted from the renewTime written (the decision's time).
        self.leading_until = attempt.now + timedelta(seconds=self.timing.renew_deadline_s)
        renewing = attempt.decision.action is Action.RENEW
        return RoundResult(
            Outcome.RENEWED if renewing else Outcome.ACQUIRED,
            attempt.decision,
            self.leading_until,
        )

    def round(self, now: datetime) -> RoundResult:
        """Read, decide, write; after a conflict read once more (someone else won the race)."""
        for _ in range(2):
            step = self.observe(now)
            if isinstance(step, RoundResult):
                return step
            try:
                return self.commit(step)
            except LeaseConflictError:
                continue
        # Still racing. A leadership already held stays bounded by its own deadline.
        return RoundResult(Outcome.CONFLICT, step.decision, self.leading_until)

    def release(self, now: datetime) -> bool:
        """Stop leading, then hand the Lease back if this elector still holds it.

        Writes an empty holder (the others take it over at their next retry) with the version
        of the last read or write: if the Lease moved since, someone else holds it and there
        is nothing to release. Returns True when the release was written.
        """
        self.leading_until = None
        held = self.observed
        if held is None or held.holder != self.identity or self._version is None:
            return False
        released = replace(held, holder="", renew_time=now)
        try:
            self.observed, self._version = self.store.update(released, self._version)
        except LeaseConflictError:
            return False
        return True


# --- the asyncio elector -------------------------------------------------------------------------


def default_identity() -> str:
    """``<hostname>_<random>``: the pod name, unique across restarts with the same name."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge(
            "fracpilot_actuator_leader",
            "1 while this actuator holds the leader Lease and may act, else 0",
            registry=registry,
        )
        self.transitions = Counter(
            "fracpilot_actuator_leader_transitions_total",
            "Times this actuator started or stopped leading",
            ["to"],
            registry=registry,
        )
        self.rounds = Counter(
            "fracpilot_actuator_lease_rounds_total",
            "Lease rounds (read, decide, write) by outcome",
            ["outcome"],
            registry=registry,
        )


Callback = Callable[[], None]


class LeaderElector:
    """Keeps this process's claim on the Lease; :attr:`is_leader` says whether it may act now.

    Callbacks run in the event loop and must not block (start a task for async work);
    :attr:`leading` is set while leading. The blocking store calls run in one thread of
    their own, in order, so a hung request delays the next round but never the deadline: a
    timer stops the leadership at ``renew_deadline_s`` after the last successful renewal.
    """

    def __init__(
        self,
        store: LeaseStore,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        *,
        registry: CollectorRegistry | None = None,
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.identity = identity or default_identity()
        self.timing = timing or ElectionTiming()
        self.core = ElectionCore(store, self.identity, self.timing)
        self.metrics = LeaderMetrics(registry if registry is not None else CollectorRegistry())
        self.metrics.leader.set(0)
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.leading = asyncio.Event()
        self.last_result: RoundResult | None = None
        self._clock = clock or (lambda: datetime.now(UTC))
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="leader-election"
        )
        self._deadline: float | None = None  # time.monotonic() when leadership ends
        self._watchdog: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # --- state ----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only while this process holds the Lease within its renew deadline."""
        return self._deadline is not None and time.monotonic() < self._deadline

    async def wait_for_leadership(self) -> None:
        """Return once leading (wrap it in ``asyncio.timeout`` to bound the wait)."""
        await self.leading.wait()

    def _start_leading(self, deadline: float) -> None:
        self._deadline = deadline
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = asyncio.get_running_loop().call_later(
            deadline - time.monotonic(), self._stop_leading, "renew deadline passed"
        )
        if self.leading.is_set():
            return
        self.leading.set()
        self.metrics.leader.set(1)
        self.metrics.transitions.labels("leader").inc()
        log.info("started leading", extra={"identity": self.identity})
        self._call(self.on_started_leading)

    def _stop_leading(self, why: str) -> None:
        self._deadline = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if not self.leading.is_set():
            return
        self.leading.clear()
        self.metrics.leader.set(0)
        self.metrics.transitions.labels("standby").inc()
        log.warning("stopped leading", extra={"identity": self.identity, "reason": why})
        self._call(self.on_stopped_leading)

    @staticmethod
    def _call(callback: Callback | None) -> None:
        if callback is None:
            return
        try:
            callback()
        except Exception:
            log.exception("a leader-election callback failed")

    # --- the loop -------------------------------------------------------------------------

    async def start(self) -> None:
        """Run the election in the background until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"leader-{self.identity}")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        t = self.timing
        while not self._stopped:
            started = time.monotonic()
            now = self._clock()
            try:
                result = await loop.run_in_executor(self._executor, self.core.round, now)
            except Exception as exc:
                log.warning(
                    "lease round failed", extra={"identity": self.identity, "error": repr(exc)}
                )
                self.metrics.rounds.labels("error").inc()
                await self._sleep(started + t.retry_period_s)
                continue
            self.last_result = result
            self.metrics.rounds.labels(result.outcome.value).inc()
            if result.holds:
                deadline = started + t.renew_deadline_s
                if deadline > time.monotonic():
                    self._start_leading(deadline)
                await self._sleep(started + t.renew_period_s)
            elif result.outcome is Outcome.STANDING_BY:
                self._stop_leading(result.decision.detail)
                await self._sleep(started + self._standby_wait(result, now))
            else:
                await self._sleep(started + t.retry_period_s)

    def _standby_wait(self, result: RoundResult, now: datetime) -> float:
        """Retry after the retry period, or right when the holder's Lease runs out if sooner."""
        retry = self.timing.retry_period_s
        expires = result.decision.expires_at
        if expires is None:
            return retry
        return max(0.0, min(retry, (expires - now).total_seconds() + 0.001))

    @staticmethod
    async def _sleep(until: float) -> None:
        await asyncio.sleep(max(0.0, until - time.monotonic()))

    async def stop(self, *, release: bool = True) -> None:
        """Stop leading at once; then hand the Lease back (``release``) so another replica
        takes over at its next retry instead of after the lease duration.

        ``release=False`` leaves the Lease as a crashed process would (tests use it).
        """
        self._stopped = True
        self._stop_leading("stopping")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if release:
            loop = asyncio.get_running_loop()
            try:
                # Queued behind a round still in flight, so it sees that round's write.
                released = await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self.core.release, self._clock()),
                    timeout=self.timing.renew_deadline_s,
                )
                if released:
                    log.info("released the lease", extra={"identity": self.identity})
            except Exception as exc:
                log.warning("could not release the lease", extra={"error": repr(exc)})
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> LeaderElector:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
