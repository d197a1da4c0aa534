"""Each owned partition's durable consumer: made or updated, and moved to the sample after the
partition's mark, so that what a previous owner decided but never checkpointed comes again.

One durable pull consumer per usage partition stream (``decision-p<k>``), acknowledged
all-up-to (``AckPolicy.ALL``); messages are taken through the shared
:class:`~fracpilot_libs.nats.pull_feed.PullFeed`. The restored states' positions are checked against
the stream first (:meth:`~fracpilot_decision.partition_state.Partition.forget_positions`).
"""

from __future__ import annotations

import logging

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from fracpilot_decision.checkpoints import Checkpointer
from fracpilot_decision.partition_state import Partition
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.pull_feed import PullFeed

log = logging.getLogger(__name__)


class PartitionConsumers:
    """Opens the consumers of the partitions this replica claims."""

    def __init__(
        self, nc: NatsClient, checkpoints: Checkpointer, settings: DecisionSettings
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.checkpoints = checkpoints
        self.settings = settings

    def config(self, partition: int) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=subjects.decision_consumer(partition),
            description=f"decision replicas: usage partition {partition}",
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            # Acknowledged batch by batch: one still in hand this long comes again (and is
            # recognised by its position).
            ack_wait=self.settings.ack_wait_s,
            max_ack_pending=self.settings.max_unacked,
            max_deliver=-1,  # a sample that cannot be decided is dead-lettered in process
        )

    async def open(self, part: Partition) -> PullFeed:
        """Pull from the partition's durable consumer, from the sample after its mark; the
        restored states' positions are checked against the stream first."""
        js = self.js
        partition = part.number
        stream, name = subjects.usage_stream(partition), subjects.decision_consumer(partition)
        stream_info = await js.stream_info(stream)
        last_seq, part.stream_made = int(stream_info.state.last_seq), str(stream_info.created)
        part.forget_positions(last_seq, "past the stream's end")
        mark = await self.read_mark(partition, last_seq, part.stream_made)
        config = self.config(partition)
        try:
            info = await js.consumer_info(stream, name)
        except NotFoundError:
            info = None
        if info is None:
            if mark:
                config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
                config.opt_start_seq = mark + 1
            else:
                # Never consumed, or made anew (its mark past its end): no state's position is
                # one of this stream's (they come from the earlier single usage stream, or
                # from a stream since deleted). Were one kept, it could hide a new sample.
                part.forget_positions(0, "a new partition stream")
            await js.add_consumer(stream, config)
            mark = mark or 0
        else:
            config.deliver_policy = info.config.deliver_policy  # fixed when it was made
            config.opt_start_seq = info.config.opt_start_seq
            try:
                await js.add_consumer(stream, config)  # update its limits
            except Exception as exc:  # an incompatible older config: keep it as it is
                log.warning("partition consumer kept as configured", extra={"error": repr(exc)})
            if mark is None:
                # Made, then its owner died before marking it (nothing acknowledged), or the
                # mark was deleted: from the acknowledgement floor, and positions past it are
                # not trusted (a sample counted twice rather than one hidden).
                mark = info.ack_floor.stream_seq if info.ack_floor else 0
                part.forget_positions(mark, "a consumer without a mark")
            await self.rewind(partition, mark)
        # Marked before the first acknowledgement: without a mark, the next owner would have
        # to trust an acknowledgement floor that runs ahead of the checkpoints.
        await self.checkpoints.write_mark(partition, mark, part.stream_made)
        feed = PullFeed(
            self.nc,
            stream,
            name,
            batch=self.settings.fetch_batch,
            linger_s=self.settings.fetch_linger_s,
        )
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

    async def rewind(self, partition: int, mark: int) -> None:
        """Deliver the partition again from the sample after ``mark``, now and in order: what
        a previous owner decided but never checkpointed, or fetched and never handled."""
        js = self.js
        stream, name = subjects.usage_stream(partition), subjects.decision_consumer(partition)
        try:
            await js.reset_consumer(stream, name, seq=mark + 1)  # >= 2.14
            return
        except Exception as exc:
            log.info("consumer reset unavailable, recreating", extra={"error": repr(exc)})
        await js.delete_consumer(stream, name)
        config = self.config(partition)
        if mark:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = mark + 1
        await js.add_consumer(stream, config)
