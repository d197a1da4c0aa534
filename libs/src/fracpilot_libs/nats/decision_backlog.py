"""How far the decision replicas are behind the usage stream, for the CLI, tests and benches.

A sample counts as done once acknowledged, which the service does as soon as it is decided
(its checkpoint follows within ``checkpoint_interval_s``, or at once when the partition goes
quiet, and on a graceful stop).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_streams import usage_partition_count


@dataclass(frozen=True)
class Backlog:
    partitions: int  # as the usage streams record
    pending: int  # stored, not delivered to a replica yet
    unacknowledged: int  # delivered, not decided and acknowledged yet
    missing: int  # partitions without a consumer yet (no replica ever claimed them)

    @property
    def caught_up(self) -> bool:
        return self.pending == 0 and self.unacknowledged == 0 and self.missing == 0


async def decision_backlog(js: JetStreamContext) -> Backlog | None:
    """Samples the decision replicas have not finished, over every partition's consumer."""
    partitions = await usage_partition_count(js)
    if partitions is None:
        return None
    pending = unacked = missing = 0
    for p in range(partitions):
        try:
            info = await js.consumer_info(subjects.usage_stream(p), subjects.decision_consumer(p))
        except NotFoundError:
            missing += 1
            continue
        pending += info.num_pending or 0
        unacked += info.num_ack_pending or 0
    return Backlog(partitions, pending, unacked, missing)
