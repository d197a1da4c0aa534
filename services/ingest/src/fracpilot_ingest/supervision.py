"""Keeps every usage source running: a source's task that raises is not the end of ingestion.

A source counts and logs its own failed reads (:mod:`fracpilot_ingest.sources.base`); an
exception that escapes it (a bug, bad data it did not expect, NATS trouble while publishing)
would end its task silently. :class:`SourceSupervisor` runs each source's loop, and when it
raises logs the exception, counts it (``fracpilot_ingest_source_crashes_total{source}``) and
runs it again (from ``open``) after a jittered pause doubling from ``backoff_s`` up to
``backoff_max_s`` (tenacity's ``wait_exponential_jitter``). A source that crashed
``failing_after`` times in a row, with no completed read in between, makes the service not
ready (:meth:`SourceSupervisor.problem`, a readiness check) until it completes one again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter
from tenacity import AsyncRetrying, RetryCallState, wait_exponential_jitter

from fracpilot_ingest.sources.base import Source

log = logging.getLogger(__name__)


class SourceSupervisor:
    """Runs sources with ``run`` (one source's loop, returning when the source has produced
    all it will), restarting one that raises."""

    def __init__(
        self,
        run: Callable[[Source], Awaitable[None]],
        crashes: Counter,
        *,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        failing_after: int = 3,
    ) -> None:
        self._run = run
        self._crashes = crashes
        self._wait = wait_exponential_jitter(
            multiplier=backoff_s, max=backoff_max_s, jitter=backoff_s
        )
        self._failing_after = failing_after
        self.failures: dict[str, int] = {}  # crashes in a row, by source name

    def progressed(self, source: Source) -> None:
        """The source completed a read: its run of crashes is over."""
        self.failures[source.name] = 0

    def problem(self) -> str | None:
        """Why ingestion is not ready: a source that keeps crashing (None: none does)."""
        failing = sorted(n for n, c in self.failures.items() if c >= self._failing_after)
        if not failing:
            return None
        return "usage source failing: " + ", ".join(
            f"{n} ({self.failures[n]} crashes in a row)" for n in failing
        )

    async def supervise(self, source: Source) -> None:
        """Run the source until it ends; after a crash, again after a pause."""
        while True:
            try:
                await self._run(source)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self.failures.get(source.name, 0) + 1
                self.failures[source.name] = failures
                self._crashes.labels(source.name).inc()
                pause = self.pause(failures)
                log.error(
                    "usage source crashed: restarting it",
                    exc_info=exc,
                    extra={
                        "source": source.name,
                        "crashes_in_a_row": failures,
                        "restart_in_s": round(pause, 2),
                    },
                )
            await asyncio.sleep(pause)

    def pause(self, failures: int) -> float:
        """Seconds before the restart after ``failures`` crashes in a row."""
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.attempt_number = failures
        return float(self._wait(state))
