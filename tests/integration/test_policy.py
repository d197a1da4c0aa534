"""Policies as messages: the decision service's policy store over a real nats-server.

Set, get (with fallback from workload to namespace to cluster), list, refusals that keep the
stored policy and leave a dead letter, and a live change that alters the next decision.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from factories import sample, workload
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.contracts import (
    DeadLetter,
    Direction,
    FractionDecision,
    MemoryIsolation,
    Policy,
    PolicyLevel,
    PolicyReply,
    PolicyScope,
    ReasonCode,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.isolation_policies import ENFORCED_HEADROOM, MODE_RESIZE_BUDGET
from helpers import counter, read_stream, reset_nats, running, wait_for

pytestmark = pytest.mark.integration

CLUSTER = PolicyScope()
INFERENCE = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference")
CHAT = PolicyScope(level=PolicyLevel.WORKLOAD, namespace="inference", workload="chat")


@pytest.fixture
async def service(nats_url: str) -> AsyncIterator[DecisionService]:
    await reset_nats(nats_url)
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as svc:
        yield svc


async def request(url: str, subject: str, payload: bytes) -> PolicyReply:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(subject, payload, timeout=5)
    finally:
        await nc.close()
    return PolicyReply.model_validate_json(msg.data)


async def set_policy(url: str, policy: Policy) -> Policy:
    reply = await request(url, subjects.POLICY_SET, policy.to_json())
    assert reply.ok, reply.error
    assert reply.policy is not None
    return reply.policy


async def get_policy(url: str, payload: bytes) -> Policy:
    reply = await request(url, subjects.POLICY_GET, payload)
    assert reply.ok, reply.error
    assert reply.policy is not None
    return reply.policy


def policy_json_with(**changes: Any) -> bytes:
    """A cluster policy's JSON with fields changed or added, bypassing validation."""
    body = json.loads(Policy().model_dump_json())
    body.update(changes)
    return json.dumps(body).encode()


async def decisions(url: str) -> list[FractionDecision]:
    msgs = await read_stream(url, subjects.DECISION_STREAM)
    return [FractionDecision.model_validate_json(data) for _, data in msgs]


async def test_set_then_get_increments_the_revision(
    nats_url: str, service: DecisionService
) -> None:
    first = await set_policy(nats_url, Policy(max_fraction=0.75, revision=7))
    assert first.revision == 1  # set by the store; the request's revision is ignored
    assert first.max_fraction == 0.75
    second = await set_policy(nats_url, Policy(max_fraction=0.5))
    assert second.revision == 2

    assert await get_policy(nats_url, b"") == second  # empty payload: the cluster scope
    assert await get_policy(nats_url, CLUSTER.to_json()) == second
    nc = await nats.connect(nats_url)
    entry = await (await nc.jetstream().key_value(subjects.POLICY_BUCKET)).get("cluster")
    await nc.close()
    assert entry.value is not None
    assert Policy.model_validate_json(entry.value) == second


async def test_get_falls_back_from_workload_to_namespace_to_cluster(
    nats_url: str, service: DecisionService
) -> None:
    # Nothing stored: the built-in defaults, at the cluster scope.
    assert await get_policy(nats_url, CHAT.to_json()) == Policy()

    cluster = await set_policy(nats_url, Policy(max_fraction=0.87))
    namespace = await set_policy(
        nats_url, Policy(scope=INFERENCE, max_fraction=0.5, target_utilization=0.6)
    )
    assert await get_policy(nats_url, CHAT.to_json()) == namespace
    # A WorkloadRef names the same workload scope.
    assert await get_policy(nats_url, workload("chat", "inference").to_json()) == namespace
    other = PolicyScope(level=PolicyLevel.WORKLOAD, namespace="batch", workload="etl")
    assert await get_policy(nats_url, other.to_json()) == cluster
    batch = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="batch")
    assert await get_policy(nats_url, batch.to_json()) == cluster

    own = await set_policy(nats_url, Policy(scope=CHAT, max_fraction=0.25))
    effective = await get_policy(nats_url, CHAT.to_json())
    assert effective == own
    # The most specific policy wins as a whole: nothing is merged from the namespace's.
    assert effective.target_utilization == Policy().target_utilization
    assert await get_policy(nats_url, INFERENCE.to_json()) == namespace


