"""A durable pull consumer that a new owner resumes from a stream position it chooses.

Acknowledged all-up-to (``AckPolicy.ALL``) and never dead-lettered by the server
(``max_deliver=-1``: its owner deals with what it cannot handle). It is made to start after a
given stream sequence, updated to new limits while keeping where it was made to start, or
rewound to deliver again from after a sequence (reset on a server that can, else deleted and
made again). Messages are taken through a :class:`~fracpilot_libs.nats.pull_feed.PullFeed`.
What position to resume from is the owner's business (the decision service's partition marks,
``fracpilot_decision.consumers``); this module only speaks JetStream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from fracpilot_libs.nats.pull_feed import PullFeed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Where a stream is now: its last sequence, and when it was made (a stream deleted and
    made anew under the same name starts its sequences again)."""

    last_seq: int
    created: str


@dataclass(frozen=True, slots=True)
class ExistingConsumer:
    """A consumer as the server has it: where it was made to start, and its acknowledgement
    floor (the stream sequence every message up to which is acknowledged; 0: none)."""

    info: ConsumerInfo

    @property
    def ack_floor(self) -> int:
        return self.info.ack_floor.stream_seq if self.info.ack_floor else 0


class ResumableConsumer:
    """The durable consumer ``durable`` on ``stream``, with the given limits."""

    def __init__(
        self,
        nc: NatsClient,
        stream: str,
        durable: str,
        *,
        description: str,
        ack_wait_s: float,
        max_ack_pending: int,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.stream, self.durable = stream, durable
        self.description = description
        self.ack_wait_s, self.max_ack_pending = ack_wait_s, max_ack_pending

    def config(self, after: int = 0) -> ConsumerConfig:
        """The consumer's config, delivering from the message after sequence ``after`` (0:
        from the stream's start)."""
        config = ConsumerConfig(
            durable_name=self.durable,
            description=self.description,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            # Acknowledged batch by batch: one still in hand this long comes again.
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.max_ack_pending,
            max_deliver=-1,  # the owner deals with a message it cannot handle
        )
        if after:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = after + 1
        return config

    async def stream_end(self) -> StreamEnd:
        info = await self.js.stream_info(self.stream)
        return StreamEnd(int(info.state.last_seq), str(info.created))

    async def existing(self) -> ExistingConsumer | None:
        """The consumer as the server has it; None when there is none."""
        try:
            return ExistingConsumer(await self.js.consumer_info(self.stream, self.durable))
        except NotFoundError:
            return None

    async def create(self, after: int) -> None:
        """Make the consumer, delivering from the message after ``after``."""
        await self.js.add_consumer(self.stream, self.config(after))

    async def update_limits(self, existing: ExistingConsumer) -> None:
        """Update an existing consumer to these limits, keeping where it was made to start
        (fixed when it was made). Raises when the server refuses (an incompatible config)."""
        config = self.config()
        config.deliver_policy = existing.info.config.deliver_policy
        config.opt_start_seq = existing.info.config.opt_start_seq
        await self.js.add_consumer(self.stream, config)

    async def rewind(self, after: int) -> None:
        """Deliver again from the message after ``after``, now and in order."""
        try:
            await self.js.reset_consumer(self.stream, self.durable, seq=after + 1)  # >= 2.14
            return
        except Exception as exc:
            log.info("consumer reset unavailable, recreating", extra={"error": repr(exc)})
        await self.js.delete_consumer(self.stream, self.durable)
        await self.create(after)

    def feed(self, *, batch: int, linger_s: float) -> PullFeed:
        """A feed of the consumer's messages (not started)."""
        return PullFeed(self.nc, self.stream, self.durable, batch=batch, linger_s=linger_s)
