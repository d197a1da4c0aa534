"""The usage partition streams: made, renumbered, read back; the earlier single stream retired.

Usage samples are stored in one stream per partition (see :mod:`fracpilot_libs.nats.subjects`).
Stream 0's metadata records the partition count in force; the decision service, which
consumes the partitions, is the only one that changes it (``assign=True``); any other service
makes the streams when there are none, with its own setting, and otherwise leaves them as
they are. Changing the count moves slots between streams: samples already stored stay where
they are, so it is done with the decision service caught up (docs/performance.md).

The layout before this one was a single stream, ``FRACPILOT_USAGE``, on ``fracpilot.usage.v1.>``
with a partitioning subject transform. Its subjects overlap the new ones; it is narrowed to
what the previous version's publishers send (so it still takes their samples during a rolling
upgrade and no publish fails) and left to age out. Its samples are not decided by this
version: how many its consumers had not finished is logged.
"""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.streams import wait_until_replicated

log = logging.getLogger(__name__)


async def usage_partition_count(js: JetStreamContext) -> int | None:
    """The partition count in force (None: no usage streams yet)."""
    try:
        info = await js.stream_info(subjects.usage_stream(0))
    except NotFoundError:
        return None
    value = (info.config.metadata or {}).get(subjects.USAGE_PARTITIONS_METADATA, "")
    return int(value) if value.isdigit() else None


def usage_stream_config(
    partition: int,
    partitions: int,
    max_age_s: float | None,
    stream_subjects: tuple[str, ...],
    replicas: int = 1,
    max_bytes: int | None = None,
) -> StreamConfig:
    return StreamConfig(
        name=subjects.usage_stream(partition),
        description=f"GPU usage samples of usage partition {partition} of {partitions}",
        subjects=list(stream_subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age_s,
        max_bytes=max_bytes,  # at the limit the oldest samples go (discard old)
        duplicate_window=120.0,
        num_replicas=replicas,
        metadata={subjects.USAGE_PARTITIONS_METADATA: str(partitions)},
    )


async def _subjects_of(js: JetStreamContext, stream: str) -> tuple[str, ...] | None:
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return None
    return tuple(info.config.subjects or ())


async def _put(js: JetStreamContext, config: StreamConfig) -> None:
    """Update the stream to ``config``, or make it (one request when it exists)."""
    try:
        await js.update_stream(config)
    except NotFoundError:
        await js.add_stream(config)


async def ensure_usage_streams(
    js: JetStreamContext,
    partitions: int,
    max_age_s: float | None,
    *,
    assign: bool,
    replicas: int = 1,
    max_bytes: int | None = None,
) -> None:
    """Make the usage streams (or, with ``assign``, renumber them to ``partitions``), each
    with ``replicas`` replicas (an existing stream is raised to them) and at most
    ``max_bytes``."""
    await retire_legacy_usage_stream(js)
    recorded = await usage_partition_count(js)
    if recorded is not None and (recorded == partitions or not assign):
        for p in range(recorded):  # the retention may have changed; the slots stay
            wanted = subjects.usage_stream_subjects(p, recorded)
            await _put(js, usage_stream_config(p, recorded, max_age_s, wanted, replicas, max_bytes))
        await _wait_until_replicated(js, recorded, replicas)
        return
    if recorded is not None:
        log.warning(
            "changing the usage partition count: samples already stored stay in their "
            "partition's stream (see docs/performance.md: do it with the decision caught up)",
            extra={"from": recorded, "to": partitions},
        )
    # Two passes: no subject may be in two streams at once, so every stream first keeps only
    # the slots it keeps (a publish to a slot between the passes fails and is retried), then
    # takes its new ones. Stream 0, whose metadata is the record, is written last.
    streams = range(max(partitions, recorded or 0))
    current = {p: await _subjects_of(js, subjects.usage_stream(p)) for p in streams}
    for p in streams:
        now = current[p]
        if now is None:
            continue
        keeps = set(
            subjects.usage_stream_subjects(p, partitions)
            if p < partitions
            else subjects.retired_usage_subjects(p)
        )
        kept = tuple(s for s in now if s in keeps) or subjects.retired_usage_subjects(p)
        if kept != now:
            await js.update_stream(
                usage_stream_config(p, recorded or partitions, max_age_s, kept, replicas, max_bytes)
            )
    for p in [*range(1, len(streams)), 0]:
        final = (
            subjects.usage_stream_subjects(p, partitions)
            if p < partitions
            else subjects.retired_usage_subjects(p)
        )
        await _put(js, usage_stream_config(p, partitions, max_age_s, final, replicas, max_bytes))
    await _wait_until_replicated(js, len(streams), replicas)


async def _wait_until_replicated(js: JetStreamContext, streams: int, replicas: int) -> None:
    """Each stream made or raised to ``replicas`` has elected its leader (one request each
    when it has)."""
    for p in range(streams):
        await wait_until_replicated(js, subjects.usage_stream(p), replicas)


async def usage_streams(js: JetStreamContext) -> list[str]:
    """The usage partition streams in force, in partition order (empty: none yet)."""
    count = await usage_partition_count(js)
    return [subjects.usage_stream(p) for p in range(count or 0)]


async def retire_legacy_usage_stream(js: JetStreamContext) -> None:
    """Narrow the previous layout's single usage stream to the previous publishers' subjects."""
    try:
        info = await js.stream_info(subjects.LEGACY_USAGE_STREAM)
    except NotFoundError:
        return
    if list(info.config.subjects or ()) == [subjects.LEGACY_USAGE_SUBJECTS]:
        return
    undecided = 0
    try:
        for consumer in await js.consumers_info(subjects.LEGACY_USAGE_STREAM):
            undecided += (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
    except Exception as exc:  # the count is for the log only
        log.info("legacy usage consumers not read", extra={"error": repr(exc)})
    config = info.config
    config.subjects = [subjects.LEGACY_USAGE_SUBJECTS]
    await js.update_stream(config)
    log.warning(
        "the previous layout's usage stream is retired: kept until its samples age out, "
        "not decided by this version",
        extra={"stream": subjects.LEGACY_USAGE_STREAM, "undecided_samples": undecided},
    )