async def test_list_returns_every_stored_policy(nats_url: str, service: DecisionService) -> None:
    empty = await request(nats_url, subjects.POLICY_LIST, b"")
    assert empty.ok
    assert empty.policies == []
    stored = [
        await set_policy(nats_url, Policy(scope=CHAT, max_fraction=0.25)),
        await set_policy(nats_url, Policy(max_fraction=0.87)),
        await set_policy(nats_url, Policy(scope=INFERENCE, max_fraction=0.5)),
    ]
    listed = await request(nats_url, subjects.POLICY_LIST, b"")
    assert listed.ok
    assert [p.scope.key for p in listed.policies] == [
        "cluster",
        "namespace.inference",
        "workload.inference.chat",
    ]
    assert sorted(listed.policies, key=lambda p: p.max_fraction) == sorted(
        stored, key=lambda p: p.max_fraction
    )


INVALID_POLICIES = {
    "min_above_max": (
        policy_json_with(min_fraction=0.75, max_fraction=0.5),
        "validation",
        "min_fraction 0.75 is above max_fraction 0.5",
    ),
    "off_the_grid": (
        policy_json_with(min_fraction=0.125),
        "validation",
        "min_fraction 0.125 is not on the grid of 1/100",
    ),
    "unknown_field": (policy_json_with(surprise=True), "validation", "surprise"),
    "out_of_range": (
        policy_json_with(target_utilization=1.5),
        "validation",
        "target_utilization: Input should be less than or equal to 1",
    ),
    "scope_not_a_key": (
        policy_json_with(scope={"level": "namespace", "namespace": "in ference"}),
        "validation",
        "may contain only",
    ),
    "bad_json": (b'{"max_fraction": 0.5', "decode", "not valid JSON"),
}


@pytest.mark.parametrize("case", INVALID_POLICIES, ids=list(INVALID_POLICIES))
async def test_an_invalid_policy_is_refused_kept_and_dead_lettered(
    nats_url: str, service: DecisionService, case: str
) -> None:
    payload, kind, reason = INVALID_POLICIES[case]
    kept = await set_policy(nats_url, Policy(max_fraction=0.75))

    reply = await request(nats_url, subjects.POLICY_SET, payload)

    assert not reply.ok
    assert reply.policy is None
    assert reply.error is not None
    assert reason in reply.error
    assert await get_policy(nats_url, b"") == kept
    assert service.policies.for_workload(workload()) == kept
    msgs = await read_stream(
        nats_url, subjects.DEADLETTER_STREAM, subjects.deadletter_subject("decision")
    )
    letters = [DeadLetter.model_validate_json(data) for _, data in msgs]
    assert len(letters) == 1
    assert letters[0].subject == subjects.POLICY_SET
    assert letters[0].error_kind == kind
    assert letters[0].reason == reply.error
    assert letters[0].raw_payload == payload.decode()
    reg = service.runtime.registry
    assert (
        counter(
            reg, "fracpilot_dead_letters_total", subject_prefix="fracpilot.policy.v1", kind=kind
        )
        == 1
    )


async def test_an_invalid_scope_is_refused_and_dead_lettered(
    nats_url: str, service: DecisionService
) -> None:
    reply = await request(
        nats_url, subjects.POLICY_GET, b'{"level": "workload", "namespace": "inference"}'
    )
    assert not reply.ok
    assert reply.error is not None
    assert "scope level workload needs namespace=yes, workload=yes" in reply.error
    letters = await read_stream(nats_url, subjects.DEADLETTER_STREAM)
    assert [DeadLetter.model_validate_json(d).subject for _, d in letters] == [subjects.POLICY_GET]


