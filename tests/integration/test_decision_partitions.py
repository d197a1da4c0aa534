"""Decision replicas share the usage partitions over a real nats-server.

Samples are partitioned by workload into one stream per partition (by the slot in their
subject), replicas claim partitions through KV leases, and each workload's samples are decided
in order by one replica. When a replica joins, leaves or is killed, its partitions move and the
new owner carries on each workload's history from the checkpoints: every sample counted once,
none lost.
The replicas run in this process (each with its own connection), so a kill is a cancel that
checkpoints and acknowledges nothing, as a SIGKILL would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta

import nats
import pytest
from nats.js.api import StreamConfig, SubjectTransform
from prometheus_client import CollectorRegistry

from factories import T0, sample
from fracpilot_decision.checkpoints import mark_key
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings, PartitionLeaseSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.decision_backlog import decision_backlog
from fracpilot_libs.nats.usage_streams import usage_partition_count
from fracpilot_libs.sizing.state import WorkloadState
from helpers import counter, read_stream, read_usage, reset_nats, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 8
LEASE_S = 2.0
WORKLOADS = [f"svc-{i:02d}" for i in range(24)]


def settings(url: str, name: str, checkpoint_interval_s: float = 0.2) -> DecisionSettings:
    return DecisionSettings(
        nats={"url": url},
        replica_id=name,
        decision_partitions=PARTITIONS,
        partition={"lease_s": LEASE_S},
        checkpoint={"interval_s": checkpoint_interval_s, "when_idle_s": 0},
        fetch_batch=16,
    )


def feed(round_: int, names: Iterable[str] = WORKLOADS) -> list[UsageSample]:
    """One sample per workload, a minute apart per round; compute says which round it is
    (memory stays low and the fraction fits, so no decisions: this is about histories)."""
    return [
        sample(
            compute=round((round_ % 50 + 1) / 100, 2),
            memory_share=0.05,
            at=T0 + timedelta(minutes=round_),
            name=name,
            allocated=1.0,
        )
        for name in names
    ]


async def publish(url: str, samples: list[UsageSample]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for s in samples:
        await js.publish(subjects.usage_subject(s.workload), s.to_json())
    await nc.close()


class Replica:
    """A decision service run as a task, stopped gracefully or killed."""

    def __init__(self, service: DecisionService) -> None:
        self.service = service
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> Replica:
        runtime = self.service.runtime
        self.task = asyncio.create_task(
            runtime.run(self.service.start, self.service.stop, install_signals=False)
        )
        await wait_for(lambda: runtime.health.ready or self.task is None or self.task.done(), 30)
        if self.task.done():
            self.task.result()
        return self

    async def stop(self) -> None:
        if self.task is None or self.task.done():
            return
        self.service.runtime.stop_requested.set()
        await asyncio.wait_for(self.task, timeout=30)

    async def kill(self) -> None:
        """Nothing more checkpointed or acknowledged, leases left to run out."""
        await self.service.abandon()
        self.service.runtime.stop_requested.set()  # then only closes the connection
        if self.task is not None:
            await asyncio.wait_for(self.task, timeout=30)

    @property
    def owned(self) -> set[int]:
        return set(self.service.parts)

    def decided(self) -> float:
        return self.service.samples._value.get()


@contextlib.asynccontextmanager
async def replicas(*services: DecisionService) -> AsyncIterator[list[Replica]]:
    started = [await Replica(s).start() for s in services]
    try:
        yield started
    finally:
        for r in started:
            await r.stop()


def states_of(*rs: Replica) -> dict[str, list[WorkloadState]]:
    """Every workload's state on each replica that holds it."""
    found: dict[str, list[WorkloadState]] = defaultdict(list)
    for r in rs:
        for key, state in r.service.histories.items():
            found[key].append(state)
    return found


async def two_rounds_decided(url: str, replica: str) -> None:
    """A replica decides two rounds of every workload, then stops (checkpoints written)."""
    async with replicas(DecisionService(settings(url, replica))) as [r]:
        for round_ in range(2):
            await publish(url, feed(round_))
        await wait_for(lambda: r.decided() == 2 * len(WORKLOADS), timeout=15)


async def published_by_ingest(url: str, rounds: Iterable[int]) -> None:
    """Rounds published as ingest does, its streams declared at its start."""
    bus = Bus(
        "ingest",
        ServiceSettings(nats={"url": url}, decision_partitions=PARTITIONS),
        CollectorRegistry(),
    )
    await bus.connect(retry_for_s=5)
    try:
        await bus.ensure_streams()
        for r in rounds:
            for s in feed(r):
                await bus.publish(subjects.usage_subject(s.workload), s, s.sample_id)
    finally:
        await bus.close()


