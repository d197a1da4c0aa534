"""The bus adapter against a real nats-server: declarations, de-duplication, retries,
dead letters, and the telemetry endpoints of a running service."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping

import nats
import pytest
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from factories import sample
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import DeadLetter, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.consumer import PermanentError
from fracpilot_libs.nats.usage_streams import usage_partition_count
from helpers import counter, read_stream, read_usage, reset_nats, running, usage_stream_of, wait_for

pytestmark = pytest.mark.integration


async def connected_bus(url: str, **settings: object) -> Bus:
    bus = Bus("test", ServiceSettings(nats={"url": url}, **settings), CollectorRegistry())
    await bus.connect(retry_for_s=5)
    await bus.ensure_streams()
    return bus


async def test_declarations_are_idempotent_and_publishes_deduplicate(nats_url: str) -> None:
    await reset_nats(nats_url)
    bus = await connected_bus(nats_url)
    await bus.ensure_streams()  # a second service starting must not fail or reset anything
    kv1 = await bus.kv(subjects.POLICY_BUCKET)
    kv2 = await bus.kv(subjects.POLICY_BUCKET)
    assert kv1.name == kv2.name == subjects.POLICY_BUCKET
    s = sample()
    subject = subjects.usage_subject(s.workload)
    assert await bus.publish(subject, s, s.sample_id) is True
    assert await bus.publish(subject, s, s.sample_id) is False  # same Nats-Msg-Id
    assert await bus.publish(subject, sample(minute=1), sample(minute=1).sample_id) is True
    await bus.close()
    assert len(await read_usage(nats_url)) == 2


async def test_only_the_partition_owner_changes_the_usage_partition_count(nats_url: str) -> None:
    """The first service makes the usage streams with its count; another service with another
    count leaves them as they are (only the decision service, ``assign_partitions``, moves
    the slots), and a sample is stored in the stream its slot belongs to."""
    await reset_nats(nats_url)
    first = await connected_bus(nats_url, decision_partitions=4)
    other = await connected_bus(nats_url, decision_partitions=8)
    try:
        assert await usage_partition_count(first.js) == 4
        await other.ensure_streams(assign_partitions=False)
        assert await usage_partition_count(first.js) == 4
        s = sample()
        await other.publish(subjects.usage_subject(s.workload), s, s.sample_id)
        stream = usage_stream_of(s.workload, 4)
        assert [subject for subject, _ in await read_stream(nats_url, stream)] == [
            subjects.usage_subject(s.workload)
        ]
        await other.ensure_streams(assign_partitions=True)
        assert await usage_partition_count(first.js) == 8
        for p in range(8):
            info = await first.js.stream_info(subjects.usage_stream(p))
            assert tuple(info.config.subjects or ()) == subjects.usage_stream_subjects(p, 8)
    finally:
        await first.close()
        await other.close()


async def test_a_failing_handler_is_retried_then_dead_lettered(nats_url: str) -> None:
    await reset_nats(nats_url)
    bus = await connected_bus(nats_url, max_deliver=3)
    attempts: dict[str, int] = {}

    async def handler(s: UsageSample, _msg: Msg) -> None:
        attempts[s.sample_id] = attempts.get(s.sample_id, 0) + 1
        if s.compute == 0.5 and attempts[s.sample_id] < 2:
            raise RuntimeError("transient")  # succeeds on the second delivery
        if s.compute == 0.6:
            raise RuntimeError("always broken")
        if s.compute == 0.7:
            raise PermanentError("cannot ever work")

    await bus.consume(
        stream=usage_stream_of(sample().workload),
        durable="t",
        model=UsageSample,
        filter_subject=f"{subjects.USAGE_PREFIX}.>",
        handler=handler,
        retry_delay_s=0.05,
    )
    flaky, broken, hopeless = (
        sample(compute=0.5, minute=1),
        sample(compute=0.6, minute=2),
        sample(compute=0.7, minute=3),
    )
    for s in (flaky, broken, hopeless):
        await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
    await wait_for(
        lambda: (
            counter(
                bus.registry,
                "fracpilot_dead_letters_total",
                subject_prefix=subjects.USAGE_PREFIX,
                kind="max_deliveries",
            )
            == 1
        ),
        timeout=15,
    )
    await bus.close()
    assert attempts[flaky.sample_id] == 2
    assert attempts[broken.sample_id] == 3
    assert attempts[hopeless.sample_id] == 1
    letters = [
        DeadLetter.model_validate_json(d)
        for _, d in await read_stream(nats_url, subjects.DEADLETTER_STREAM)
    ]
    assert sorted(letter.error_kind for letter in letters) == ["max_deliveries", "processing"]
    assert any("always broken" in letter.reason for letter in letters)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_service_serves_metrics_health_and_readiness(nats_url: str) -> None:
    await reset_nats(nats_url)
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        base = f"http://127.0.0.1:{service.runtime.http.port}"
        status, body = await asyncio.to_thread(http_get, f"{base}/readyz")
        assert (status, body.strip()) == (200, "ok")
        status, body = await asyncio.to_thread(http_get, f"{base}/metrics")
        assert status == 200
        assert "fracpilot_decision_samples_total" in body
        assert 'fracpilot_service_ready{component="decision"} 1.0' in body
        assert 'fracpilot_build_info{version="' in body  # which build runs
        assert "process_resident_memory_bytes" in body  # the default collectors
        assert "python_gc_objects_collected_total" in body
        assert (await asyncio.to_thread(http_get, f"{base}/healthz"))[0] == 200
        assert (await asyncio.to_thread(http_get, f"{base}/nope"))[0] == 404
        service.runtime.health.set_ready(False, "draining")
        status, body = await asyncio.to_thread(http_get, f"{base}/readyz")
        assert (status, body.strip()) == (503, "draining")


async def test_serve_answers_in_a_queue_group_and_survives_a_failing_handler(
    nats_url: str,
) -> None:
    await reset_nats(nats_url)
    bus = await connected_bus(nats_url)

    async def handler(data: bytes, _headers: Mapping[str, str]) -> bytes:
        if data == b"boom":
            raise RuntimeError("handler broke")
        return b"echo:" + data

    await bus.serve("test.echo", "test-queue", handler)
    nc = await nats.connect(nats_url)
    assert (await nc.request("test.echo", b"one", timeout=5)).data == b"echo:one"
    failed = json.loads((await nc.request("test.echo", b"boom", timeout=5)).data)
    assert failed["ok"] is False
    assert "handler broke" in failed["error"]
    assert (await nc.request("test.echo", b"two", timeout=5)).data == b"echo:two"
    await bus.stop_consuming()  # no longer served: the requester hears it at once
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request("test.echo", b"three", timeout=5)
    await nc.close()
    await bus.close()
    assert (
        counter(
            bus.registry, "fracpilot_bus_requests_total", subject="test.echo", outcome="replied"
        )
        == 2
    )
    assert (
        counter(bus.registry, "fracpilot_bus_requests_total", subject="test.echo", outcome="failed")
        == 1
    )
