"""Application signals reach the engine in the decision service: a growing vLLM queue on
samples published to a real nats-server upsizes the workload though its utilization is low."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest

from factories import sample
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.contracts import AppSignals, FractionDecision, ReasonCode
from fracpilot_libs.nats import subjects
from helpers import read_stream, reset_nats, running, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def service(nats_url: str) -> AsyncIterator[DecisionService]:
    await reset_nats(nats_url)
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as svc:
        yield svc


async def test_a_growing_queue_upsizes_through_the_service(
    nats_url: str, service: DecisionService
) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    waiting = [0, 0, 1, 3, 6, 10]
    for minute, n in enumerate(waiting):
        s = sample(
            compute=0.05,
            memory_share=0.1,
            allocated=0.3,
            minute=minute,
            signals=AppSignals(waiting_requests=n, kv_cache_usage=0.4),
        )
        await js.publish(subjects.usage_subject(s.workload), s.to_json())
    await wait_for(lambda: service.samples._value.get() >= len(waiting))
    await nc.close()
    found = [
        FractionDecision.model_validate_json(data)
        for _, data in await read_stream(nats_url, subjects.DECISION_STREAM)
    ]
    # Utilization 0.05 on a 0.3 fraction alone would never upsize; waiting requests count as
    # compute above the fraction (and a growing queue steps it up), so the first decision is up.
    assert found, "no decision"
    assert found[0].reason in (ReasonCode.QUEUE_GROWING, ReasonCode.COMPUTE_HIGH)
    assert found[0].current_fraction == 0.3
    assert found[0].new_fraction > 0.3
