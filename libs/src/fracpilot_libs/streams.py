"""The streams every deployment has, declared idempotently (created, or updated to the spec).

Decisions, results and dead letters are kept for audit; the usage streams, one per partition
and bounded in age, are :mod:`fracpilot_libs.usage_streams`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from fracpilot_libs import subjects


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float | None
    description: str


def default_streams() -> tuple[StreamSpec, ...]:
    """Decisions, results and dead letters, kept for audit. (The usage streams, one per
    partition and bounded in age, are :mod:`fracpilot_libs.usage_streams`.)"""
    return (
        StreamSpec(
            subjects.DECISION_STREAM,
            (f"{subjects.DECISION_PREFIX}.>",),
            None,
            "fraction decisions, replayable for audit",
        ),
        StreamSpec(
            subjects.ACTUATION_STREAM,
            (f"{subjects.ACTUATION_PREFIX}.>",),
            None,
            "actuation results, replayable for audit",
        ),
        StreamSpec(
            subjects.DEADLETTER_STREAM,
            (f"{subjects.DEADLETTER_PREFIX}.>",),
            None,
            "messages a service could not accept, with the reason",
        ),
    )


def stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=spec.max_age_s,
        duplicate_window=120.0,
    )


async def ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    """Create each stream, or update it to its spec."""
    for spec in specs:
        config = stream_config(spec)
        try:
            await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(config)
            continue
        await js.update_stream(config)
