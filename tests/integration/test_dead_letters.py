"""Bad input on every subject a service consumes: dead-lettered with a reason, counted,
and the service keeps running and still handles the next good message."""

from __future__ import annotations

import json

import nats
import pytest

from factories import decision, malformed_payloads, sample
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import DeadLetter
from fracpilot_libs.nats import subjects
from helpers import counter, read_stream, reset_nats, running, wait_for

pytestmark = pytest.mark.integration


async def dead_letters(url: str, service: str) -> list[DeadLetter]:
    msgs = await read_stream(url, subjects.DEADLETTER_STREAM, subjects.deadletter_subject(service))
    return [DeadLetter.model_validate_json(data) for _, data in msgs]


async def test_usage_subject_dead_letters_every_malformed_sample(nats_url: str) -> None:
    await reset_nats(nats_url)
    bad = malformed_payloads(sample(), "compute")
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        subject = subjects.usage_subject(sample().workload)
        for payload in bad.values():
            await js.publish(subject, payload)
        # Two minutes in a row: a sustained rise (one lone minute is a rare burst, which waits).
        for minute in (0, 1):
            good = sample(compute=0.9, memory_share=0.1, allocated=0.25, minute=minute)
            await js.publish(subject, good.to_json())
        await nc.close()
        await wait_for(lambda: service.samples._value.get() >= 2, timeout=15)
        letters = await dead_letters(nats_url, "decision")
        reg = service.runtime.registry
        total = sum(
            counter(
                reg, "fracpilot_dead_letters_total", subject_prefix=subjects.USAGE_PREFIX, kind=k
            )
            for k in ("decode", "validation")
        )
    assert len(letters) == len(bad)
    assert total == len(bad)
    assert {d.raw_payload for d in letters} >= {bad["bad_json"].decode()}
    by_payload = {d.raw_payload: d for d in letters}
    nan_letter = by_payload[bad["nan"].decode()]
    assert nan_letter.error_kind == "validation"
    assert "compute" in nan_letter.reason
    assert "finite" in nan_letter.reason
    assert "less than or equal to 1" in by_payload[bad["above_one"].decode()].reason
    assert "greater than or equal to 0" in by_payload[bad["negative"].decode()].reason
    assert "surprise" in by_payload[bad["unknown_field"].decode()].reason
    assert by_payload[bad["bad_json"].decode()].error_kind == "decode"
    # The good samples after the bad ones were decided: 0.9 compute on 0.25 is an upsize.
    decisions = await read_stream(nats_url, subjects.DECISION_STREAM)
    assert len(decisions) == 1


async def test_decision_subject_dead_letters_every_malformed_decision(nats_url: str) -> None:
    await reset_nats(nats_url)
    valid = decision(current=0.5, new=0.75)
    bad = malformed_payloads(valid, "new_fraction")
    bad["direction_contradicts"] = json.dumps(
        {**json.loads(valid.model_dump_json()), "direction": "down"}
    ).encode()
    service = ActuatorService(
        ActuatorSettings(
            nats={"url": nats_url},
            # opted in: the valid decision is applied after the bad ones
            sim={
                "pods": "inference/chat=0.5",
                "cluster": "test",
                "namespace_labels": {"inference": {"fracpilot.io/mode": "auto"}},
            },
        )
    )
    async with running(service):
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        subject = subjects.decision_subject(valid.workload)
        for payload in bad.values():
            await js.publish(subject, payload)
        await js.publish(subject, valid.to_json())
        await nc.close()
        reg = service.runtime.registry
        await wait_for(
            lambda: (
                counter(reg, "fracpilot_actuator_actions_total", plan="in_place", outcome="applied")
                == 1
            ),
            timeout=15,
        )
        letters = await dead_letters(nats_url, "actuator")
    assert len(letters) == len(bad)
    reasons = {d.raw_payload: d.reason for d in letters}
    assert "contradicts" in reasons[bad["direction_contradicts"].decode()]
    assert service.cluster is not None
    placement = service.cluster.state.placement(valid.workload)
    assert placement is not None
    assert placement.fraction == 0.75


async def test_allocation_bucket_dead_letters_a_corrupt_entry(nats_url: str) -> None:
    await reset_nats(nats_url)
    service = IngestService(
        IngestSettings(nats={"url": nats_url}, sim={"duration_s": 60, "workloads": 1, "speed": 60})
    )
    async with running(service):
        nc = await nats.connect(nats_url)
        kv = await nc.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        await kv.put("demo/inference/Deployment/x", b'{"fraction": "lots"}')
        await nc.close()
        reg = service.runtime.registry
        await wait_for(
            lambda: (
                counter(
                    reg,
                    "fracpilot_dead_letters_total",
                    subject_prefix="$KV.fracpilot_allocations",
                    kind="validation",
                )
                >= 1
            ),
            timeout=10,
        )
        letters = await dead_letters(nats_url, "ingest")
        await wait_for(service.finished.is_set, timeout=10)
    assert len(letters) == 1
    assert "fraction" in letters[0].reason
