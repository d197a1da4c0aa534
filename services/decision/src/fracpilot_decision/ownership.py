"""Partition ownership through leases in NATS KV: which replica consumes which partition.

The bucket ``fracpilot_decision_partitions`` has a TTL (``lease_s``): a key that is not
written again within it disappears. Each replica keeps two kinds of keys alive:

- ``member.<replica>``: the replica is alive (rewritten every ``lease_s / 4``);
- ``partition.<k>``: the replica owns partition ``k`` (created with compare-and-set, so one
  replica wins a race; renewed with compare-and-set on the revision, so a renewal fails once
  someone else holds it).

Every round a replica reads the bucket, computes the target ownership with
:func:`fracpilot_decision.partitions.moves_for` (the same answer on every replica), hands over
the partitions the target gives away (stop, checkpoint, acknowledge, then delete the lease)
and claims the free ones it should own (create the lease, restore the workloads'
checkpoints, then consume). A replica that dies stops renewing: its leases run out after at
most ``lease_s`` and the others claim the partitions. A replica trusts its own leases only
until ``3/4 lease_s`` after the last renewal it sent (the server counts the TTL from when it
stored the renewal, later), and a partition it can no longer trust is dropped at once.
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
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client as NatsClient
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from fracpilot_decision.metrics import OwnershipMetrics
from fracpilot_decision.partitions import Moves, moves_for
from fracpilot_decision.settings import PartitionLeaseSettings
from fracpilot_libs.nats.kv_snapshot import read_kv
from fracpilot_libs.nats.streams import set_replicas

log = logging.getLogger(__name__)

MEMBER = "member."
PARTITION = "partition."
TRUST = 0.75  # share of the lease a replica trusts its own lease for after renewing it
RETRY_S = 0.5  # between renewals while one goes unanswered (a KV leader moving)


def lease_io_timeout(lease_s: float) -> float:
    """How long a lease write waits for its ack: ``lease_s / 10``, at least 1 s (a loaded
    machine), at most nats-py's 5 s. A write sent while the bucket has no leader is never
    answered: the wait is how late the replica notices the new one. With nats-py's 5 s one
    unanswered renewal of a 10 s lease ran past its trust (renewed at 0, again at 2.5,
    unanswered until 7.5); with 1 s a renewal is tried every 1.5 s while none is answered."""
    return min(5.0, max(1.0, lease_s / 10))


def default_replica_id() -> str:
    """``<hostname>-<random>``: the pod name, unique across restarts of the same pod."""
    host = re.sub(r"[^-_A-Za-z0-9]", "_", socket.gethostname())[:100] or "replica"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def renew_member(kv: KeyValue, replica: str, body: bytes) -> None:
    """Say the replica is alive; a failure is logged (the leases are renewed regardless,
    each on its own: a KV leader moving fails some writes and not others)."""
    try:
        await kv.put(f"{MEMBER}{replica}", body)
    except Exception as exc:
        log.warning("member key not renewed", extra={"error": repr(exc)})


async def renew_lease(kv: KeyValue, partition: int, replica: str, revision: int) -> int:
    """Rewrite the partition's lease if it is still at ``revision``; its new revision. Raises
    ``KeyWrongLastSequenceError`` when someone else's write came between, but not when it
    was this replica's own earlier renewal, stored with its ack lost (a KV leader moving):
    only ``replica`` writes its name there, so a lease naming it is still its own. That one
    is written once more: the server counts its TTL from an unknown earlier moment, while
    the caller trusts the lease from when this renewal was sent."""
    key = f"{PARTITION}{partition}"
    try:
        return await kv.update(key, replica.encode(), last=revision)
    except KeyWrongLastSequenceError:
        entry = await kv.get(key)
        if entry.value != replica.encode() or entry.revision is None:
            raise
        log.info("partition lease renewal stored, its ack lost", extra={"partition": partition})
        return await kv.update(key, replica.encode(), last=entry.revision)


async def claim_lease(kv: KeyValue, partition: int, replica: str) -> int | None:
    """Create the partition's lease; its revision, or None when another replica was quicker
    or the outcome is unknown (NATS trouble). Never raises: a claim failing halfway through a
    round once left the partitions claimed before it leased, renewed, and never consumed. A
    create stored with its ack lost (a KV leader moving) leaves a lease naming this replica
    that it does not hold: the next round deletes it and claims the partition again."""
    try:
        return await kv.create(f"{PARTITION}{partition}", replica.encode())
    except KeyWrongLastSequenceError:
        return None  # another replica was quicker
    except Exception as exc:
        log.warning("partition not claimed", extra={"partition": partition, "error": repr(exc)})
        return None


async def open_lease_bucket(nc: NatsClient, bucket: str, lease_s: float, replicas: int) -> KeyValue:
    """The lease bucket, made with ``lease_s`` as its TTL (or that TTL set on an existing one),
    bound to a JetStream context whose writes wait no longer than :func:`lease_io_timeout`
    for their ack (the set-up keeps nats-py's timeout)."""
    js = nc.jetstream()
    try:
        await js.key_value(bucket)
        info = await js.stream_info(f"KV_{bucket}")
        if info.config.max_age != lease_s:
            log.warning(
                "setting the partition lease (the bucket's TTL)",
                extra={"from_s": info.config.max_age, "to_s": lease_s},
            )
            info.config.max_age = lease_s
            await js.update_stream(info.config)
        await set_replicas(js, f"KV_{bucket}", replicas)
    except (BucketNotFoundError, NotFoundError):
        await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=lease_s,
                storage=StorageType.FILE,
                replicas=replicas,
                description="decision replicas and their usage-partition leases",
            )
        )
    info = await js.stream_info(f"KV_{bucket}")
    return KeyValue(  # as js.key_value makes it, on the context with the short wait
        name=bucket,
        stream=f"KV_{bucket}",
        pre=f"$KV.{bucket}.",
        js=nc.jetstream(timeout=lease_io_timeout(lease_s)),
        direct=bool(info.config.allow_direct),
    )


