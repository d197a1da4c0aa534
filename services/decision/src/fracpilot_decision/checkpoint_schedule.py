"""When each owned partition is checkpointed, and the checkpoint itself (states, then mark).

A partition is checkpointed every ``checkpoint.interval_s``, as soon as it has gone quiet for
``checkpoint.when_idle_s``, and at once when one has decided half of ``max_unacked`` since its
last mark (:meth:`CheckpointScheduler.urge`). Busy partitions are checkpointed one at a time,
the most overdue first, one every ``interval / partitions``, so that at 100,000 workloads the
writes flow evenly instead of every partition writing at once each interval (which stalled
deciding for a second or two). Which partitions a round writes is :func:`plan_round` (pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.settings import CheckpointSettings
from fracpilot_libs.deadlines import cancel_and_wait
from fracpilot_libs.nats import subjects

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Round:
    """What one round of the schedule writes."""

    chosen: list[Partition]
    overdue: Partition | None  # the busy partition due now: its writes are spread
    last_due: float  # when a busy partition was last chosen (time.monotonic())


def plan_round(
    parts: Sequence[Partition],
    now: float,
    *,
    urgent: bool,
    settings: CheckpointSettings,
    spacing: float,
    last_due: float,
) -> Round:
    """Every partition when ``urgent``; else the quiet ones with samples not checkpointed, and
    the most overdue busy one if its slot (``spacing`` after the last) has come."""
    interval, idle = settings.interval_s, settings.when_idle_s
    if urgent:
        return Round(list(parts), None, last_due)
    quiet = [
        part
        for part in parts
        if idle and part.uncommitted > 0 and now - part.last_sample_at >= idle
    ]
    due = [part for part in parts if now - part.committed_at >= interval]
    overdue = min(due, key=lambda part: part.committed_at, default=None)
    if overdue is not None and now - last_due < spacing:
        overdue = None  # the next busy partition at the next slot
    if overdue is not None:
        last_due = now
    chosen = [*quiet, *([overdue] if overdue and overdue not in quiet else [])]
    return Round(chosen, overdue, last_due)


class CheckpointScheduler:
    """Checkpoints the owned partitions on the schedule above, in the background."""

    def __init__(
        self,
        checkpoints: Checkpointer,
        parts: Mapping[int, Partition],
        holds: Callable[[int], bool],
        settings: CheckpointSettings,
        partition_count: int,
    ) -> None:
        self.checkpoints = checkpoints
        self.parts = parts
        self.holds = holds  # whether this replica's lease on a partition is trusted
        self.settings = settings
        self.partition_count = partition_count
        self._now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="checkpoints")

    async def stop(self) -> None:
        # The flag ends the loop after the write in hand even if the cancel is lost (nats-py
        # awaits each KV reply through asyncio.wait_for: see fracpilot_libs.deadlines).
        self._stopping = True
        if self._task is not None:
            await cancel_and_wait(self._task)

    def urge(self) -> None:
        """Checkpoint every partition at the next turn (one has decided many samples)."""
        self._now.set()

    async def commit_all(self) -> None:
        for part in list(self.parts.values()):
            await self.commit(part)

    async def _run(self) -> None:
        interval, idle = self.settings.interval_s, self.settings.when_idle_s
        spacing = interval / max(1, self.partition_count)
        tick = min(spacing, idle / 2 if idle else interval)
        last_due = 0.0
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await self._now.wait()
            urgent = self._now.is_set()
            self._now.clear()
            plan = plan_round(
                list(self.parts.values()),
                time.monotonic(),
                urgent=urgent,
                settings=self.settings,
                spacing=spacing,
                last_due=last_due,
            )
            last_due = plan.last_due
            for part in plan.chosen:
                if self._stopping:
                    return
                # The busy partition due now spreads its writes over half a slot; a quiet one
                # or an urgent round writes at once.
                spread = spacing / 2 if part is plan.overdue else 0.0
                try:
                    await self.commit(part, spread)
                except Exception as exc:  # NATS trouble: the next round tries again
                    log.warning(
                        "checkpoint failed", extra={"partition": part.number, "error": repr(exc)}
                    )

    async def commit(self, part: Partition, spread_s: float = 0.0) -> None:
        """Write the partition's changed states, then the mark: the position of the last sample
        handled before the write began. Every sample up to the mark is in a checkpoint.

        ``spread_s``: take about this long over the writes. At 100,000 workloads a partition's
        checkpoint is 6,000 states; written in one go, the serialising and the server's
        storing of them held up the samples behind them (p99 latency 490 ms instead of 145)."""
        async with part.commit_lock:
            part.committed_at = time.monotonic()
            msg, count = part.last_msg, part.uncommitted
            keys, part.dirty = part.dirty, set()
            if keys:
                failed = await self.checkpoints.write(part.states, keys, spread_s)
                if failed:
                    part.dirty |= failed
                    return
            if msg is None or not self.holds(part.number):
                return
            await self.checkpoints.write_mark(
                part.number, subjects.stream_position(msg.reply)[0], part.stream_made
            )
            if part.last_msg is msg:
                part.last_msg = None
            part.uncommitted -= count
