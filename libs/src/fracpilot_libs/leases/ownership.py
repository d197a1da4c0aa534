"""Ownership of numbered parts through leases in NATS KV: which replica acts on which part. The
decision service shares its usage partitions with it (bucket ``fracpilot_decision_partitions``),
the ingest its GPU shards (:mod:`fracpilot_ingest.shards`); "partition" below is either.

The bucket has a TTL (``lease_s``): a key that is not
written again within it disappears. Each replica keeps two kinds of keys alive:

- ``member.<replica>``: the replica is alive (rewritten every ``lease_s / 4``);
- ``partition.<k>``: the replica owns partition ``k`` (created with compare-and-set, so one
  replica wins a race; renewed with compare-and-set on the revision, so a renewal fails once
  someone else holds it).

Every round a replica reads the bucket, computes the target ownership with
:func:`fracpilot_libs.leases.balance.moves_for` (the same answer on every replica), hands over
the partitions the target gives away (stop, checkpoint, acknowledge, then delete the lease)
and claims the free ones it should own (create the lease, restore the workloads'
checkpoints, then consume). A replica that dies stops renewing: its leases run out after at
most ``lease_s`` and the others claim the partitions. A replica trusts its own leases only
until ``3/4 lease_s`` after the last renewal it sent (the server counts the TTL from when it
stored the renewal, later), and a partition it can no longer trust is dropped at once.

This module is the adapter: it reads and writes the bucket
(:mod:`fracpilot_libs.nats.lease_bucket`) and the clock, and runs the rounds. What to write
and whom to trust is decided in the pure :mod:`fracpilot_libs.leases.core`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections import defaultdict
from typing import Protocol

from fracpilot_libs.deadlines import cancel_and_wait, event_set
from fracpilot_libs.leases.balance import Moves
from fracpilot_libs.leases.core import (
    MEMBER,
    LeaseBook,
    LeaseTiming,
    Renewal,
    View,
    member_key,
    partition_key,
    plan_round,
    view_of,
)
from fracpilot_libs.leases.metrics import LeaseMetrics
from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.errors import NatsError
from fracpilot_libs.nats.kv import KvBucket, RevisionMismatchError
from fracpilot_libs.nats.lease_bucket import KeyWatch, open_lease_bucket, read_lease_bucket

log = logging.getLogger(__name__)


def default_replica_id() -> str:
    """``<hostname>-<random>``: the pod name, unique across restarts of the same pod."""
    host = re.sub(r"[^-_A-Za-z0-9]", "_", socket.gethostname())[:100] or "replica"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def renew_member(kv: KvBucket, replica: str, body: bytes) -> None:
    """Say the replica is alive; a failure is logged (the leases are renewed regardless,
    each on its own: a KV leader moving fails some writes and not others)."""
    try:
        await kv.put(member_key(replica), body)
    except NatsError as exc:
        log.warning("member key not renewed", extra={"error": repr(exc)})


async def renew_lease(kv: KvBucket, partition: int, replica: str, revision: int) -> int:
    """Rewrite the partition's lease if it is still at ``revision``; its new revision. Raises
    ``RevisionMismatchError`` when someone else's write came between, but not when it
    was this replica's own earlier renewal, stored with its ack lost (a KV leader moving):
    only ``replica`` writes its name there, so a lease naming it is still its own. That one
    is written once more: the server counts its TTL from an unknown earlier moment, while
    the caller trusts the lease from when this renewal was sent. Raises
    :class:`~fracpilot_libs.nats.errors.NatsError` on NATS trouble."""
    key = partition_key(partition)
    try:
        return await kv.update(key, replica.encode(), last=revision)
    except RevisionMismatchError:
        entry = await kv.get(key)
        if entry is None or entry.value != replica.encode():
            raise
        log.info("partition lease renewal stored, its ack lost", extra={"partition": partition})
        return await kv.update(key, replica.encode(), last=entry.revision)


async def claim_lease(kv: KvBucket, partition: int, replica: str) -> int | None:
    """Create the partition's lease; its revision, or None when another replica was quicker
    or the outcome is unknown (NATS trouble). Never raises: a claim failing halfway through a
    round once left the partitions claimed before it leased, renewed, and never consumed. A
    create stored with its ack lost (a KV leader moving) leaves a lease naming this replica
    that it does not hold: the next round deletes it and claims the partition again."""
    try:
        return await kv.create(partition_key(partition), replica.encode())
    except RevisionMismatchError:
        return None  # another replica was quicker
    except NatsError as exc:  # no answer, no responders, no leader: unknown
        log.warning("partition not claimed", extra={"partition": partition, "error": repr(exc)})
        return None


async def read_view(nc: NatsClient, bucket: str) -> View:
    """Every live member and lease in the bucket, one snapshot. Raises
    :class:`~fracpilot_libs.nats.errors.NatsError` on NATS trouble (10 s at most)."""
    entries = await read_lease_bucket(nc, bucket, timeout_s=10, name_prefix=f"leases-{bucket}")
    return view_of((e.key, e.value, e.revision) for e in entries)


class PartitionHolder(Protocol):
    """What the service does when ownership changes (called from the ownership loop)."""

    async def take(self, partitions: frozenset[int]) -> None:
        """Claimed: restore the partitions' workloads, then consume them."""

    async def hand_over(self, partition: int) -> None:
        """Another replica gets it: stop consuming, checkpoint and acknowledge, forget it."""

    async def drop(self, partition: int) -> None:
        """The lease is lost or no longer trusted: stop at once, no checkpoint, forget it."""


