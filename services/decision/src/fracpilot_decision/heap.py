"""Keeps Python's cyclic garbage collector off the workload states between rare full passes.

At 100,000 workloads the decision service holds about 350,000 objects the collector tracks,
and every sample replaces its workload's state, so the young objects promoted to the oldest
generation pass a quarter of it every few seconds and CPython runs a full collection: 80 ms
alone, up to 0.6 s on the shared 2-core bench machine, with every sample waiting behind it
(the p99 sample → decision latency was these pauses). States are acyclic and freed by
reference counting; the collector only needs to look at them for cycles, and they have none.

So every ``freeze_every_s`` the survivors are moved to the permanent generation
(``gc.freeze()``: a list splice, no scan). Frozen objects are still freed when their last
reference goes; only a cycle among them would outlive its use, so every
``full_collection_every_s`` everything is unfrozen and collected once (that pause is timed in
``fracpilot_gc_full_collection_seconds``), then frozen again.

The frozen objects are counted (``fracpilot_gc_frozen_objects``) after the first freeze, each
full collection and at most once a minute: ``gc.get_freeze_count()`` walks the whole frozen
list (36 ms at 100,000 workloads; counted every second it cost 3% of a core, 6 µs a sample).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from prometheus_client import CollectorRegistry

from fracpilot_decision.metrics import HeapMetrics
from fracpilot_decision.settings import HeapSettings
from fracpilot_libs.deadlines import cancel_and_wait

log = logging.getLogger(__name__)
COUNT_EVERY_S = 60.0  # how often the frozen objects are counted (a walk over them all)


class HeapFreezer:
    """Freezes the surviving objects periodically; unfreezes and collects them rarely."""

    def __init__(
        self, freeze_every_s: float, full_collection_every_s: float, registry: CollectorRegistry
    ) -> None:
        self.freeze_every_s = freeze_every_s
        self.full_collection_every_s = full_collection_every_s
        metrics = HeapMetrics(registry)
        self.full_pause, self.frozen = metrics.full_pause, metrics.frozen
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def configured(cls, settings: HeapSettings, registry: CollectorRegistry) -> HeapFreezer:
        return cls(settings.freeze_interval_s, settings.full_interval_s, registry)

    def start(self) -> None:
        if self.freeze_every_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="heap-freezer")

    async def stop(self) -> None:
        """Stop freezing and give everything back to the collector."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        gc.unfreeze()

    def full_collection(self) -> float:
        """Unfreeze, collect every generation, freeze again; the pause in seconds."""
        started = time.perf_counter()
        gc.unfreeze()
        unreachable = gc.collect()
        gc.freeze()
        pause = time.perf_counter() - started
        self.full_pause.observe(pause)
        log.info(
            "full garbage collection",
            extra={"pause_ms": round(pause * 1000, 1), "unreachable": unreachable},
        )
        return pause

    async def _run(self) -> None:
        last_full = time.monotonic()
        counted = -COUNT_EVERY_S
        while True:
            await asyncio.sleep(self.freeze_every_s)
            now = time.monotonic()
            full = now - last_full >= self.full_collection_every_s
            if full:
                self.full_collection()
                last_full = now
            else:
                gc.freeze()
            if full or now - counted >= COUNT_EVERY_S:
                counted = now
                self.frozen.set(gc.get_freeze_count())
