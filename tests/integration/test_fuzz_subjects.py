"""Generated junk on every subject the services consume, over a real nats-server.

For each subject (usage samples -> decision, decisions -> actuator, the policy set and get
requests -> decision, values in the allocations bucket -> ingest and in the policies bucket ->
decision, engine checkpoints -> decision on start) the test publishes the profile's number of
payloads that the subject's model refuses (see tests/support/fuzzing.py for the kinds), then a
good message, and checks:

- every junk message has exactly one DeadLetter with a non-empty reason (N published == N
  dead letters for that subject), and the dead-letter counter says the same;
- nothing is left unacknowledged, the good message after the junk is handled, and the service
  is still ready.

``make test`` runs the default profile, ``make fuzz`` (FRACPILOT_FUZZ_LONG=1) at least 10,000
per subject. Each test prints its numbers (pytest -s).
"""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from prometheus_client import CollectorRegistry

from factories import decision, sample
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.contracts import (
    Allocation,
    DeadLetter,
    FractionDecision,
    Policy,
    PolicyLevel,
    PolicyReply,
    PolicyScope,
    UsageSample,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import DecodeError
from fracpilot_libs.sizing.policies import parse_scope, scope_problem
from helpers import read_stream, reset_nats, running, usage_stream_of, wait_for
from support.fuzzing import draw, examples_per_subject, junk_payloads, rejected_junk

pytestmark = pytest.mark.integration

POLICY = Policy(
    scope=PolicyScope(level=PolicyLevel.WORKLOAD, namespace="inference", workload="chat"),
    max_fraction=0.75,
)


@pytest.fixture(scope="module")
def n() -> int:
    return examples_per_subject()


def settle_s(count: int) -> float:
    return 30.0 + count / 50.0  # generous: dead letters are JetStream publishes one by one


async def dead_letters(url: str, service: str, prefix: str) -> list[DeadLetter]:
    stored = await read_stream(
        url, subjects.DEADLETTER_STREAM, subjects.deadletter_subject(service)
    )
    letters = [DeadLetter.model_validate_json(data) for _, data in stored]
    return [d for d in letters if d.subject.startswith(prefix)]


def dead_letter_count(registry: CollectorRegistry, prefix: str) -> float:
    return sum(
        s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "fracpilot_dead_letters_total" and s.labels["subject_prefix"] == prefix
    )


async def publish_all(url: str, subject: str, payloads: list[bytes]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for payload in payloads:
        await js.publish(subject, payload, timeout=10)
    await nc.close()


async def pending(url: str, stream: str) -> tuple[int, int]:
    """(not yet delivered, delivered but not acknowledged), over the stream's consumers."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    waiting = unacked = 0
    for info in await js.consumers_info(stream):
        waiting += info.num_pending or 0
        unacked += info.num_ack_pending or 0
    await nc.close()
    return waiting, unacked


def report(subject: str, published: int, letters: list[DeadLetter], started: float) -> None:
    kinds: dict[str, int] = {}
    for d in letters:
        kinds[d.error_kind] = kinds.get(d.error_kind, 0) + 1
    print(  # the numbers for the record (pytest -s)
        f"\nFUZZ {subject}: published {published}, dead letters {len(letters)} {kinds}, "
        f"{time.monotonic() - started:.1f} s"
    )


def assert_every_letter_says_why(letters: list[DeadLetter], published: list[bytes]) -> None:
    assert all(d.reason.strip() for d in letters)
    assert all(d.error_kind in ("decode", "validation") for d in letters)
    assert len({d.raw_payload for d in letters}) == len({p for p in published})


# --- streams ---------------------------------------------------------------------------------


async def test_junk_usage_samples_are_each_dead_lettered(nats_url: str, n: int) -> None:
    await reset_nats(nats_url)
    junk = draw(rejected_junk(UsageSample, sample()), n)
    started = time.monotonic()
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        subject = subjects.usage_subject(sample().workload)
        await publish_all(nats_url, subject, junk)
        await publish_all(nats_url, subject, [sample(compute=0.9, allocated=0.25).to_json()])
        reg = service.runtime.registry
        await wait_for(
            lambda: dead_letter_count(reg, subjects.USAGE_PREFIX) >= len(junk), settle_s(n)
        )
        await wait_for(lambda: service.samples._value.get() >= 1, timeout=30)
        assert service.runtime.health.ready
        assert dead_letter_count(reg, subjects.USAGE_PREFIX) == len(junk)
        letters = await dead_letters(nats_url, "decision", subjects.USAGE_PREFIX)
    report("usage -> decision", len(junk), letters, started)
    assert len(letters) == len(junk)
    assert_every_letter_says_why(letters, junk)
    assert await pending(nats_url, usage_stream_of(sample().workload)) == (0, 0)


async def test_junk_decisions_are_each_dead_lettered(nats_url: str, n: int) -> None:
    await reset_nats(nats_url)
    valid = decision(current=0.5, new=0.75)
    junk = draw(rejected_junk(FractionDecision, valid), n)
    started = time.monotonic()
    service = ActuatorService(
        ActuatorSettings(
            nats={"url": nats_url},
            # opted in: the valid decision is applied after the junk
            sim={
                "pods": "inference/chat=0.5",
                "cluster": "test",
                "namespace_labels": {"inference": {"fracpilot.io/mode": "auto"}},
            },
        )
    )
    async with running(service):
        subject = subjects.decision_subject(valid.workload)
        await publish_all(nats_url, subject, [*junk, valid.to_json()])
        reg = service.runtime.registry
        await wait_for(
            lambda: dead_letter_count(reg, subjects.DECISION_PREFIX) >= len(junk), settle_s(n)
        )
        assert service.cluster is not None
        await wait_for(
            lambda: (
                (p := service.cluster.state.placement(valid.workload)) is not None  # type: ignore[union-attr]
                and p.fraction == 0.75
            ),
            timeout=30,
        )
        assert service.runtime.health.ready
        assert dead_letter_count(reg, subjects.DECISION_PREFIX) == len(junk)
        letters = await dead_letters(nats_url, "actuator", subjects.DECISION_PREFIX)
    report("decisions -> actuator", len(junk), letters, started)
    assert len(letters) == len(junk)
    assert_every_letter_says_why(letters, junk)
    assert await pending(nats_url, subjects.DECISION_STREAM) == (0, 0)


# --- the policy endpoint ---------------------------------------------------------------------


def _get_refused(data: bytes) -> bool:
    try:
        return scope_problem(parse_scope(data)) is not None
    except DecodeError:
        return True


async def test_junk_policy_requests_are_refused_and_dead_lettered(nats_url: str, n: int) -> None:
    await reset_nats(nats_url)
    sets = draw(rejected_junk(Policy, POLICY), n)
    gets = draw(junk_payloads(POLICY.scope).filter(_get_refused), n)
    started = time.monotonic()
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        nc = await nats.connect(nats_url)
        for subject, payloads in ((subjects.POLICY_SET, sets), (subjects.POLICY_GET, gets)):
            for payload in payloads:
                reply = PolicyReply.model_validate_json(
                    (await nc.request(subject, payload, timeout=10)).data
                )
                assert not reply.ok
                assert reply.error
        for payload in sets[:50]:  # list takes any payload and answers
            reply = PolicyReply.model_validate_json(
                (await nc.request(subjects.POLICY_LIST, payload, timeout=10)).data
            )
            assert reply.ok
        stored = PolicyReply.model_validate_json(
            (await nc.request(subjects.POLICY_SET, POLICY.to_json(), timeout=10)).data
        )
        await nc.close()
        assert stored.ok  # the endpoint still works after the junk
        reg = service.runtime.registry
        policy_prefix = "fracpilot.policy.v1"  # the counter's label: set and get together
        await wait_for(
            lambda: dead_letter_count(reg, policy_prefix) >= len(sets) + len(gets), settle_s(n)
        )
        assert dead_letter_count(reg, policy_prefix) == len(sets) + len(gets)
        assert service.runtime.health.ready
    set_letters = await dead_letters(nats_url, "decision", subjects.POLICY_SET)
    get_letters = await dead_letters(nats_url, "decision", subjects.POLICY_GET)
    report("policy set", len(sets), set_letters, started)
    report("policy get", len(gets), get_letters, started)
    assert len(set_letters) == len(sets)
    assert len(get_letters) == len(gets)
    assert await dead_letters(nats_url, "decision", subjects.POLICY_LIST) == []
    assert all(d.reason.startswith("invalid policy") for d in set_letters + get_letters)


async def test_a_policy_with_thousands_of_errors_is_refused_in_one_reply(nats_url: str) -> None:
    """The fuzzer's rare draw made deterministic: 50,000 bad items gave a 2.5 MB reason, whose
    reply nats-py refused to send (over max_payload), so the requester timed out."""
    await reset_nats(nats_url)
    body = json.loads(POLICY.to_json())
    body["grid_levels"] = [0] * 50_000  # each item below the bound: one error each
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        nc = await nats.connect(nats_url)
        try:
            answer = await nc.request(subjects.POLICY_SET, json.dumps(body).encode(), timeout=10)
        finally:
            await nc.close()
    reply = PolicyReply.model_validate_json(answer.data)
    assert not reply.ok
    assert reply.error is not None
    assert "grid_levels.0: Input should be greater than 0" in reply.error
    assert "and 49980 more" in reply.error


# --- KV values -------------------------------------------------------------------------------


async def _put_all(url: str, bucket: str, payloads: list[bytes], key: str = "fuzz.{i}") -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        kv = await js.key_value(bucket)
    except Exception:
        from nats.js.api import KeyValueConfig

        kv = await js.create_key_value(KeyValueConfig(bucket=bucket))
    for i, payload in enumerate(payloads):
        await kv.put(key.format(i=i), payload)
    await nc.close()


@pytest.fixture
def ingest_settings(nats_url: str) -> IngestSettings:
    return IngestSettings(
        nats={"url": nats_url}, sim={"duration_s": 60, "workloads": 1, "speed": 60, "step_s": 60}
    )


async def test_junk_allocations_are_each_dead_lettered_by_ingest(
    nats_url: str, n: int, ingest_settings: IngestSettings
) -> None:
    await reset_nats(nats_url)
    valid = Allocation(
        workload=sample().workload,
        pod="chat-0",
        node="node-a",
        gpu_uuid="GPU-a-0",
        fraction=0.5,
        device_memory_bytes=80 * 1024**3,
        updated_at=sample().timestamp,
    )
    junk = draw(rejected_junk(Allocation, valid).filter(bool), n)  # empty would be a delete
    started = time.monotonic()
    service = IngestService(ingest_settings)
    async with running(service):
        await _put_all(nats_url, subjects.ALLOCATION_BUCKET, junk)
        prefix = f"$KV.{subjects.ALLOCATION_BUCKET}"
        reg = service.runtime.registry
        await wait_for(lambda: dead_letter_count(reg, prefix) >= len(junk), settle_s(n))
        assert service.runtime.health.ready
        assert dead_letter_count(reg, prefix) == len(junk)
    letters = await dead_letters(nats_url, "ingest", prefix)
    report("KV allocations -> ingest", len(junk), letters, started)
    assert len(letters) == len(junk)
    assert all(d.reason.strip() for d in letters)


async def test_junk_stored_policies_are_each_dead_lettered_by_decision(
    nats_url: str, n: int
) -> None:
    await reset_nats(nats_url)
    junk = draw(rejected_junk(Policy, POLICY).filter(bool), n)
    started = time.monotonic()
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        await _put_all(nats_url, subjects.POLICY_BUCKET, junk)
        prefix = f"$KV.{subjects.POLICY_BUCKET}"
        reg = service.runtime.registry
        await wait_for(lambda: dead_letter_count(reg, prefix) >= len(junk), settle_s(n))
        nc = await nats.connect(nats_url)
        listed = PolicyReply.model_validate_json(
            (await nc.request(subjects.POLICY_LIST, b"", timeout=30)).data
        )
        await nc.close()
        assert listed.ok  # the unreadable entries are left out
        assert listed.policies == []
        assert service.runtime.health.ready
    letters = await dead_letters(nats_url, "decision", prefix)
    report("KV policies -> decision", len(junk), letters, started)
    assert len(letters) == len(junk)
    assert all(d.reason.strip() for d in letters)


async def test_junk_checkpoints_are_counted_and_skipped_on_start(nats_url: str, n: int) -> None:
    await reset_nats(nats_url)
    junk = draw(junk_payloads(sample()).filter(bool), n)
    started = time.monotonic()
    await _put_all(
        nats_url, subjects.DECISION_STATE_BUCKET, junk, key="fuzz/inference/Deployment/w{i}"
    )
    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        reg = service.runtime.registry
        corrupt = reg.get_sample_value("fracpilot_decision_checkpoints_corrupt_total") or 0.0
        await publish_all(
            nats_url,
            subjects.usage_subject(sample().workload),
            [sample(compute=0.9, allocated=0.25).to_json()],
        )
        await wait_for(lambda: service.samples._value.get() >= 1, timeout=30)
        assert service.runtime.health.ready
    print(
        f"\nFUZZ KV checkpoints -> decision: written {len(junk)}, counted corrupt "
        f"{corrupt:.0f}, {time.monotonic() - started:.1f} s"
    )
    assert corrupt == len(junk)


async def test_a_scrape_target_serving_junk_never_stops_ingest(nats_url: str) -> None:
    """A broken exporter (garbage, partial, huge bodies) is a failed scrape, counted."""
    from support.junk_http import JunkHttpServer

    await reset_nats(nats_url)
    bodies = draw(junk_payloads(sample()), 40)
    with JunkHttpServer(bodies) as server:
        service = IngestService(
            IngestSettings(
                nats={"url": nats_url}, sources="scrape", scrape_targets=server.url, interval_s=0.05
            )
        )
        async with running(service):
            await wait_for(lambda: server.served >= len(bodies), timeout=60)
            await asyncio.sleep(0.2)
            errors = service.runtime.registry.get_sample_value(
                "fracpilot_ingest_source_errors_total", {"source": "scrape"}
            )
            assert service.runtime.health.ready
            assert service.cycles >= len(bodies)
    print(f"\nFUZZ scrape bodies -> ingest: served {server.served}, failed scrapes {errors}")
    assert errors is not None
    assert errors >= 1