async def test_a_live_policy_change_alters_the_next_decision(
    nats_url: str, service: DecisionService
) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    chat = sample(compute=0.1, memory_share=0.1, allocated=1.0, minute=0)
    subject = subjects.usage_subject(chat.workload)
    await js.publish(subject, chat.to_json())
    await wait_for(lambda: service.samples._value.get() >= 1)
    assert await decisions(nats_url) == []  # too little history to downsize a whole GPU

    # Set through the store: the replica that stored it decides with it at once.
    namespace = await set_policy(nats_url, Policy(scope=INFERENCE, max_fraction=0.5))
    await js.publish(
        subject, sample(compute=0.1, memory_share=0.1, allocated=1.0, minute=1).to_json()
    )
    await wait_for(lambda: service.samples._value.get() >= 2)
    [first] = await decisions(nats_url)
    assert first.reason is ReasonCode.POLICY_BOUNDS
    assert first.direction is Direction.DOWN
    assert first.current_fraction == 1.0
    assert first.new_fraction <= 0.5
    assert first.policy_revision == namespace.revision == 1
    # What the engine predicts goes with it (the actuator's card planner reads it).
    assert first.forecast is not None
    assert abs(first.forecast.memory_peak - 0.1) < 1e-6
    assert first.forecast.memory_jump >= 0.1  # young: at least the population prior
    assert first.isolation is MemoryIsolation.AUTO

    # Written straight into the bucket: followed by the watch.
    narrower = Policy(scope=CHAT, max_fraction=0.12, revision=1, isolation=MemoryIsolation.SHARED)
    kv = await js.key_value(subjects.POLICY_BUCKET)
    await kv.put(CHAT.key, narrower.to_json())
    await wait_for(lambda: service.policies.for_workload(chat.workload) == narrower)
    await js.publish(
        subject, sample(compute=0.1, memory_share=0.1, allocated=1.0, minute=2).to_json()
    )
    await wait_for(lambda: service.samples._value.get() >= 3)
    await nc.close()
    second = (await decisions(nats_url))[-1]
    assert second.reason is ReasonCode.POLICY_BOUNDS
    assert second.new_fraction == 0.12
    assert second.isolation is MemoryIsolation.SHARED  # the policy's, for the actuator


async def test_an_enforced_policy_sizes_with_the_modes_headroom_and_the_partitions_prior(
    nats_url: str, service: DecisionService
) -> None:
    """``isolation: enforced`` with no headroom of its own: the engine sizes with the mode's
    learned headroom and resize budget (as ``replay --isolation enforced``), and a young
    workload starts from the prior of its partition's warm workloads, not the uniform rule.
    The test's hours pass in a second: the prior follows the samples' time, not the clock's
    (deciding.PRIOR_EVERY_S of either)."""
    stored = await set_policy(nats_url, Policy(scope=INFERENCE, isolation=MemoryIsolation.ENFORCED))
    chat = workload("chat")
    sizing = service.policies.for_workload(chat)
    assert sizing.memory_headroom == ENFORCED_HEADROOM
    assert sizing.resize_budget_per_day == MODE_RESIZE_BUDGET
    assert service.policies.stored[INFERENCE.key] == stored  # what `policy get` shows
    n = service.partition_count
    young = next(
        name
        for name in (f"young-{i}" for i in range(1000))
        if subjects.usage_partition(workload(name), n) == subjects.usage_partition(chat, n)
    )
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    sent = 0
    # chat: 5 h, its memory 0.2 above its peak for ten minutes of the second hour; warm (4 h)
    # by the time young starts, with a jump statistic of 0.2.
    for minute in range(0, 300, 5):
        share = 0.5 if 100 <= minute < 110 else 0.3
        s = sample(memory_share=share, allocated=1.0, minute=minute)
        await js.publish(subjects.usage_subject(s.workload), s.to_json())
        sent += 1
    # young: steady at 0.3 from 5 h 10 min; its first downsize comes after 30 min.
    for minute in range(310, 350, 5):
        s = sample(memory_share=0.3, allocated=1.0, minute=minute, name=young)
        await js.publish(subjects.usage_subject(s.workload), s.to_json())
        sent += 1
    await wait_for(lambda: service.samples._value.get() >= sent)
    await nc.close()
    [first] = [d for d in await decisions(nats_url) if d.workload.owner_name == young]
    assert first.direction is Direction.DOWN
    # 0.3 + chat's jump as the prior (0.5); the uniform rule would hold 0.3 + 0.1.
    assert first.new_fraction > 0.45
    assert "learned headroom" in first.explanation
    assert "population's prior" in first.explanation


async def test_replicas_share_the_requests_and_see_each_others_changes(nats_url: str) -> None:
    await reset_nats(nats_url)
    one = DecisionService(DecisionSettings(nats={"url": nats_url}))
    two = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(one), running(two):
        stored = await set_policy(nats_url, Policy(scope=INFERENCE, max_fraction=0.5))
        for _ in range(10):
            assert await get_policy(nats_url, CHAT.to_json()) == stored
        # Both replicas follow the bucket, whichever stored it.
        for svc in (one, two):
            await wait_for(lambda svc=svc: svc.policies.for_workload(workload()) == stored)
        answered = [
            counter(
                s.runtime.registry,
                "fracpilot_bus_requests_total",
                subject=subjects.POLICY_GET,
                outcome="replied",
            )
            for s in (one, two)
        ]
    assert sum(answered) == 10  # each request answered once, by one replica
