"""Leader election on a Kubernetes Lease: one actuator replica acts, the others stand by.

The asyncio elector. Three layers, from pure to I/O:

- :func:`~fracpilot_actuator.election.core.decide_lease` is pure: the Lease as read (or
  none), my identity and the time in, *acquire*, *renew* or *stand by* out, with the reason
  and the record to write.
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
import logging
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from fracpilot_actuator.election.core import (
    ElectionCore,
    ElectionTiming,
    LeaseStore,
    RoundOutcome,
    RoundResult,
)
from fracpilot_actuator.metrics import LeaderMetrics
from fracpilot_libs.deadlines import cancel_and_wait, within

log = logging.getLogger(__name__)

# --- the asyncio elector -------------------------------------------------------------------------


def default_identity() -> str:
    """``<hostname>_<random>``: the pod name, unique across restarts with the same name."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


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
            elif result.outcome is RoundOutcome.STANDING_BY:
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
            await cancel_and_wait(self._task)
            self._task = None
        if release:
            loop = asyncio.get_running_loop()
            try:
                # Queued behind a round still in flight, so it sees that round's write.
                released = await within(
                    loop.run_in_executor(self._executor, self.core.release, self._clock()),
                    self.timing.renew_deadline_s,
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
