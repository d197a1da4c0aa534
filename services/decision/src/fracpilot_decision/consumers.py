"""Each owned partition's durable consumer: made or updated, and moved to the sample after the
partition's mark, so that what a previous owner decided but never checkpointed comes again.

One durable pull consumer per usage partition stream (``decision-p<k>``), acknowledged
all-up-to (:class:`~fracpilot_libs.nats.resumable_consumer.ResumableConsumer`); messages are
taken through the shared :class:`~fracpilot_libs.nats.pull_feed.PullFeed`. The restored states'
positions are checked against the stream first
(:meth:`~fracpilot_decision.partition_state.Partition.forget_positions`).
"""

from __future__ import annotations

import logging

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.pull_feed import PullFeed
from fracpilot_libs.nats.resumable_consumer import ResumableConsumer

log = logging.getLogger(__name__)


class PartitionConsumers:
    """Opens the consumers of the partitions this replica claims."""

    def __init__(
        self, nc: NatsClient, checkpoints: Checkpointer, settings: DecisionSettings
    ) -> None:
        self.nc = nc
        self.checkpoints = checkpoints
        self.settings = settings

    def consumer(self, partition: int) -> ResumableConsumer:
        return ResumableConsumer(
            self.nc,
            subjects.usage_stream(partition),
            subjects.decision_consumer(partition),
            description=f"decision replicas: usage partition {partition}",
            # A batch still in hand this long comes again (and is recognised by its position).
            ack_wait_s=self.settings.ack_wait_s,
            max_ack_pending=self.settings.max_unacked,
        )

    async def open(self, part: Partition) -> PullFeed:
        """Pull from the partition's durable consumer, from the sample after its mark; the
        restored states' positions are checked against the stream first."""
        partition = part.number
        consumer = self.consumer(partition)
        end = await consumer.stream_end()
        last_seq, part.stream_made = end.last_seq, end.created
        part.forget_positions(last_seq, "past the stream's end")
        mark = await self.read_mark(partition, last_seq, part.stream_made)
        existing = await consumer.existing()
        if existing is None:
            if not mark:
                # Never consumed, or made anew (its mark past its end): no state's position is
                # one of this stream's (they come from the earlier single usage stream, or
                # from a stream since deleted). Were one kept, it could hide a new sample.
                part.forget_positions(0, "a new partition stream")
            mark = mark or 0
            await consumer.create(after=mark)
        else:
            try:
                await consumer.update_limits(existing)
            except Exception as exc:  # an incompatible older config: keep it as it is
                log.warning("partition consumer kept as configured", extra={"error": repr(exc)})
            if mark is None:
                # Made, then its owner died before marking it (nothing acknowledged), or the
                # mark was deleted: from the acknowledgement floor, and positions past it are
                # not trusted (a sample counted twice rather than one hidden).
                mark = existing.ack_floor
                part.forget_positions(mark, "a consumer without a mark")
            # What a previous owner decided but never checkpointed, or fetched and never
            # handled, comes again now and in order.
            await consumer.rewind(after=mark)
        # Marked before the first acknowledgement: without a mark, the next owner would have
        # to trust an acknowledgement floor that runs ahead of the checkpoints.
        await self.checkpoints.write_mark(partition, mark, part.stream_made)
        feed = consumer.feed(batch=self.settings.fetch_batch, linger_s=self.settings.fetch_linger_s)
        await feed.start()
        return feed

    async def read_mark(self, partition: int, last_seq: int, stream_made: str) -> int | None:
        """The partition's mark; 0 when it lies past its stream's end (the stream was made
        anew: its samples are all new), None when there is none (or it is of an earlier
        stream of that name)."""
        mark = await self.checkpoints.read_mark(partition, stream_made)
        if mark and mark > last_seq:
            log.warning(
                "partition mark past the usage stream's end (a new stream?): from its start",
                extra={"partition": partition, "mark": mark, "last_seq": last_seq},
            )
            return 0
        return mark
