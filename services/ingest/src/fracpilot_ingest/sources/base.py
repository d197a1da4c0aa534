"""What a usage source is to the service: the :class:`Source` protocol.

The service runs every configured source the same way: it asks the source for a
:class:`Reading` (points of one or more instants to attribute, or samples the source made
itself), publishes it, tells the source it is published (so that a cursor moves only past
what NATS has), and waits as long as the source says. A source counts and logs its own
failures: a reading it could not make is an empty one. A new kind of source is a new module
here implementing the protocol, and one entry in :func:`fracpilot_ingest.sources.make_sources`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_ingest.shards import IngestShards
from fracpilot_libs.contracts import Allocation, UsageSample
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.usage.attribution import MetricPoint, Observation
from fracpilot_libs.usage.samples import PublishedSeries


@dataclass(frozen=True, slots=True)
class Reading:
    """What a source read in one go."""

    step_s: float  # the time each sample stands for (usage and cost accounting)
    instants: Sequence[list[MetricPoint]] = ()  # points to attribute, one list per instant
    samples: Sequence[UsageSample] = ()  # samples the source made itself (the simulator)
    # The source's own note of what this reading covers (the Prometheus cursor's new end).
    until: float | None = field(default=None)
    # Sharded (fracpilot_ingest.shards): the observations of an instant to publish.
    keep: Callable[[list[Observation]], list[Observation]] | None = None


class Source(Protocol):
    """A kind of usage source."""

    name: str  # the ``source`` label of metrics and samples

    async def open(self) -> None:
        """Prepare (read a cursor); called once before the first read."""

    async def read(self) -> Reading | None:
        """The next reading; None when the source has produced all it will."""

    async def published(self, reading: Reading) -> None:
        """The reading is on NATS: move past it."""

    def next_read_in(self) -> float:
        """Seconds to wait before the next read (0 or less: read at once)."""


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What sources share with the service."""

    metrics: IngestMetrics
    metric_names: Sequence[str]  # the metrics the mapping table reads
    published_series: PublishedSeries
    allocations: Mapping[str, Allocation]  # by workload key, kept current by the service
    state: Callable[[], Awaitable[KvBucket]]  # the ingest state bucket (cursors)
    shards: IngestShards | None = None  # this replica's GPU shards, when sharded
