"""Each workload's current target, held in memory and kept current from the targets KV bucket.

The admission webhook answers from this cache, so an admission never waits on NATS. The cache
follows ``subjects.TARGET_BUCKET`` with :meth:`Bus.watch_kv`: every value present at the start,
then every change; a deleted key removes the workload's target. It is a read-only mapping from
KV key (``subjects.kv_key(workload)``) to :class:`WorkloadTarget`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping

from fracpilot_libs.contracts import WorkloadRef, WorkloadTarget
from fracpilot_libs.deadlines import event_set
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus

log = logging.getLogger(__name__)


class TargetCache(Mapping[str, WorkloadTarget]):
    """KV key -> WorkloadTarget, for the webhook; :attr:`synced` once the initial values are in."""

    def __init__(self) -> None:
        self._targets: dict[str, WorkloadTarget] = {}
        self._initial: asyncio.Event | None = None

    async def start(self, bus: Bus) -> None:
        """Follow the targets bucket in the background (stops with the bus's consumers)."""
        self._initial = await bus.watch_kv(subjects.TARGET_BUCKET, WorkloadTarget, self.on_update)

    @property
    def synced(self) -> bool:
        """True once every target present when :meth:`start` ran has been loaded."""
        return self._initial is not None and self._initial.is_set()

    async def wait_synced(self, timeout_s: float = 30.0) -> bool:
        if self._initial is None:
            raise RuntimeError("the target cache is not started")
        return await event_set(self._initial, timeout_s)

    async def on_update(self, key: str, target: WorkloadTarget | None) -> None:
        """One KV change: a new or changed target, or ``None`` for a deleted key."""
        if target is None:
            if self._targets.pop(key, None) is not None:
                log.info("target removed", extra={"key": key})
            return
        expected = subjects.kv_key(target.workload)
        if key != expected:  # it would be applied to the wrong workload: refuse it
            log.warning(
                "target stored under another workload's key: ignored",
                extra={"key": key, "expected_key": expected, "decision_id": target.decision_id},
            )
            self._targets.pop(key, None)
            return
        self._targets[key] = target
        log.debug(
            "target updated",
            extra={"key": key, "fraction": target.fraction, "decision_id": target.decision_id},
        )

    def for_workload(self, workload: WorkloadRef) -> WorkloadTarget | None:
        return self._targets.get(subjects.kv_key(workload))

    def __getitem__(self, key: str) -> WorkloadTarget:
        return self._targets[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)