async def decided_exactly_once(replica: Replica, new_rounds: int, rounds: int) -> None:
    """The replica decides the new rounds, and every history then holds every round, none
    counted twice."""
    await wait_for(lambda: replica.decided() == new_rounds * len(WORKLOADS), timeout=15)
    await asyncio.sleep(0.3)  # anything delivered again would be counted by now
    assert_histories([replica], rounds=rounds)
    registry = replica.service.runtime.registry
    assert counter(registry, "fracpilot_decision_duplicate_samples_total") == 0


def key(name: str) -> str:
    return subjects.kv_key(sample(name=name).workload)


def assert_histories(rs: Iterable[Replica], rounds: int) -> None:
    """Each workload on one replica, with every sample of every round, in order."""
    found = states_of(*rs)
    assert set(found) == {key(n) for n in WORKLOADS}
    for name in WORKLOADS:
        [state] = found[key(name)]
        assert state.samples == rounds, name  # none lost, none counted twice
        assert state.first_seen == T0.timestamp(), name  # the history was never reset
        last_two = tuple(round((r % 50 + 1) / 100, 2) for r in (rounds - 2, rounds - 1))
        assert state.recent_compute == last_two, name  # the last samples, in order


async def test_each_partition_stream_holds_its_workloads(nats_url: str) -> None:
    await reset_nats(nats_url)
    async with replicas(DecisionService(settings(nats_url, "solo"))):
        await publish(nats_url, feed(0))
        assert len(await read_usage(nats_url)) == len(WORKLOADS)
        where: dict[str, int] = {}
        for p in range(PARTITIONS):
            for subject, data in await read_stream(nats_url, subjects.usage_stream(p)):
                wl = UsageSample.model_validate_json(data).workload
                assert subject == subjects.usage_subject(wl)
                where[wl.owner_name] = p
    assert where == {
        n: subjects.usage_partition(sample(name=n).workload, PARTITIONS) for n in WORKLOADS
    }
    assert len(set(where.values())) > PARTITIONS // 2  # spread over the partitions
    nc = await nats.connect(nats_url)
    try:
        assert await usage_partition_count(nc.jetstream()) == PARTITIONS
    finally:
        await nc.close()


