"""Ingest shards, the adapter: the shard leases of this replica and the shards' cursors.

With ``FRACPILOT_INGEST_SHARDS`` above 1, several ingest replicas read one Prometheus source
and each publishes the samples of the GPUs in the shards it holds (:mod:`.shard_plan`, the
pure part). The leases are the decision service's machinery (:mod:`fracpilot_libs.leases`)
on the bucket ``fracpilot_ingest_shards``: balanced among the live replicas with minimal
movement, a dead replica's shards claimed by the others once its leases run out
(``FRACPILOT_INGEST_SHARD_LEASE_S``). Each shard's cursor is a key of the ingest state bucket.

A cycle (:meth:`IngestShards.begin_cycle` … :meth:`IngestShards.end_cycle`) publishes the
shards held when it began. A shard handed over (another replica joined) leaves after the
cycle in flight has published it and moved its cursor, so its new owner goes on from there;
a shard whose lease is lost leaves at once, and what the cycle in flight still publishes of
it is a duplicate the stream drops (the same batch ids whoever publishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from fracpilot_ingest.settings import ShardSettings
from fracpilot_ingest.shard_plan import (
    CURSOR_PREFIX,
    CyclePlan,
    LabelGroup,
    advanced,
    cursor_key,
    parse_cursor,
    plan_cycle,
)
from fracpilot_libs.leases.metrics import LeaseMetrics
from fracpilot_libs.leases.ownership import Ownership, default_replica_id
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.kv import KvBucket, KvEntry, RevisionMismatchError

log = logging.getLogger(__name__)
CAS_TRIES = 5  # cursor writes racing another replica's (an old owner finishing late)


class IngestShards:
    """The shards this replica publishes; the holder its :class:`Ownership` calls."""

    def __init__(
        self,
        settings: ShardSettings,
        registry: CollectorRegistry,
        label_groups: Sequence[LabelGroup],
    ) -> None:
        self.count = settings.shards
        self.label_groups = tuple(label_groups)  # the labels naming a series' GPU, by metric
        self.lease_s = settings.shard_lease_s
        self.replica = settings.replica_id or default_replica_id()
        self.metrics = LeaseMetrics(
            owned=Gauge(
                "fracpilot_ingest_shards_owned",
                "GPU shards of the prometheus source this replica publishes",
                registry=registry,
            ),
            replicas=Gauge(
                "fracpilot_ingest_replicas",
                "Ingest replicas alive, as this replica last saw them",
                registry=registry,
            ),
            moves=Counter(
                "fracpilot_ingest_shard_moves_total",
                "Shards this replica claimed, handed over, or dropped (its lease lost)",
                ["move"],
                registry=registry,
            ),
        )
        self.ownership: Ownership | None = None
        self._taken: set[int] = set()  # claimed and not handed over, dropped or lost
        self._cycle_over = asyncio.Event()  # set while no cycle is in flight
        self._cycle_over.set()
        self._read: dict[str, KvEntry | None] = {}  # the cycle's cursors as it read them

    async def start(self, nc: NatsClient, replicas: int) -> None:
        """Open the lease bucket and run one round (a lone replica holds every shard when
        this returns), then keep the leases in the background."""
        self.ownership = Ownership(
            nc,
            self,
            partitions=self.count,
            replica=self.replica,
            lease_s=self.lease_s,
            metrics=self.metrics,
            bucket=subjects.INGEST_SHARD_BUCKET,
            replicas=replicas,
            description="ingest replicas and their GPU-shard leases",
        )
        await self.ownership.open()
        await self.ownership.start()

    async def stop(self) -> None:
        """Hand every shard back (the sources are stopped first) and leave."""
        self._cycle_over.set()  # a cycle cut short moved no cursor: the next owner reads it
        if self.ownership is not None:
            await self.ownership.stop(hand_over=True)

    # --- the holder (called by the ownership rounds) ------------------------------------------

    async def take(self, partitions: frozenset[int]) -> None:
        self._taken |= partitions
        log.info("shards taken", extra={"shards": sorted(partitions), "replica": self.replica})

    async def hand_over(self, partition: int) -> None:
        """Out of the next cycles at once; released once the cycle in flight has published
        it and moved its cursor (or after a lease at most: a stuck cycle moves no cursor)."""
        self._taken.discard(partition)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.lease_s):
                await self._cycle_over.wait()

    async def drop(self, partition: int) -> None:
        self._taken.discard(partition)

    def held(self) -> frozenset[int]:
        """The shards this replica may publish now: taken and their leases trusted."""
        own = self.ownership
        return frozenset(k for k in self._taken if own is not None and own.holds(k))

    # --- cycles (called by the prometheus source) ---------------------------------------------

    async def begin_cycle(self, kv: KvBucket, fallback: float) -> CyclePlan:
        """The shards held now, each from its cursor (``fallback`` when it has none: the
        unsharded cursor, or where the back-fill starts)."""
        self._cycle_over.set()  # one not ended (its source restarted) is over
        self._cycle_over = asyncio.Event()
        owned = sorted(self.held())
        entries = await self._entries(kv, owned)
        # Kept for end_cycle: its compare-and-set starts from these revisions, not a re-read.
        self._read = {cursor_key(k, self.count): entry for k, entry in entries.items()}
        stored = _values(entries)
        if any(k not in stored for k in owned):  # a new shard count: from the floor
            entry = await kv.get(CURSOR_PREFIX)
            floor = parse_cursor(entry.value) if entry is not None else None
            fallback = fallback if floor is None else floor
        return plan_cycle(self.count, owned, stored, fallback)

    async def _entries(self, kv: KvBucket, shards: Sequence[int]) -> dict[int, KvEntry | None]:
        entries = await asyncio.gather(*(kv.get(cursor_key(k, self.count)) for k in shards))
        return dict(zip(shards, entries, strict=True))

    async def end_cycle(self, kv: KvBucket, plan: CyclePlan, until: float | None) -> None:
        """The cycle's batches are all acknowledged: move each of its shards' cursors to
        ``until`` (None: nothing was read)."""
        read, self._read = self._read, {}
        try:
            if until is not None:
                keys = [cursor_key(k, self.count) for k in plan.cursors]
                moved = await asyncio.gather(
                    *(
                        self._advance(kv, key, until, read=key in read, entry=read.get(key))
                        for key in keys
                    )
                )
                # The floor, every shard's earliest cursor, is the unsharded cursor: where a
                # shard of another count starts, and an unsharded ingest after this one. The
                # cycle's own cursors are known from the writes; only the others are read.
                others = [k for k in range(self.count) if k not in plan.cursors]
                every = _values(await self._entries(kv, others))
                every.update(
                    (k, cursor)
                    for k, cursor in zip(plan.cursors, moved, strict=True)
                    if cursor is not None
                )
                if len(every) == self.count:
                    await self._advance(kv, CURSOR_PREFIX, min(every.values()))
        finally:
            self._cycle_over.set()

    async def _advance(
        self,
        kv: KvBucket,
        key: str,
        until: float,
        *,
        read: bool = False,
        entry: KvEntry | None = None,
    ) -> float | None:
        """Move a cursor forward to ``until``, never back (compare-and-set), from ``entry``
        when the cycle ``read`` it already (else it is read first); returns the cursor now
        stored (None: unknown, every write lost to another replica's)."""
        value = f"{until:.3f}".encode()
        for _ in range(CAS_TRIES):
            if not read:
                entry = await kv.get(key)
            read = False  # a retry reads again
            stored = parse_cursor(entry.value) if entry else None
            if not advanced(stored, until):
                return stored
            try:
                if entry is None:
                    await kv.create(key, value)
                else:
                    await kv.update(key, value, last=entry.revision)
                return until
            except RevisionMismatchError:
                continue  # another replica wrote it meanwhile: read it again
        log.warning("cursor not moved", extra={"key": key, "until": until})
        return None


def _values(entries: dict[int, KvEntry | None]) -> dict[int, float]:
    """The cursors among ``entries`` that hold one."""
    stored: dict[int, float] = {}
    for k, entry in entries.items():
        cursor = parse_cursor(entry.value) if entry is not None else None
        if cursor is not None:
            stored[k] = cursor
    return stored
