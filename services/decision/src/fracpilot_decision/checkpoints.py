"""Checkpoints of the engine's per-workload state, so a restarted decision service keeps history.

States live in the KV bucket ``fracpilot_decision_state`` under ``subjects.kv_key(workload)``,
as :func:`fracpilot_decision.engine.dump_state` writes them. The workloads whose state changed
are written in batches every ``checkpoint_interval_s`` and once more on a graceful shutdown,
after the consumers have stopped, so that last checkpoint holds every acknowledged sample. All
are restored on start, before any sample is consumed. A crash loses at most one interval of
history (samples already acknowledged), which only delays a downsize by as much. A checkpoint
that does not load is logged, counted and skipped: that workload starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from nats.js.errors import InvalidKeyError
from prometheus_client import CollectorRegistry, Counter

from fracpilot_decision.engine import WorkloadState, dump_state, load_state
from fracpilot_libs import subjects
from fracpilot_libs.bus import Bus

log = logging.getLogger(__name__)
_BATCH = 128  # KV writes in flight at once


class Checkpointer:
    """Remembers which workloads changed and writes their states to the KV bucket."""

    def __init__(self, bus: Bus, registry: CollectorRegistry, interval_s: float) -> None:
        self._bus = bus
        self.interval_s = interval_s
        self._dirty: set[str] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.written = Counter(
            "fracpilot_decision_checkpoints_written_total",
            "Workload state checkpoints written",
            registry=registry,
        )
        self.write_failures = Counter(
            "fracpilot_decision_checkpoint_write_failures_total",
            "Checkpoint writes that failed (retried at the next interval)",
            registry=registry,
        )
        self.restored = Counter(
            "fracpilot_decision_checkpoints_restored_total",
            "Workload states restored from checkpoints on start",
            registry=registry,
        )
        self.corrupt = Counter(
            "fracpilot_decision_checkpoints_corrupt_total",
            "Checkpoints that did not load and were skipped",
            registry=registry,
        )

    def mark(self, key: str) -> None:
        """The workload's state changed: write it at the next checkpoint."""
        self._dirty.add(key)

    async def restore(self) -> dict[str, WorkloadState]:
        """Every workload state in the bucket; corrupt checkpoints are skipped."""
        states: dict[str, WorkloadState] = {}
        corrupt = 0
        for key, data in (await self._bus.kv_values(subjects.DECISION_STATE_BUCKET)).items():
            try:
                states[key] = load_state(data)
            except Exception as exc:  # any failure to load means a corrupt checkpoint
                corrupt += 1
                self.corrupt.inc()
                log.error(
                    "corrupt checkpoint skipped, the workload starts afresh",
                    extra={"key": key, "error": str(exc)[:500], "size": len(data)},
                )
        self.restored.inc(len(states))
        log.info(
            "checkpoints restored",
            extra={"workloads": len(states), "corrupt": corrupt},
        )
        return states

    async def flush(self, states: Mapping[str, WorkloadState]) -> int:
        """Write the changed workloads' states; returns how many were written."""
        if not self._dirty:
            return 0
        kv = await self._bus.kv(subjects.DECISION_STATE_BUCKET)
        keys = [k for k in self._dirty if k in states]
        self._dirty.clear()
        written = 0
        for i in range(0, len(keys), _BATCH):
            batch = keys[i : i + _BATCH]
            results = await asyncio.gather(
                *(kv.put(k, dump_state(states[k])) for k in batch), return_exceptions=True
            )
            for key, result in zip(batch, results, strict=True):
                if not isinstance(result, BaseException):
                    written += 1
                    continue
                self.write_failures.inc()
                if not isinstance(result, InvalidKeyError):  # a bad key will never work
                    self._dirty.add(key)
                log.warning(
                    "checkpoint write failed", extra={"key": key, "error": repr(result)[:500]}
                )
        self.written.inc(written)
        return written

    def start(self, states: Mapping[str, WorkloadState]) -> None:
        """Checkpoint the changed workloads every interval, in the background."""
        self._task = asyncio.create_task(self._loop(states), name="checkpoints")

    async def _loop(self, states: Mapping[str, WorkloadState]) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            if self._stop.is_set():
                return
            try:
                await self.flush(states)
            except Exception as exc:  # NATS trouble: the next interval tries again
                log.warning("checkpoint failed", extra={"error": repr(exc)})

    async def stop(self, states: Mapping[str, WorkloadState]) -> None:
        """Stop the interval loop (it finishes a write in progress), then write the rest."""
        self._stop.set()
        if self._task is not None:
            await self._task
        written = await self.flush(states)
        log.info("final checkpoint written", extra={"workloads": written})
