"""Test helpers: run a service in-process against a real NATS, read streams back, wait.

The readers take where to connect as :data:`NatsAccess`: a URL (a server without auth), or the
settings of one identity (user, password, TLS CA), as the services and the CLI connect through
:func:`fracpilot_libs.nats.connect.open_connection`. They only read, with ordered (ephemeral,
unacknowledged) consumers, so the chart's read-only operator identity is enough for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import Allocation, WorkloadRef
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import open_connection, server_urls
from fracpilot_libs.nats.usage_batch import as_samples
from fracpilot_libs.nats.usage_streams import usage_streams
from fracpilot_libs.runtime import ServiceRuntime

T = TypeVar("T")
# A URL (comma-separated servers, no identity) or the settings of one identity, TLS included.
NatsAccess = str | ServiceSettings
DEFAULT_PARTITIONS = ServiceSettings.model_fields["decision_partitions"].default

STREAMS = (
    subjects.DECISION_STREAM,
    subjects.ACTUATION_STREAM,
    subjects.DEADLETTER_STREAM,
    subjects.CONSOLIDATION_STREAM,
)
BUCKETS = (
    subjects.POLICY_BUCKET,
    subjects.ALLOCATION_BUCKET,
    subjects.INGEST_STATE_BUCKET,
    subjects.ACTUATOR_STATE_BUCKET,
    subjects.TARGET_BUCKET,
    subjects.DECISION_STATE_BUCKET,
    subjects.DECISION_PARTITION_BUCKET,
    subjects.INGEST_SHARD_BUCKET,
)


class RunsInRuntime(Protocol):
    runtime: ServiceRuntime

    async def start(self) -> None: ...


async def connect(access: NatsAccess) -> NatsClient:
    """A client of the test, with nats-py's defaults otherwise (it reconnects)."""
    if isinstance(access, str):
        return await nats.connect(access.split(","))
    return await open_connection(access, servers=server_urls(access))


async def reset_nats(url: str) -> None:
    """Delete fracpilot's streams and buckets so each test starts from nothing."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    names = await js.streams_info()
    usage = [
        i.config.name
        for i in names
        if subjects.usage_stream_partition(i.config.name) is not None
        or i.config.name == subjects.LEGACY_USAGE_STREAM
    ]
    for name in (*STREAMS, *usage):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    for bucket in BUCKETS:
        with contextlib.suppress(NotFoundError, Exception):
            await js.delete_key_value(bucket)
    await nc.close()


@contextlib.asynccontextmanager
async def running(
    service: Any, stop: Callable[[], Awaitable[None]] | None = None
) -> AsyncIterator[Any]:
    """Run a service's runtime as a task until the block ends; waits until it is ready.

    Shutdown is graceful and calls the service's own ``stop`` (as ``service.run()`` does)
    unless another ``stop`` is given.
    """
    runtime: ServiceRuntime = service.runtime
    stop = stop or getattr(service, "stop", None)
    task = asyncio.create_task(runtime.run(service.start, stop, install_signals=False))
    await wait_for(lambda: runtime.health.ready or task.done(), timeout=20)
    if task.done():
        task.result()
    try:
        yield service
    finally:
        runtime.stop_requested.set()
        await asyncio.wait_for(task, timeout=30)


async def wait_for(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)


async def read_stream(
    access: NatsAccess, stream: str, subject: str = ">", idle_s: float = 2.0
) -> list[tuple[str, bytes]]:
    """Every message currently in a stream, as (subject, payload), through an ordered consumer
    (read-only: no durable, no acknowledgement); stops at the last or after ``idle_s``
    without a message."""
    nc = await connect(access)
    try:
        return [(m.subject, m.data) for m in await read_messages(nc, stream, subject, idle_s)]
    finally:
        await nc.close()


async def read_messages(
    nc: NatsClient, stream: str, subject: str = ">", idle_s: float = 2.0
) -> list[Any]:
    """The messages (nats-py ``Msg``, with their metadata) of :func:`read_stream`, on a
    connection the caller holds."""
    js = nc.jetstream()
    try:
        total = (await js.stream_info(stream)).state.messages
    except NotFoundError:
        return []
    out: list[Any] = []
    if not total:
        return out
    sub = await js.subscribe(
        subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        while len(out) < total:
            try:
                msg = await sub.next_msg(timeout=idle_s)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            out.append(msg)
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


def usage_stream_of(workload: WorkloadRef, partitions: int = DEFAULT_PARTITIONS) -> str:
    """The usage stream a workload's samples are stored in."""
    return subjects.usage_stream(subjects.usage_partition(workload, partitions))


async def read_usage(access: NatsAccess) -> list[tuple[str, bytes]]:
    """Every usage sample currently stored, over every partition stream in force, as
    (subject, payload); each workload's in the order stored."""
    nc = await connect(access)
    try:
        streams = await usage_streams(nc.jetstream())
        return [
            one
            for stream in streams
            for m in await read_messages(nc, stream)
            for one in as_samples(m.subject, m.data)
        ]
    finally:
        await nc.close()


def counter(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return value or 0.0


async def put_allocations(url: str, *allocations: Allocation) -> None:
    """Write Allocation records into the allocation bucket, as the actuator does."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().create_key_value(bucket=subjects.ALLOCATION_BUCKET)
        for allocation in allocations:
            await kv.put(subjects.kv_key(allocation.workload), allocation.to_json())
    finally:
        await nc.close()