class PartitionHolder(Protocol):
    """What the service does when ownership changes (called from the ownership loop)."""

    async def take(self, partitions: frozenset[int]) -> None:
        """Claimed: restore the partitions' workloads, then consume them."""

    async def hand_over(self, partition: int) -> None:
        """Another replica gets it: stop consuming, checkpoint and acknowledge, forget it."""

    async def drop(self, partition: int) -> None:
        """The lease is lost or no longer trusted: stop at once, no checkpoint, forget it."""


@dataclass(frozen=True)
class View:
    """The bucket as one round read it."""

    members: frozenset[str]
    owners: dict[int, str]  # partition -> replica holding its lease
    revisions: dict[int, int]  # partition -> revision of its lease


async def read_view(nc: NatsClient, bucket: str) -> View:
    """Every live member and lease in the bucket: the last message of each key, read up to
    the count there was when the read began (a snapshot, :mod:`fracpilot_libs.nats.kv_snapshot`:
    a KV watch waits for a moment with nothing pending, which a busy bucket may not have)."""
    members: set[str] = set()
    owners: dict[int, str] = {}
    revisions: dict[int, int] = {}
    async with asyncio.timeout(10):
        entries = await read_kv(nc, bucket, name_prefix="decision-leases")
    for key, m in entries.items():
        if key.startswith(MEMBER):
            members.add(key[len(MEMBER) :])
        elif key.startswith(PARTITION):
            with contextlib.suppress(ValueError):
                p = int(key[len(PARTITION) :])
                owners[p] = m.data.decode()
                revisions[p] = m.sequence
    return View(frozenset(members), owners, revisions)