class Ownership:
    """This replica's leases; :meth:`holds` says whether it may still act on a partition."""

    def __init__(
        self,
        nc: NatsClient,
        holder: PartitionHolder,
        *,
        partitions: int,
        replica: str,
        lease_s: float,
        metrics: LeaseMetrics,
        bucket: str,
        replicas: int = 1,
        description: str = "decision replicas and their usage-partition leases",
    ) -> None:
        self.nc = nc
        self.replicas = replicas
        self.holder = holder
        self.partitions = partitions
        self.replica = replica
        self.lease_s = lease_s
        self.timing = LeaseTiming(lease_s)
        self.bucket = bucket
        self.description = description
        self.metrics = metrics
        self.kv: KvBucket | None = None
        self.book = LeaseBook(self.timing)  # deadlines on time.monotonic()
        self._lock = asyncio.Lock()  # one round (or the leave) at a time
        # A renewal and a release of the same lease never cross.
        self._lease_io: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._renewer: asyncio.Task[None] | None = None  # runs on until the hand-overs are done
        self._renewals_end = asyncio.Event()
        self._forgetting: set[asyncio.Task[None]] = set()

    @property
    def renew_s(self) -> float:
        return self.timing.renew_s

    def holds(self, partition: int) -> bool:
        """True while this replica's lease on the partition can be trusted."""
        return self.book.holds(partition, time.monotonic())

    @property
    def owned(self) -> frozenset[int]:
        return self.book.owned

    # --- set-up -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the bucket with the lease as its TTL (or set the TTL of an existing one)."""
        self.kv = await open_lease_bucket(
            self.nc,
            self.bucket,
            ttl_s=self.lease_s,
            replicas=self.replicas,
            io_timeout_s=self.timing.io_timeout_s,
            description=self.description,
        )

    def _kv(self) -> KvBucket:
        if self.kv is None:
            raise RuntimeError("ownership is not open")
        return self.kv

    async def start(self) -> None:
        """One round now (so a lone replica consumes when this returns), then in the
        background: renew every ``lease_s / 4``, rebalance as often or when the bucket changes.
        The renewals start first: restoring the claimed partitions may outlast a lease."""
        await self.renew()
        self._renewer = asyncio.create_task(self._renewing(), name="lease-renew")
        await self.rebalance()
        self._tasks = [
            asyncio.create_task(self._rebalancing(), name="rebalance"),
            asyncio.create_task(self._watch(), name="lease-watch"),
        ]

    async def _renewing(self) -> None:
        """Renew ``lease_s / 4`` after the last renewal began, every ``RETRY_S`` while one
        goes unanswered (:meth:`LeaseTiming.pause_after_renewal`). Runs until
        ``_renewals_end`` (the leases are renewed while the partitions are handed over), which
        ends it after the renewal in hand even when its cancel is lost (nats-py awaits each
        reply through ``asyncio.wait_for``: see :mod:`fracpilot_libs.deadlines`)."""
        pause = self.renew_s
        while not await event_set(self._renewals_end, pause):
            began = time.monotonic()
            answered = await self.renew()
            pause = self.timing.pause_after_renewal(began, time.monotonic(), answered=answered)

    async def _rebalancing(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.renew_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.rebalance()
            except NatsError as exc:  # the bucket not read: the next round tries again
                log.warning("partition rebalance failed", extra={"error": repr(exc)})

    async def _watch(self) -> None:
        """Wake the rebalance when a replica joins (a member key not seen before) or a lease
        or member is deleted (a hand-over, a replica leaving), instead of at the next period.
        Renewals and expiries make no wake-up (the period catches expiries)."""
        seen: set[str] = set()
        while not self._stopping:
            try:
                watch = await KeyWatch.start(self._kv())
                try:
                    while not self._stopping:
                        change = await watch.next_change(timeout_s=self.renew_s)
                        if change is None:
                            continue
                        if change.deleted:
                            seen.discard(change.key)
                            self._wake.set()
                        elif change.key.startswith(MEMBER) and change.key not in seen:
                            seen.add(change.key)
                            self._wake.set()
                finally:
                    await watch.stop()
            except NatsError as exc:  # a restarted server forgot the watcher: start again
                log.info("partition watch restarting", extra={"error": repr(exc)})
                await asyncio.sleep(self.renew_s)

    # --- rounds -----------------------------------------------------------------------------

    async def renew(self) -> bool:
        """Say this replica is alive and renew its leases; drop what is lost or untrusted.
        False when a renewal got no answer (NATS trouble)."""
        kv = self._kv()
        sent = time.monotonic()
        body = json.dumps({"replica": self.replica, "partitions": sorted(self.book.owned)})
        held = sorted(self.book.owned)
        member = asyncio.ensure_future(renew_member(kv, self.replica, body.encode()))
        results = await asyncio.gather(*(self._renew_one(kv, p, sent) for p in held))
        await member
        outcomes = dict(zip(held, results, strict=True))
        for p in self.book.lost(outcomes):
            log.warning("partition lease lost", extra={"partition": p})
            await self._drop(p)
        for p in self.book.untrusted(time.monotonic()):
            log.warning("partition lease no longer trusted", extra={"partition": p})
            await self._drop(p)
        return Renewal.UNKNOWN not in results

    async def _renew_one(self, kv: KvBucket, p: int, sent: float) -> Renewal:
        """Renewed, lost (someone else holds it, or it ran out), or unknown (NATS trouble:
        trusted until its deadline)."""
        try:
            async with self._lease_io[p]:
                if (revision := self.book.revision(p)) is None:
                    return Renewal.UNKNOWN  # released meanwhile
                self.book.renewed(p, await renew_lease(kv, p, self.replica, revision), sent)
            return Renewal.RENEWED
        except RevisionMismatchError:
            return Renewal.LOST
        except NatsError as exc:
            log.warning("partition lease not renewed", extra={"partition": p, "error": repr(exc)})
            return Renewal.UNKNOWN

    def forget_soon(self, partition: int) -> None:
        """Drop a partition whose lease can no longer be trusted (from its own consumer)."""
        task = asyncio.create_task(self._drop(partition), name=f"forget-{partition}")
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _drop(self, partition: int) -> None:
        if self.book.forget(partition) is None:
            return
        self.metrics.moves.labels("dropped").inc()
        self.metrics.owned.set(len(self.book.owned))
        try:
            await self.holder.drop(partition)
        except Exception as exc:  # the service's code: the lease is forgotten regardless
            log.warning(
                "dropped partition not stopped", extra={"partition": partition, "error": repr(exc)}
            )

    async def rebalance(self) -> Moves:
        """Read the bucket; hand over what the target gives away; claim what it gives here.
        Raises :class:`~fracpilot_libs.nats.errors.NatsError` when the bucket is not read."""
        async with self._lock:
            if self._stopping:
                return Moves(frozenset(), frozenset())
            view = await read_view(self.nc, self.bucket)
            kv = self._kv()
            plan = plan_round(self.replica, self.partitions, view, self.book.owned)
            for p, stale in plan.free.items():
                # A lease of ours this replica no longer acts on (dropped): free it.
                with contextlib.suppress(RevisionMismatchError, NatsError):
                    await kv.delete(partition_key(p), last=stale)
            self.metrics.replicas.set(plan.replicas)
            for p in plan.release:
                await self._hand_over(p)
            claimed = []
            for p in plan.claim:
                sent = time.monotonic()
                if (revision := await claim_lease(kv, p, self.replica)) is not None:
                    self.book.claimed(p, revision, sent)
                    claimed.append(p)
            if claimed:
                await self._take(frozenset(claimed))
            return plan.moves

    async def _take(self, claimed: frozenset[int]) -> None:
        """Hand the claimed partitions to the holder; if that fails they are dropped (their
        leases freed by the next round, which claims them again), never held unconsumed."""
        self.metrics.moves.labels("claimed").inc(len(claimed))
        self.metrics.owned.set(len(self.book.owned))
        log.info(
            "partitions claimed", extra={"partitions": sorted(claimed), "replica": self.replica}
        )
        try:
            await self.holder.take(claimed)
        except Exception as exc:  # the service's code: whatever failed, none stays unconsumed
            log.warning(
                "claimed partitions not taken, dropped",
                extra={"partitions": sorted(claimed), "error": repr(exc)},
            )
            for p in sorted(claimed):
                await self._drop(p)

    async def _hand_over(self, partition: int) -> None:
        """Checkpoint and acknowledge while the lease is still renewed, then release it: the
        next owner restores only after every state this replica had is written. A hand-over
        the holder fails keeps the lease: the next round hands the partition over again."""
        if partition not in self.book.owned:
            return
        try:
            await self.holder.hand_over(partition)
        except Exception as exc:  # the service's code: released only once handed over
            log.warning(
                "partition not handed over", extra={"partition": partition, "error": repr(exc)}
            )
            return
        async with self._lease_io[partition]:
            revision = self.book.forget(partition)
            self.metrics.moves.labels("handed_over").inc()
            self.metrics.owned.set(len(self.book.owned))
            if revision is None:
                return  # lost meanwhile
            try:
                await self._kv().delete(partition_key(partition), last=revision)
            except (RevisionMismatchError, NatsError) as exc:  # the lease runs out instead
                log.warning(
                    "partition lease not released",
                    extra={"partition": partition, "error": repr(exc)},
                )
        log.info("partition handed over", extra={"partition": partition})

    # --- leaving ----------------------------------------------------------------------------

    async def stop(self, *, hand_over: bool = True) -> None:
        """Stop the rounds; with ``hand_over`` give every partition back (checkpointed and
        acknowledged) and leave the member list, so the others take over at once."""
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        try:
            if not hand_over:
                return
            async with self._lock:  # the leases are still renewed while each is handed over
                for p in sorted(self.book.owned):
                    await self._hand_over(p)
        finally:
            if self._renewer is not None:
                self._renewals_end.set()
                await cancel_and_wait(self._renewer)
                self._renewer = None
        if self.kv is not None:  # after the last renewal: the others see it gone
            with contextlib.suppress(NatsError):
                await self.kv.delete(member_key(self.replica))
