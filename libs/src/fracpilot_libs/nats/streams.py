"""The streams every deployment has, declared idempotently (created, or updated to the spec).

Decisions, results (actuations; consolidation's plans and moves, under the results' limits) and
dead letters are kept for audit; the usage streams, one per partition and bounded in age, are
:mod:`fracpilot_libs.nats.usage_streams`. Each may be bounded in bytes and
age (``FRACPILOT_STREAMS_*``); every stream discards its oldest messages at a limit (discard
policy "old": a publish is never refused for space, the history is shortened). Every stream
and KV bucket has the same number of replicas (:func:`replicas_for`); one made with fewer, by
an earlier version or on a smaller cluster, is raised in place (:func:`set_replicas`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError, ServiceUnavailableError

from fracpilot_libs.config import StreamLimitSettings
from fracpilot_libs.nats import subjects

# re-exported: where the replicas come from is nats_servers' business
from fracpilot_libs.nats.servers import CLUSTER_REPLICAS as CLUSTER_REPLICAS
from fracpilot_libs.nats.servers import replicas_for as replicas_for

log = logging.getLogger(__name__)


async def set_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Give an existing stream (a KV bucket's is ``KV_<bucket>``) ``replicas`` replicas, in
    place: the server copies its messages to the new peers."""
    info = await js.stream_info(stream)
    current = info.config.num_replicas or 1
    if current == replicas:
        return
    log.warning(
        "changing the replicas of a stream",
        extra={"stream": stream, "from": current, "to": replicas},
    )
    info.config.num_replicas = replicas
    try:
        await js.update_stream(info.config)
    except NatsTimeoutError:  # not allowed to (deploy/nats/permissions.conf): runs as it is
        log.warning(
            "the stream's replicas were not changed (no answer: is $JS.API.STREAM.UPDATE "
            "of it permitted?)",
            extra={"stream": stream, "replicas": current},
        )
        return
    await wait_until_replicated(js, stream, replicas)


async def wait_until_replicated(
    js: JetStreamContext, stream: str, replicas: int, timeout_s: float = 30.0
) -> None:
    """Return once the stream has a leader and its followers: a stream whose replicas just
    changed elects a leader first, and a write meanwhile times out. After ``timeout_s`` it
    logs and returns (the writers retry)."""
    if replicas <= 1:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            cluster = (await js.stream_info(stream)).cluster
        except (NatsTimeoutError, ServiceUnavailableError):
            cluster = None  # no leader to answer yet
        if cluster and cluster.leader and len(cluster.replicas or ()) >= replicas - 1:
            return
        await asyncio.sleep(0.1)
    log.warning("stream not replicated in time", extra={"stream": stream, "replicas": replicas})


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float | None
    description: str
    max_bytes: int | None = None


def default_streams(limits: StreamLimitSettings | None = None) -> tuple[StreamSpec, ...]:
    """Decisions, results and dead letters, kept for audit within ``limits`` (none by
    default). (The usage streams, one per partition and bounded in age, are
    :mod:`fracpilot_libs.nats.usage_streams`.)"""
    lim = limits or StreamLimitSettings()  # a limit of 0 is none (None)
    return (
        StreamSpec(
            subjects.DECISION_STREAM,
            (f"{subjects.DECISION_PREFIX}.>",),
            lim.decisions_max_age_s or None,
            "fraction decisions, replayable for audit",
            lim.decisions_max_bytes or None,
        ),
        StreamSpec(
            subjects.ACTUATION_STREAM,
            (f"{subjects.ACTUATION_PREFIX}.>",),
            lim.results_max_age_s or None,
            "actuation results, replayable for audit",
            lim.results_max_bytes or None,
        ),
        StreamSpec(  # a result stream too: the results' limits
            subjects.CONSOLIDATION_STREAM,
            (f"{subjects.CONSOLIDATION_PREFIX}.>",),
            lim.results_max_age_s or None,
            "consolidation plans (would free) and moves (freed), for status and report",
            lim.results_max_bytes or None,
        ),
        StreamSpec(
            subjects.DEADLETTER_STREAM,
            (f"{subjects.DEADLETTER_PREFIX}.>",),
            lim.deadletters_max_age_s or None,
            "messages a service could not accept, with the reason",
            lim.deadletters_max_bytes or None,
        ),
    )


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        duplicate_window=120.0,
        num_replicas=replicas,
    )


# A JetStream API request can time out while a replicated stream is being placed or its
# leader elected (seen on a loaded 3-node cluster); creating and updating are idempotent.
API_ATTEMPTS = 4


async def ensure_streams(
    js: JetStreamContext, specs: tuple[StreamSpec, ...], replicas: int = 1
) -> None:
    """Create each stream, or update it to its spec (its replicas included)."""
    for spec in specs:
        for attempt in range(1, API_ATTEMPTS + 1):
            try:
                await _ensure_stream(js, spec, replicas)
                break
            except NatsTimeoutError:
                if attempt == API_ATTEMPTS:
                    raise
                log.warning(
                    "jetstream api timed out, trying again",
                    extra={"stream": spec.name, "attempt": attempt},
                )


async def _ensure_stream(js: JetStreamContext, spec: StreamSpec, replicas: int) -> None:
    config = stream_config(spec, replicas)
    try:
        before = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(config)
        return
    await js.update_stream(config)
    if (before.config.num_replicas or 1) != replicas:
        await wait_until_replicated(js, spec.name, replicas)
