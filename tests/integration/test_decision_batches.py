"""Usage batches on a real nats-server: a stream holding both wire formats (an upgrade: the
previous ingest's one-sample messages, then the new ingest's batches) is decided as one
history per workload, in stream order; a bad sample in a batch is dead-lettered alone with
its batch id; a restart between batches loses and repeats nothing."""

from __future__ import annotations

import dataclasses
import json

import nats
import pytest

from factories import sample
from fracpilot_decision.forecasts import keep_jump
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.contracts import DeadLetter, Policy, UsageBatchHeader, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_batch import (
    BATCH_ID_HEADER,
    BATCH_INDEX_HEADER,
    decode_batch,
    decode_sample,
    encode_samples,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState
from helpers import read_stream, reset_nats, running, wait_for

pytestmark = pytest.mark.integration
MSG_ID = "Nats-Msg-Id"


def instant(minute: int) -> list[UsageSample]:
    """One scrape instant: chat on two pods (one workload twice in a batch), and embed."""
    return [
        sample(
            name="chat",
            pod=f"chat-{pod}",
            gpu_uuid=f"GPU-{pod}",
            minute=minute,
            compute=round(0.01 * minute + 0.001 * pod + 0.1, 4),  # distinct: order shows
            sample_id=f"chat-{pod}-{minute}",
            allocated=1.0,
        )
        for pod in (0, 1)
    ] + [sample(name="embed", minute=minute, compute=0.2, sample_id=f"embed-{minute}")]


Payload = tuple[str, bytes, str]  # subject, data, Nats-Msg-Id


def as_messages(minute: int, batched: bool, partitions: int) -> list[Payload]:
    samples = instant(minute)
    if not batched:
        return [(subjects.usage_subject(s.workload), s.to_json(), s.sample_id) for s in samples]
    return [(b.subject, b.payload, b.batch_id) for b in encode_samples(samples, partitions)]


def expected_order(messages: list[Payload]) -> list[UsageSample]:
    """The samples in the order the decision sees them (per workload: stream order)."""
    out = []
    for subject, data, _ in messages:
        if subjects.is_usage_batch(subject):
            out.extend(decode_sample(line) for line in decode_batch(data).lines)
        else:
            out.append(UsageSample.model_validate_json(data))
    return out


def engine_histories(samples: list[UsageSample]) -> dict[str, WorkloadState]:
    """The states the engine makes of ``samples``, with what the service keeps beside them
    (the jump statistic: forecasts.py)."""
    states: dict[str, WorkloadState] = {}
    policy = Policy()
    for s in samples:
        key = subjects.kv_key(s.workload)
        before = states.get(key)
        new, _ = decide(before or WorkloadState(), s, policy)
        now = s.timestamp.timestamp()
        states[key] = keep_jump(before, new, s.memory_share, now, policy)
    return states


def comparable(state: WorkloadState) -> WorkloadState:
    return dataclasses.replace(state, position=0)  # stream positions: the service's own


async def publish(url: str, messages: list[Payload]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for subject, data, msg_id in messages:
        await js.publish(subject, data, headers={MSG_ID: msg_id})
    await nc.close()


async def test_old_and_new_formats_in_one_stream_are_decided_as_one_history(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    settings = DecisionSettings(nats={"url": nats_url})
    n = settings.decision_partitions
    # An upgrade, and a roll back and forth: one-sample, batches, one-sample, batches.
    messages = [m for minute in range(8) for m in as_messages(minute, (minute // 2) % 2 == 1, n)]
    # A batch published twice (ingest's retry after a lost ack) is stored once.
    messages.append(messages[-1])
    service = DecisionService(settings)
    async with running(service):
        await publish(nats_url, messages)
        total = 8 * 3
        await wait_for(lambda: service.samples._value.get() >= total)
        expected = engine_histories(expected_order(messages[:-1]))
        assert set(service.histories) == set(expected)
        for key, state in expected.items():
            assert comparable(service.histories[key]) == comparable(state), key
        assert service.histories[subjects.kv_key(instant(0)[0].workload)].samples == 16
    assert service.samples._value.get() == total


async def test_a_bad_sample_in_a_batch_is_dead_lettered_alone_with_its_batch_id(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    settings = DecisionSettings(nats={"url": nats_url})
    good = [sample(name="chat", pod=f"chat-{i}", sample_id=f"s-{i}") for i in range(3)]
    (batch,) = encode_samples(good, 1)  # one partition: all in one batch
    head, *lines = batch.text.split(b"\n")
    bad = json.dumps({**json.loads(lines[1]), "compute": 7.5}).encode()  # out of range
    lines.insert(1, bad)
    header = UsageBatchHeader.model_validate_json(head)
    partition = subjects.usage_partition(good[0].workload, settings.decision_partitions)
    header = header.model_copy(
        update={"samples": 4, "partition": partition, "partitions": settings.decision_partitions}
    )
    payload = b"\n".join([header.to_json(), *lines])
    service = DecisionService(settings)
    async with running(service):
        await publish(
            nats_url, [(subjects.usage_batch_subject(partition), payload, header.batch_id)]
        )
        await wait_for(lambda: service.samples._value.get() >= 3)
        dead: list[DeadLetter] = []
        for _ in range(50):  # published before the batch is acknowledged: there already
            stored = await read_stream(nats_url, subjects.DEADLETTER_STREAM)
            if dead := [DeadLetter.model_validate_json(data) for _, data in stored]:
                break
    assert service.samples._value.get() == 3  # its neighbours, before and after it
    (record,) = dead
    assert record.raw_payload == bad.decode()
    assert record.error_kind == "validation"
    assert record.headers[BATCH_ID_HEADER] == header.batch_id
    assert record.headers[MSG_ID] == header.batch_id
    assert record.headers[BATCH_INDEX_HEADER] == "1"


async def test_a_restart_between_batches_loses_and_repeats_no_sample(nats_url: str) -> None:
    await reset_nats(nats_url)
    settings = DecisionSettings(
        nats={"url": nats_url}, checkpoint={"interval_s": 3600, "when_idle_s": 0}
    )
    n = settings.decision_partitions
    first_half = [m for minute in range(4) for m in as_messages(minute, minute % 2 == 0, n)]
    second_half = [m for minute in range(4, 8) for m in as_messages(minute, minute % 2 == 0, n)]
    first = DecisionService(settings)
    async with running(first):
        await publish(nats_url, first_half)
        await wait_for(lambda: first.samples._value.get() >= 12)
    await publish(nats_url, second_half)  # stored while no replica runs
    second = DecisionService(settings)
    async with running(second):
        await wait_for(lambda: second.samples._value.get() >= 12)
        expected = engine_histories(expected_order(first_half + second_half))
        for key, state in expected.items():
            assert comparable(second.histories[key]) == comparable(state), key
    assert second.samples._value.get() == 12  # none of the first half again
