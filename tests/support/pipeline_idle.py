"""Waiting for the three services to have handled everything on the bus: every usage
partition's consumer has acknowledged every sample (decision) and the actuator's consumer has
acknowledged every decision."""

from __future__ import annotations

import asyncio
import time

from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.decision_backlog import decision_backlog
from helpers import NatsAccess, connect


async def pipeline_idle(access: NatsAccess) -> bool:
    nc = await connect(access)
    js = nc.jetstream()
    try:
        backlog = await decision_backlog(js)
        info = await js.consumer_info(subjects.DECISION_STREAM, subjects.ACTUATOR_CONSUMER)
        last = (await js.stream_info(subjects.DECISION_STREAM)).state.last_seq
    finally:
        await nc.close()
    if backlog is None or not backlog.caught_up:
        return False
    idle: bool = info.num_pending == 0 and info.num_ack_pending == 0
    return idle and info.ack_floor.stream_seq == last


async def wait_pipeline_idle(access: NatsAccess, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not await pipeline_idle(access):
        if time.monotonic() > deadline:
            raise TimeoutError("decision or actuator did not catch up on the bus")
        await asyncio.sleep(0.2)