async def test_a_joining_replica_takes_half_and_histories_carry_on(nats_url: str) -> None:
    await reset_nats(nats_url)
    a = await Replica(DecisionService(settings(nats_url, "a"))).start()
    b: Replica | None = None
    try:
        assert a.owned == set(range(PARTITIONS))  # alone, it owns everything at once
        for r in range(3):
            await publish(nats_url, feed(r))
        await wait_for(lambda: a.decided() == 3 * len(WORKLOADS), timeout=15)

        b = await Replica(DecisionService(settings(nats_url, "b"))).start()
        await wait_for(lambda: len(a.owned) == len(b.owned) == PARTITIONS // 2, timeout=15)
        assert a.owned.isdisjoint(b.owned)
        for r in range(3, 6):
            await publish(nats_url, feed(r))
        await wait_for(lambda: a.decided() + b.decided() == 6 * len(WORKLOADS), timeout=15)
        assert_histories([a, b], rounds=6)
        moved = [k for k, [s] in states_of(b).items() if s.samples == 6]
        assert moved, "the joining replica carries on histories it restored"
        restored = counter(
            b.service.runtime.registry, "fracpilot_decision_checkpoints_restored_total"
        )
        assert restored == len(moved)
        # A graceful hand-over left nothing to be delivered again.
        assert (
            counter(b.service.runtime.registry, "fracpilot_decision_duplicate_samples_total") == 0
        )
    finally:
        for r in (a, b):
            if r is not None:
                await r.stop()


async def test_a_replica_that_leaves_hands_its_partitions_over_at_once(nats_url: str) -> None:
    await reset_nats(nats_url)
    long_lease = settings(nats_url, "a").model_copy(
        update={"partition": PartitionLeaseSettings(lease_s=60.0)}
    )
    other = settings(nats_url, "b").model_copy(
        update={"partition": PartitionLeaseSettings(lease_s=60.0)}
    )
    async with replicas(DecisionService(long_lease), DecisionService(other)) as (a, b):
        await wait_for(lambda: len(a.owned) == len(b.owned) == PARTITIONS // 2, timeout=30)
        await publish(nats_url, feed(0))
        await publish(nats_url, feed(1))
        await wait_for(lambda: a.decided() + b.decided() == 2 * len(WORKLOADS), timeout=15)
        await b.stop()
        # Released, not run out: far sooner than the 60 s lease.
        await wait_for(lambda: a.owned == set(range(PARTITIONS)), timeout=10)
        await publish(nats_url, feed(2))
        await wait_for(lambda: a.decided() == 3 * len(WORKLOADS) - b.decided(), timeout=15)
        assert_histories([a], rounds=3)
        reg = a.service.runtime.registry
        assert counter(reg, "fracpilot_decision_duplicate_samples_total") == 0


async def test_a_killed_replicas_partitions_move_with_no_sample_lost(nats_url: str) -> None:
    await reset_nats(nats_url)
    # The victim checkpoints only when told to, so the test decides what was committed.
    victim = DecisionService(settings(nats_url, "victim", checkpoint_interval_s=3600))
    survivor = DecisionService(settings(nats_url, "survivor"))
    a = await Replica(victim).start()
    b = await Replica(survivor).start()
    try:
        await wait_for(lambda: len(a.owned) == len(b.owned) == PARTITIONS // 2, timeout=30)
        lost = sorted(a.owned)
        theirs = [
            n
            for n in WORKLOADS
            if subjects.usage_partition(sample(name=n).workload, PARTITIONS) in lost
        ]
        assert theirs, "some workloads live on the replica that dies"

        # Rounds 0-1: checkpointed and acknowledged.
        for r in range(2):
            await publish(nats_url, feed(r))
        await wait_for(lambda: a.decided() + b.decided() == 2 * len(WORKLOADS), timeout=15)
        await victim.checkpoint()
        # Round 2: checkpointed, never acknowledged (the kill comes between the two).
        await publish(nats_url, feed(2))
        await wait_for(lambda: a.decided() + b.decided() == 3 * len(WORKLOADS), timeout=15)
        for part in victim.parts.values():
            assert not await victim.checkpoints.write(part.states, set(part.states))
        # Round 3: decided in memory only.
        await publish(nats_url, feed(3))
        await wait_for(lambda: a.decided() + b.decided() == 4 * len(WORKLOADS), timeout=15)

        await a.kill()
        # Round 4 arrives while the lease runs out.
        await publish(nats_url, feed(4))
        await wait_for(lambda: b.owned == set(range(PARTITIONS)), timeout=3 * LEASE_S + 10)
        await wait_for(
            lambda: (
                len(states_of(b)) == len(WORKLOADS)
                and all(s.samples == 5 for [s] in states_of(b).values())
            ),
            timeout=15,
        )
        assert_histories([b], rounds=5)
        reg = survivor.runtime.registry
        # Round 2 came again and was recognised; round 3 came again and was decided.
        assert counter(reg, "fracpilot_decision_duplicate_samples_total") == len(theirs)
        assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == len(theirs)
        # Everything ends checkpointed and acknowledged.
        nc = await nats.connect(nats_url)
        try:
            await survivor.checkpoint()
            backlog = await decision_backlog(nc.jetstream())
        finally:
            await nc.close()
        assert backlog is not None
        assert backlog.caught_up
    finally:
        await b.stop()


async def consumers(url: str) -> dict[int, tuple[int, int]]:
    """(acknowledgement floor, acknowledgements pending) of each partition's consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out = {}
    try:
        for p in range(PARTITIONS):
            info = await js.consumer_info(subjects.usage_stream(p), subjects.decision_consumer(p))
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            out[p] = (floor or 0, info.num_ack_pending or 0)
    finally:
        await nc.close()
    return out


async def marks(service: DecisionService) -> dict[int, int | None]:
    return {
        p: await service.checkpoints.read_mark(p, service.parts[p].stream_made)
        for p in range(PARTITIONS)
    }


async def test_samples_are_acknowledged_at_once_and_marked_at_checkpoints(nats_url: str) -> None:
    """nats-server keeps no pending state for samples decided but not yet checkpointed (at
    100,000 workloads that state cost it half its CPU); the mark says what is checkpointed."""
    await reset_nats(nats_url)
    service = DecisionService(settings(nats_url, "solo", checkpoint_interval_s=3600))
    async with replicas(service) as [solo]:
        await publish(nats_url, feed(0))
        await wait_for(lambda: solo.decided() == len(WORKLOADS), timeout=15)
        for _ in range(50):
            state = await consumers(nats_url)
            if all(pending == 0 for _, pending in state.values()):
                break
            await asyncio.sleep(0.05)
        assert all(pending == 0 for _, pending in state.values()), state
        assert sum(1 for floor, _ in state.values() if floor) > PARTITIONS // 2
        # Acknowledged, not checkpointed: the marks are where the claim put them.
        assert set((await marks(service)).values()) == {0}
        await service.checkpoint()
        after = await marks(service)
        assert after == {p: floor for p, (floor, _) in state.items()}


async def test_a_partition_without_a_mark_resumes_from_its_acknowledgement_floor(
    nats_url: str,
) -> None:
    """A consumer without a mark (the mark deleted, or its first owner died between making the
    consumer and marking it): its acknowledgement floor is taken as the mark, so nothing the
    checkpoints hold is delivered again."""
    await reset_nats(nats_url)
    await two_rounds_decided(nats_url, "old")
    floors = {p: floor for p, (floor, _) in (await consumers(nats_url)).items()}
    nc = await nats.connect(nats_url)
    kv = await nc.jetstream().key_value(subjects.DECISION_STATE_BUCKET)
    for p in range(PARTITIONS):
        await kv.delete(mark_key(p))
    await nc.close()

    await publish(nats_url, feed(2))
    new = DecisionService(settings(nats_url, "new", checkpoint_interval_s=3600))
    async with replicas(new) as [b]:
        await wait_for(lambda: b.decided() == len(WORKLOADS), timeout=15)
        await asyncio.sleep(0.3)  # anything delivered again would be counted by now
        assert_histories([b], rounds=3)
        reg = new.runtime.registry
        assert counter(reg, "fracpilot_decision_duplicate_samples_total") == 0
        assert b.decided() == len(WORKLOADS)
        claimed = await marks(new)
    assert claimed == floors  # the floors, written down as marks before consuming


async def test_an_unreadable_mark_means_the_whole_stream_again(nats_url: str) -> None:
    """A mark that does not parse could be anywhere: every sample is delivered again and the
    positions in the checkpoints skip those already counted. Nothing lost, nothing twice."""
    await reset_nats(nats_url)
    await two_rounds_decided(nats_url, "a")
    nc = await nats.connect(nats_url)
    kv = await nc.jetstream().key_value(subjects.DECISION_STATE_BUCKET)
    for p in range(PARTITIONS):
        await kv.put(mark_key(p), b'{"seq": "soon"}')
    await nc.close()

    again = DecisionService(settings(nats_url, "b"))
    async with replicas(again) as [b]:
        reg = again.runtime.registry
        await wait_for(
            lambda: (
                counter(reg, "fracpilot_decision_duplicate_samples_total") == 2 * len(WORKLOADS)
            ),
            timeout=15,
        )
        await publish(nats_url, feed(2))
        await wait_for(lambda: b.decided() == len(WORKLOADS), timeout=15)
        assert_histories([b], rounds=3)
        assert counter(reg, "fracpilot_decision_checkpoints_corrupt_total") == PARTITIONS


async def test_a_sample_on_another_workloads_subject_is_dead_lettered(nats_url: str) -> None:
    """The partition comes from the subject: a sample of one workload published on another's
    subject would split its history over two partitions, so it is refused with the reason."""
    await reset_nats(nats_url)
    async with replicas(DecisionService(settings(nats_url, "solo"))) as [solo]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        stray = sample(name="svc-01", allocated=1.0)
        await js.publish(subjects.usage_subject(sample(name="svc-02").workload), stray.to_json())
        await js.publish(subjects.usage_subject(stray.workload), stray.to_json())
        await nc.close()
        await wait_for(lambda: solo.decided() == 1, timeout=15)
        letters = await read_stream(nats_url, subjects.DEADLETTER_STREAM)
    assert len(letters) == 1
    assert "svc-01" in letters[0][1].decode()
    assert set(solo.service.histories) == {key("svc-01")}


async def test_fewer_partitions_move_the_slots_and_histories_carry_on(nats_url: str) -> None:
    """The partition count lowered with the decision caught up (docs/performance.md): the
    slots move to the remaining streams, the others are retired, every workload's history
    carries on: positions from its former stream never hide a sample in its new one."""
    await reset_nats(nats_url)
    await two_rounds_decided(nats_url, "eight")
    fewer = DecisionSettings(
        **{**settings(nats_url, "four").model_dump(), "decision_partitions": 4}
    )
    async with replicas(DecisionService(fewer)) as [b]:
        assert b.owned == set(range(4))
        await publish(nats_url, feed(2))
        await wait_for(lambda: b.decided() == len(WORKLOADS), timeout=15)
        assert_histories([b], rounds=3)
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        try:
            assert await usage_partition_count(js) == 4
            for p in range(PARTITIONS):
                config = (await js.stream_info(subjects.usage_stream(p))).config
                expected = (
                    subjects.usage_stream_subjects(p, 4)
                    if p < 4
                    else subjects.retired_usage_subjects(p)
                )
                assert tuple(config.subjects or ()) == expected
        finally:
            await nc.close()
        for n in WORKLOADS:  # the round after the change, in the workload's new stream
            stream = subjects.usage_stream(subjects.usage_partition(sample(name=n).workload, 4))
            assert [s for s, _ in await read_stream(nats_url, stream)].count(
                subjects.usage_subject(sample(name=n).workload)
            ) >= 1


async def test_an_upgrade_from_the_single_usage_stream(nats_url: str) -> None:
    """The earlier layout: one stream ``FRACPILOT_USAGE`` on ``fracpilot.usage.v1.>``. It is
    narrowed to its publishers' subjects (a sample from a not yet upgraded ingest is still
    stored, not refused), and the checkpoints' positions, which are that stream's, do not
    hide a sample of the new partition streams (whose sequences start again at 1)."""
    await reset_nats(nats_url)
    await two_rounds_decided(nats_url, "old")
    # Only the checkpoints are kept, as if the samples had been in the earlier stream.
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for p in range(PARTITIONS):
        await js.delete_stream(subjects.usage_stream(p))
    kv = await js.key_value(subjects.DECISION_STATE_BUCKET)
    for p in range(PARTITIONS):
        await kv.delete(mark_key(p))
    await js.add_stream(
        StreamConfig(
            name=subjects.LEGACY_USAGE_STREAM,
            subjects=[f"{subjects.USAGE_PREFIX}.>"],
            subject_transform=SubjectTransform(
                src=f"{subjects.USAGE_PREFIX}.*.*",
                dest=f"{subjects.USAGE_PREFIX}.p.{{{{partition({PARTITIONS},1,2)}}}}"
                ".{{wildcard(1)}}.{{wildcard(2)}}",
            ),
        )
    )
    await nc.close()

    # The upgraded ingest starts (its streams declared) and publishes before the upgraded
    # decision runs: the new streams' first sequences are those the checkpoints' positions name.
    await published_by_ingest(nats_url, (2, 3))
    new = DecisionService(settings(nats_url, "new"))
    async with replicas(new) as [b]:
        await decided_exactly_once(b, new_rounds=2, rounds=4)
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        try:
            legacy = await js.stream_info(subjects.LEGACY_USAGE_STREAM)
            assert legacy.config.subjects == [subjects.LEGACY_USAGE_SUBJECTS]
            old_ingest = await js.publish(
                f"{subjects.USAGE_PREFIX}.team.chat", sample(name="chat").to_json()
            )
            assert old_ingest.stream == subjects.LEGACY_USAGE_STREAM
        finally:
            await nc.close()
    # Lowering the count later, the earlier stream still there: the retired streams' subject
    # overlaps none of its subjects.
    fewer = DecisionSettings(
        **{**settings(nats_url, "four").model_dump(), "decision_partitions": 4}
    )
    async with replicas(DecisionService(fewer)) as [c]:
        assert c.owned == set(range(4))


async def test_a_partition_stream_made_anew_is_read_from_its_start(nats_url: str) -> None:
    """The usage streams deleted and made again while the decision service was down, and
    filled past the old marks and positions before it comes back: a mark names the stream
    it is of (its creation time), so an old one is not used, and the positions go with it."""
    await reset_nats(nats_url)
    await two_rounds_decided(nats_url, "before")
    nc = await nats.connect(nats_url)
    for p in range(PARTITIONS):
        await nc.jetstream().delete_stream(subjects.usage_stream(p))
    await nc.close()
    await published_by_ingest(nats_url, (2, 3, 4))
    async with replicas(DecisionService(settings(nats_url, "after"))) as [b]:
        await decided_exactly_once(b, new_rounds=3, rounds=5)


async def test_a_consumer_deleted_under_its_owner_is_opened_again(nats_url: str) -> None:
    await reset_nats(nats_url)
    async with replicas(DecisionService(settings(nats_url, "solo"))) as [solo]:
        await publish(nats_url, feed(0))
        await wait_for(lambda: solo.decided() == len(WORKLOADS), timeout=15)
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        for p in range(PARTITIONS):
            await js.delete_consumer(subjects.usage_stream(p), subjects.decision_consumer(p))
        await nc.close()
        await publish(nats_url, feed(1))
        await wait_for(lambda: solo.decided() == 2 * len(WORKLOADS), timeout=20)
        await asyncio.sleep(0.3)
        assert_histories([solo], rounds=2)
