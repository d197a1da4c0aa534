"""Checkpoints of the engine's per-workload state, so that a workload's history survives a
restart of the decision service and a move of its partition to another replica.

States live in the KV bucket ``fracpilot_decision_state`` under ``subjects.kv_key(workload)``,
as :func:`fracpilot_libs.sizing.state.dump_state` writes them (each carries the stream position
of the last sample in it). The service writes the states that changed in batches (every
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
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state

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
        """Write the states of ``keys`` (those still in ``states``), ``CHECKPOINT_CHUNK`` at a
        time, spread over about ``spread_s`` (pauses between chunks, 50 ms at most: a
        scheduled checkpoint lets samples flow; a hand-over does not wait); returns the keys
        whose write failed and may succeed later. A state may change while this runs: it is
        then written newer."""
        chunks = -(-len(keys) // CHECKPOINT_CHUNK)
        pause_s = min(_MAX_PAUSE_S, spread_s / chunks) if spread_s and chunks else 0.0
        failed: set[str] = set()
        written = invalid = 0
        batch: list[tuple[str, bytes]] = []
        for key in keys:
            state = states.get(key)
            if state is None:
                continue
            if not _KEY.fullmatch(key):  # can never be written: no retry
                invalid += 1
                log.warning("checkpoint key is not a valid KV key", extra={"key": key})
                continue
            batch.append((key, dump_state(state)))
            if len(batch) == CHECKPOINT_CHUNK:
                lost = await self.kv.put_many(self.nc, batch, _ACK_TIMEOUT_S)
                failed |= lost
                written += len(batch) - len(lost)
                batch = []
                await asyncio.sleep(pause_s)  # at least a turn of the loop: never block it
        if batch:
            lost = await self.kv.put_many(self.nc, batch, _ACK_TIMEOUT_S)
            failed |= lost
            written += len(batch) - len(lost)
        if invalid:
            self.write_failures.inc(invalid)
        self.written.inc(written)
        if failed:
            self.write_failures.inc(len(failed))
            log.warning("checkpoint writes failed", extra={"failed": len(failed)})
        return failed

    # --- reading ----------------------------------------------------------------------------

    async def restore(
        self, partitions: frozenset[int], count: int
    ) -> dict[int, dict[str, WorkloadState]]:
        """The workload states of ``partitions`` (of ``count``), by partition and key; one
        pass over the bucket, only those partitions' checkpoints are parsed."""
        started = time.monotonic()
        states: dict[int, dict[str, WorkloadState]] = {p: {} for p in partitions}
        seen = corrupt = 0
        async for batch in self._read_all():
            for key, data in batch:
                partition = subjects.partition_of_kv_key(key, count)
                if partition is None or partition not in states:
                    continue
                seen += 1
                try:
                    states[partition][key] = load_state(data)
                except Exception as exc:  # any failure to load means a corrupt checkpoint
                    corrupt += 1
                    log.error(
                        "corrupt checkpoint skipped, the workload starts afresh",
                        extra={"key": key, "error": str(exc)[:500], "size": len(data)},
                    )
            await asyncio.sleep(0)  # parsing 100,000 states must not block the loop
        self.corrupt.inc(corrupt)
        self.restored.inc(seen - corrupt)
        log.info(
            "checkpoints restored",
            extra={
                "partitions": sorted(partitions),
                "workloads": seen - corrupt,
                "corrupt": corrupt,
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
