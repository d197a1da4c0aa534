"""Checkpoints of the engine's per-workload state, so that a workload's history survives a
restart of the decision service and a move of its partition to another replica.

States live in the KV bucket ``fracpilot_decision_state``, several in one value, a **group**
(``groups/<slot>/<g>``, :mod:`fracpilot_libs.sizing.checkpoint_groups`: one message for about
24 states at 100,000 workloads, where one each cost nats-server more than the samples); each
state carries the stream position of the last sample in it. Checkpoints of one workload under
its ``subjects.kv_key`` (before groups) are still read, and deleted once a group holds their
workload. The service writes the groups whose states changed in batches (every
``checkpoint_interval_s``, and when it hands a partition over or stops), pipelined rather than
one round trip each, then the partition's **mark**: the stream position up to which every
sample is in a checkpoint (key ``marks/<partition's stream>``, never a workload key; a stream's
positions stay valid whatever the partition count).
A replica that claims a partition reads the checkpoints of that partition's workloads (one
pass over the bucket for all the partitions it claims at once) and its mark, and consumes from
the sample after the mark. A checkpoint that does not load is logged, counted and skipped:
that workload starts afresh.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Collection, Mapping

from prometheus_client import CollectorRegistry

from fracpilot_decision.metrics import CheckpointMetrics
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.client_types import NatsClient
from fracpilot_libs.nats.declare_retry import declare_patiently
from fracpilot_libs.nats.kv import KvBucket, open_kv
from fracpilot_libs.nats.kv_snapshot import SnapshotStalledError, kv_chunks
from fracpilot_libs.sizing.checkpoint_groups import (
    GROUP_PREFIX,
    CheckpointRead,
    dump_group,
    group_key,
    group_partition,
)
from fracpilot_libs.sizing.state import WorkloadState

log = logging.getLogger(__name__)

_KEY = re.compile(r"[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*")  # what a KV key may be
_READ_BATCH = 1000
CHECKPOINT_CHUNK = 100  # states serialised and in flight at once
_MAX_PAUSE_S = 0.05  # between two chunks of a spread checkpoint
_ACK_TIMEOUT_S = 10.0


def mark_key(partition: int) -> str:
    """Where the mark of ``partition``'s stream is kept: one slash, where a workload key has
    three, so that no workload's checkpoint can take its place. (The marks of the earlier
    single usage stream, ``marks/<count>/<partition>``, are positions in that stream: they
    are never read.)"""
    return f"marks/{subjects.usage_stream(partition)}"


class Checkpointer:
    """Writes and reads workload states in the checkpoint bucket."""

    def __init__(self, nc: NatsClient, registry: CollectorRegistry, replicas: int = 1) -> None:
        self.nc = nc
        self.replicas = replicas
        self.bucket = subjects.DECISION_STATE_BUCKET
        self._kv: KvBucket | None = None
        # per-workload checkpoints (written before groups) seen by restore, not yet deleted
        self.single_keys: set[str] = set()
        # each workload's group: a checkpoint looks up every state of its partition (hashing
        # its key each time cost 2-4 us a workload); one name shared by a group's workloads
        self._group_of: dict[str, str | None] = {}
        self._group_names: dict[str, str] = {}
        self.metrics = CheckpointMetrics(registry)
        m = self.metrics
        self.written, self.write_failures = m.written, m.write_failures
        self.restored, self.corrupt = m.restored, m.corrupt

    async def open(self) -> None:
        """Open the bucket, made when missing and raised to :attr:`replicas`; a JetStream
        election in the way is waited out (:func:`declare_patiently`), anything else raised:
        a service that cannot checkpoint must not start."""
        js = self.nc.jetstream()
        self._kv = await declare_patiently(
            lambda: open_kv(js, self.bucket, replicas=self.replicas), f"bucket {self.bucket}"
        )

    @property
    def kv(self) -> KvBucket:
        if self._kv is None:
            raise RuntimeError("the checkpoint bucket is not opened (Checkpointer.open)")
        return self._kv

    # --- marks ------------------------------------------------------------------------------

    async def read_mark(self, partition: int, stream: str) -> int | None:
        """The partition's mark: every sample at or before it is in a checkpoint. None when
        the partition has none (its stream never consumed), or when the mark was written for
        another stream of that name (``stream``: the stream's creation time; it was deleted
        and made anew, its sequences start again). 0 when it does not parse (logged and
        counted): the whole stream is delivered again rather than a sample lost (positions
        skip what is known)."""
        key = mark_key(partition)
        entry = await self.kv.get(key)
        if entry is None:
            return None
        try:
            body = json.loads(entry.value)
            seq, made = body["seq"], body.get("stream")
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"not a stream position: {seq!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error(
                "partition mark unreadable: from the stream's start",
                extra={"key": key, "error": repr(exc)},
            )
            self.corrupt.inc()
            return 0
        if made is not None and made != stream:
            log.warning(
                "partition mark of an earlier stream of that name: not used",
                extra={"key": key, "marked_stream": made, "stream": stream},
            )
            return None
        return seq

    async def write_mark(self, partition: int, seq: int, stream: str) -> None:
        """Record that every sample of the partition up to ``seq`` is in a checkpoint (only
        after those checkpoints are written), in the stream created at ``stream``. Raises
        when it is not stored."""
        body = json.dumps({"seq": seq, "at": time.time(), "stream": stream}).encode()
        await self.kv.put(mark_key(partition), body)

    # --- writing ----------------------------------------------------------------------------

    async def write(
        self, states: Mapping[str, WorkloadState], keys: Collection[str], spread_s: float = 0.0
    ) -> set[str]:
        """Write the groups (:mod:`fracpilot_libs.sizing.checkpoint_groups`) holding the states
        of ``keys``, each with every state of ``states`` in it (so ``states`` is all of its
        partition's: a state left out is dropped from its group), about ``CHECKPOINT_CHUNK``
        states at a time, spread over about ``spread_s`` (pauses between chunks, 50 ms at most:
        a scheduled checkpoint lets samples flow; a hand-over does not wait); returns the keys
        whose write failed and may succeed later. A state may change while this runs: it is
        then written newer. Once a group is stored, the per-workload checkpoints of its
        workloads (written before groups, seen by :meth:`restore`) are deleted."""
        dirty: dict[str, list[str]] = {}  # group -> its keys asked for
        invalid = 0
        for key in keys:
            if key not in states:
                continue
            group = self._group(key)
            if group is None or not _KEY.fullmatch(key):  # can never be written: no retry
                invalid += 1
                log.warning("checkpoint key is not a valid KV key", extra={"key": key})
                continue
            dirty.setdefault(group, []).append(key)
        members: dict[str, list[str]] = {group: [] for group in dirty}
        for key in states:  # every state of a group is in its value, changed or not
            group = self._group(key)
            if group in members:
                members[group].append(key)
        chunks = -(-sum(map(len, members.values())) // CHECKPOINT_CHUNK)
        pause_s = min(_MAX_PAUSE_S, spread_s / chunks) if spread_s and chunks else 0.0
        failed: set[str] = set()
        written = 0
        batch: list[tuple[str, bytes]] = []
        in_batch = 0
        groups = list(members.items())
        for i, (group, names) in enumerate(groups):
            batch.append((group, dump_group((k, states[k]) for k in sorted(names) if k in states)))
            in_batch += len(names)
            if in_batch < CHECKPOINT_CHUNK and i + 1 < len(groups):
                continue
            lost = await self.kv.put_many(self.nc, batch, _ACK_TIMEOUT_S)
            for g, _ in batch:
                if g in lost:
                    failed.update(dirty[g])
                else:
                    written += len(members[g])
            await self._forget_single_keys([members[g] for g, _ in batch if g not in lost])
            batch, in_batch = [], 0
            if i + 1 < len(groups):
                await asyncio.sleep(pause_s)  # at least a turn of the loop: never block it
        if invalid:
            self.write_failures.inc(invalid)
        self.written.inc(written)
        if failed:
            self.write_failures.inc(len(failed))
            log.warning("checkpoint writes failed", extra={"failed": len(failed)})
        return failed

    def _group(self, key: str) -> str | None:
        if key in self._group_of:
            return self._group_of[key]
        group = group_key(key)
        if group is not None:
            group = self._group_names.setdefault(group, group)
        self._group_of[key] = group
        return group

    async def _forget_single_keys(self, stored: list[list[str]]) -> None:
        """Delete the per-workload checkpoints of workloads now in a stored group (a delete
        that fails is tried at the group's next write)."""
        keys = [k for names in stored for k in names if k in self.single_keys]
        if not keys:
            return
        lost = await self.kv.delete_many(self.nc, keys, _ACK_TIMEOUT_S)
        self.single_keys.difference_update(set(keys) - lost)

    # --- reading ----------------------------------------------------------------------------

    async def restore(
        self, partitions: frozenset[int], count: int
    ) -> dict[int, dict[str, WorkloadState]]:
        """The workload states of ``partitions`` (of ``count``), by partition and key; one
        pass over the bucket, only those partitions' groups and per-workload checkpoints are
        parsed."""
        started = time.monotonic()

        def wanted(key: str) -> bool:
            return subjects.partition_of_kv_key(key, count) in partitions

        read = CheckpointRead(wanted)
        async for batch in self._read_all():
            for key, data in batch:
                if key.startswith(GROUP_PREFIX):
                    if group_partition(key, count) in partitions:
                        read.add(key, data)
                        await asyncio.sleep(0)  # a group is ~24 states: ~1 ms of parsing
                elif wanted(key):
                    read.add(key, data)
            await asyncio.sleep(0)  # parsing 100,000 states must not block the loop
        for key, error in read.problems:
            log.error(
                "corrupt checkpoint skipped, the workload starts afresh",
                extra={"key": key, "error": error[:500]},
            )
        self.single_keys |= read.single_keys
        states: dict[int, dict[str, WorkloadState]] = {p: {} for p in partitions}
        for key, state in read.states.items():
            partition = subjects.partition_of_kv_key(key, count)
            if partition is not None:
                states[partition][key] = state
        self.corrupt.inc(len(read.problems))
        self.restored.inc(len(read.states))
        log.info(
            "checkpoints restored",
            extra={
                "partitions": sorted(partitions),
                "workloads": len(read.states),
                "corrupt": len(read.problems),
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return states

    async def _read_all(self) -> AsyncIterator[list[tuple[str, bytes]]]:
        """The current value of every key (deleted keys left out), in batches as read by a
        snapshot (:mod:`fracpilot_libs.nats.kv_snapshot`): at 100,000 keys far quicker than a KV
        watch, and never all in memory.

        A read that stalls (NATS busy electing a leader) raises: restoring what was read so far
        would start the unread workloads afresh, their history lost. The callers give the
        partitions up and a later round claims them again."""
        try:
            async for part in kv_chunks(
                self.nc, self.bucket, chunk=_READ_BATCH, stall_s=5.0, name_prefix="decision-restore"
            ):
                yield [(key, m.data) for key, m in part]
        except SnapshotStalledError as exc:
            log.warning(
                "checkpoint read stalled, the restore is given up and tried again",
                extra={"read": exc.read, "of": exc.of},
            )
            raise
