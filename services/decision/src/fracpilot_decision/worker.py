"""One owned partition's worker: fetch a batch, check the lease, decide it; and when the
consumer is gone or a batch fails, start the partition again from its checkpoints and mark."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.consumers import PartitionConsumers
from fracpilot_decision.deciding import Decider
from fracpilot_decision.partition_state import Partition
from fracpilot_libs.leases.ownership import Ownership
from fracpilot_libs.nats.client_types import Msg
from fracpilot_libs.nats.pull_feed import ConsumerGoneError

log = logging.getLogger(__name__)


class PartitionWorker:
    """Runs the worker loop of each owned partition (one task per partition)."""

    def __init__(
        self,
        checkpoints: Checkpointer,
        consumers: PartitionConsumers,
        ownership: Ownership,
        decider: Decider,
        *,
        partition_count: int,
        after_batch: Callable[[], None],
    ) -> None:
        self.checkpoints = checkpoints
        self.consumers = consumers
        self.ownership = ownership
        self.decider = decider
        self.partition_count = partition_count
        self.after_batch = after_batch

    async def run(self, part: Partition) -> None:
        """Decide the partition's samples until it is stopped or given up."""
        ownership = self.ownership
        while not part.stopping:
            feed = part.feed
            if feed is None:
                return
            try:
                msgs: list[Msg] = await feed.next_batch()
            except ConsumerGoneError:
                # Deleted under us (by hand, or with its stream): opened again from the mark,
                # which also notices a stream made anew.
                log.warning(
                    "partition consumer gone, opening it again", extra={"partition": part.number}
                )
                if not await self._reopen(part):
                    return
                continue
            except Exception as exc:  # connection trouble: nats-py reconnects, we wait
                log.warning("fetch failed", extra={"partition": part.number, "error": repr(exc)})
                await asyncio.sleep(0.5)
                continue
            if not msgs:
                continue
            if not ownership.holds(part.number):
                # The lease may have run out: give the partition up; whoever claims it next
                # (maybe this replica again) gets these samples from the mark.
                log.warning("partition lease not trusted", extra={"partition": part.number})
                ownership.forget_soon(part.number)
                return
            try:
                await self.decider.handle_batch(part, msgs)
            except Exception:
                log.exception(
                    "partition failed, resuming from its last checkpoint",
                    extra={"partition": part.number},
                )
                await asyncio.sleep(1.0)
                if not await self._reopen(part):
                    return
            self.after_batch()

    async def _reopen(self, part: Partition) -> bool:
        """Reload the partition; False (and given up: a later round claims it again) when
        NATS is in the way."""
        try:
            await self._reload(part)
        except Exception as exc:
            log.warning(
                "partition not reloaded, giving up",
                extra={"partition": part.number, "error": repr(exc)},
            )
            self.ownership.forget_soon(part.number)
            return False
        return True

    async def _reload(self, part: Partition) -> None:
        """Forget the partition's in-memory progress and start again from its checkpoints and
        its mark (a fresh subscription: nothing fetched before is kept)."""
        if part.feed is not None:
            await part.feed.stop()
            part.feed = None
        p = part.number
        part.states = (await self.checkpoints.restore(frozenset({p}), self.partition_count))[p]
        part.dirty = set()
        part.last_msg, part.uncommitted = None, 0
        part.feed = await self.consumers.open(part)