class Ownership:
    """This replica's leases; :meth:`holds` says whether it may still act on a partition."""

    def __init__(
        self,
        nc: NatsClient,
        holder: PartitionHolder,
        *,
        partitions: int,
        replica: str,
        lease: PartitionLeaseSettings,
        registry: CollectorRegistry,
        bucket: str,
        replicas: int = 1,
    ) -> None:
        self.nc = nc
        self.replicas = replicas
        self.holder = holder
        self.partitions = partitions
        self.replica = replica
        self.lease_s = lease.lease_s
        self.bucket = bucket
        self.metrics = OwnershipMetrics(registry)
        self.kv: KeyValue | None = None
        self.revisions: dict[int, int] = {}  # partitions held: lease revision
        self._trusted_until: dict[int, float] = {}  # time.monotonic() deadlines
        self._lock = asyncio.Lock()  # one round (or the leave) at a time
        # A renewal and a release of the same lease never cross.
        self._lease_io: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._renewer: asyncio.Task[None] | None = None  # runs on until the hand-overs are done
        self._forgetting: set[asyncio.Task[None]] = set()

    @property
    def renew_s(self) -> float:
        return self.lease_s / 4

    def holds(self, partition: int) -> bool:
        """True while this replica's lease on the partition can be trusted."""
        until = self._trusted_until.get(partition)
        return until is not None and time.monotonic() < until

    @property
    def owned(self) -> frozenset[int]:
        return frozenset(self.revisions)

    # --- set-up -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the bucket with the lease as its TTL (or set the TTL of an existing one)."""
        self.kv = await open_lease_bucket(self.nc, self.bucket, self.lease_s, self.replicas)

    def _kv(self) -> KeyValue:
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
        """Renew ``lease_s / 4`` after the last renewal began (one that waited for its ack
        still leaves the next inside the trust), every ``RETRY_S`` while one goes unanswered.
        Runs until cancelled: the leases are renewed while the partitions are handed over."""
        pause = self.renew_s
        while True:
            await asyncio.sleep(pause)
            began = time.monotonic()
            try:
                answered = await self.renew()
            except Exception as exc:  # NATS trouble: the next renewal tries again
                log.warning("partition renew failed", extra={"error": repr(exc)})
                answered = False
            pause = self.renew_s - (time.monotonic() - began)
            pause = max(0.0, pause) if answered else min(RETRY_S, self.renew_s)

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
            except Exception as exc:  # NATS trouble: the next round tries again
                log.warning("partition rebalance failed", extra={"error": repr(exc)})

    async def _watch(self) -> None:
        """Wake the rebalance when a replica joins (a member key not seen before) or a lease
        or member is deleted (a hand-over, a replica leaving), instead of at the next period.
        Renewals and expiries make no wake-up (the period catches expiries)."""
        seen: set[str] = set()
        while not self._stopping:
            try:
                watcher = await self._kv().watchall(include_history=False)
                try:
                    while not self._stopping:
                        try:
                            entry = await watcher.updates(timeout=self.renew_s)  # type: ignore[no-untyped-call]
                        except NatsTimeoutError:
                            continue
                        if entry is None:
                            continue
                        if entry.operation is not None:  # DEL or PURGE
                            seen.discard(entry.key)
                            self._wake.set()
                        elif entry.key.startswith(MEMBER) and entry.key not in seen:
                            seen.add(entry.key)
                            self._wake.set()
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a restarted server forgot the watcher: start again
                log.info("partition watch restarting", extra={"error": repr(exc)})
                await asyncio.sleep(self.renew_s)

    # --- rounds -----------------------------------------------------------------------------

    async def renew(self) -> bool:
        """Say this replica is alive and renew its leases; drop what is lost or untrusted.
        False when a renewal got no answer (NATS trouble)."""
        kv = self._kv()
        sent = time.monotonic()
        body = json.dumps({"replica": self.replica, "partitions": sorted(self.revisions)})
        held = list(self.revisions)
        member = asyncio.ensure_future(renew_member(kv, self.replica, body.encode()))
        results = await asyncio.gather(*(self._renew_one(kv, p) for p in held))
        await member
        for p, outcome in zip(held, results, strict=True):
            if outcome is True:
                self._trusted_until[p] = sent + TRUST * self.lease_s
            elif outcome is False:
                log.warning("partition lease lost", extra={"partition": p})
                await self._drop(p)
        for p in list(self.revisions):
            if not self.holds(p):
                log.warning("partition lease no longer trusted", extra={"partition": p})
                await self._drop(p)
        return None not in results

    async def _renew_one(self, kv: KeyValue, p: int) -> bool | None:
        """True: renewed; False: lost (someone else holds it, or it ran out); None: unknown
        (NATS trouble: trusted until its deadline)."""
        try:
            async with self._lease_io[p]:
                if (revision := self.revisions.get(p)) is None:
                    return None  # released meanwhile
                self.revisions[p] = await renew_lease(kv, p, self.replica, revision)
            return True
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            return False
        except Exception as exc:
            log.warning("partition lease not renewed", extra={"partition": p, "error": repr(exc)})
            return None

    def forget_soon(self, partition: int) -> None:
        """Drop a partition whose lease can no longer be trusted (from its own consumer)."""
        task = asyncio.create_task(self._drop(partition), name=f"forget-{partition}")
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _drop(self, partition: int) -> None:
        if self.revisions.pop(partition, None) is None:
            return
        self._trusted_until.pop(partition, None)
        self.metrics.moves.labels("dropped").inc()
        self.metrics.owned.set(len(self.revisions))
        await self.holder.drop(partition)

    async def rebalance(self) -> Moves:
        """Read the bucket; hand over what the target gives away; claim what it gives here."""
        async with self._lock:
            if self._stopping:
                return Moves(frozenset(), frozenset())
            view = await read_view(self.nc, self.bucket)
            kv = self._kv()
            owners = dict(view.owners)
            for p, owner in view.owners.items():
                if owner == self.replica and p not in self.revisions:
                    # A lease of ours this replica no longer acts on (dropped): free it.
                    with contextlib.suppress(Exception):
                        await kv.delete(f"{PARTITION}{p}", last=view.revisions[p])
                    del owners[p]
            self.metrics.replicas.set(len(view.members | {self.replica}))
            moves = moves_for(self.replica, self.partitions, view.members, owners)
            for p in sorted(moves.release):
                await self._hand_over(p)
            claimed = []
            for p in sorted(moves.claim):
                sent = time.monotonic()
                if (revision := await claim_lease(kv, p, self.replica)) is not None:
                    self.revisions[p] = revision
                    self._trusted_until[p] = sent + TRUST * self.lease_s
                    claimed.append(p)
            if claimed:
                await self._take(frozenset(claimed))
            return moves

    async def _take(self, claimed: frozenset[int]) -> None:
        """Hand the claimed partitions to the holder; if that fails they are dropped (their
        leases freed by the next round, which claims them again), never held unconsumed."""
        self.metrics.moves.labels("claimed").inc(len(claimed))
        self.metrics.owned.set(len(self.revisions))
        log.info(
            "partitions claimed", extra={"partitions": sorted(claimed), "replica": self.replica}
        )
        try:
            await self.holder.take(claimed)
        except Exception as exc:
            log.warning(
                "claimed partitions not taken, dropped",
                extra={"partitions": sorted(claimed), "error": repr(exc)},
            )
            for p in sorted(claimed):
                await self._drop(p)

    async def _hand_over(self, partition: int) -> None:
        """Checkpoint and acknowledge while the lease is still renewed, then release it: the
        next owner restores only after every state this replica had is written."""
        if partition not in self.revisions:
            return
        await self.holder.hand_over(partition)
        async with self._lease_io[partition]:
            revision = self.revisions.pop(partition, None)
            self._trusted_until.pop(partition, None)
            self.metrics.moves.labels("handed_over").inc()
            self.metrics.owned.set(len(self.revisions))
            if revision is None:
                return  # lost meanwhile
            try:
                await self._kv().delete(f"{PARTITION}{partition}", last=revision)
            except Exception as exc:  # NATS trouble: the lease runs out instead
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
                for p in sorted(self.revisions):
                    try:
                        await self._hand_over(p)
                    except Exception as exc:
                        log.warning(
                            "partition not handed over",
                            extra={"partition": p, "error": repr(exc)},
                        )
        finally:
            if self._renewer is not None:
                self._renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._renewer
                self._renewer = None
        with contextlib.suppress(Exception):  # after the last renewal: the others see it gone
            await self._kv().delete(f"{MEMBER}{self.replica}")
