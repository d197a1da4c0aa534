"""Engine state checkpoints: a restarted decision service keeps each workload's history.

The decision service runs in-process against a real nats-server; it is stopped gracefully
(the last checkpoint is written after the consumers stop) and a new instance restores it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from factories import sample
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.checkpoint_groups import dump_group, group_key, load_group
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState, dump_state, state_json
from helpers import counter, reset_nats, running, wait_for

pytestmark = pytest.mark.integration


def assert_same_state(restored: WorkloadState, before: WorkloadState) -> None:
    for f in dataclasses.fields(WorkloadState):
        got, want = getattr(restored, f.name), getattr(before, f.name)
        if f.name == "compute_weights":  # kept to 6 significant digits
            assert list(got) == pytest.approx(list(want), rel=1e-5), f.name
        else:
            assert got == want, f.name


async def publish(url: str, *samples: UsageSample) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for s in samples:
        await js.publish(subjects.usage_subject(s.workload), s.to_json())
    await nc.close()


async def test_a_graceful_restart_keeps_each_workloads_history(nats_url: str) -> None:
    await reset_nats(nats_url)
    memory = [0.1, 0.3, 0.2, 0.25, 0.15]
    feed = [
        sample(compute=0.05 * (i + 1), memory_share=m, minute=i, allocated=1.0)
        for i, m in enumerate(memory)
    ]
    key = subjects.kv_key(feed[0].workload)
    # A long interval: only the checkpoint on shutdown is written.
    settings = DecisionSettings(
        nats={"url": nats_url}, checkpoint={"interval_s": 3600, "when_idle_s": 0}
    )
    first = DecisionService(settings)
    async with running(first):
        await publish(nats_url, *feed)
        await wait_for(lambda: first.samples._value.get() >= len(feed))
    before = first.histories[key]
    assert before.samples == len(feed)
    assert max(p for _, p in before.memory_peaks) == pytest.approx(0.3)
    written = counter(first.runtime.registry, "fracpilot_decision_checkpoints_written_total")
    assert written == 1

    second = DecisionService(settings)
    async with running(second):
        reg = second.runtime.registry
        assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == 1
        assert counter(reg, "fracpilot_decision_checkpoints_corrupt_total") == 0
        assert_same_state(second.histories[key], before)
        # History goes on from where it was.
        await publish(nats_url, sample(compute=0.1, memory_share=0.1, minute=5, allocated=1.0))
        await wait_for(lambda: second.samples._value.get() >= 1)
        assert second.histories[key].samples == len(feed) + 1
        assert second.histories[key].first_seen == before.first_seen


async def test_changed_workloads_are_checkpointed_on_the_interval(nats_url: str) -> None:
    await reset_nats(nats_url)
    service = DecisionService(
        DecisionSettings(nats={"url": nats_url}, checkpoint={"interval_s": 0.1})
    )
    s = sample(compute=0.2, memory_share=0.2, allocated=0.5)
    key = subjects.kv_key(s.workload)
    nc = await nats.connect(nats_url)
    async with running(service):
        await publish(nats_url, s, sample(compute=0.2, memory_share=0.2, minute=1, allocated=0.5))
        await wait_for(lambda: service.samples._value.get() >= 2)
        kv = await nc.jetstream().key_value(subjects.DECISION_STATE_BUCKET)

        async def checkpointed_samples() -> int:
            try:
                entry = await kv.get(group_key(key) or "")
            except nats.js.errors.KeyNotFoundError:
                return 0
            return dict(load_group(entry.value or b""))[key].samples  # type: ignore[union-attr]

        seen = 0
        for _ in range(40):  # the service is still running: this is the interval's work
            if (seen := await checkpointed_samples()) == 2:
                break
            await asyncio.sleep(0.05)
        assert seen == 2
        assert (
            counter(service.runtime.registry, "fracpilot_decision_checkpoints_written_total") >= 1
        )
    await nc.close()


async def test_a_corrupt_checkpoint_is_skipped_and_counted(nats_url: str) -> None:
    await reset_nats(nats_url)
    chat = sample(name="chat", memory_share=0.3)
    state, _ = decide(WorkloadState(), chat, Policy())
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=subjects.DECISION_STATE_BUCKET)
    llm_key = subjects.kv_key(sample(name="llm").workload)
    await kv.put(subjects.kv_key(chat.workload), dump_state(state))
    await kv.put(llm_key, b"\x00 not a checkpoint")
    await kv.put(subjects.kv_key(sample(name="asr").workload), b'{"v": 99}')
    await nc.close()

    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        reg = service.runtime.registry
        assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == 1
        assert counter(reg, "fracpilot_decision_checkpoints_corrupt_total") == 2
        assert set(service.histories) == {subjects.kv_key(chat.workload)}
        assert_same_state(service.histories[subjects.kv_key(chat.workload)], state)
        # The workload whose checkpoint was corrupt starts afresh.
        await publish(nats_url, sample(name="llm", minute=1))
        await wait_for(lambda: service.samples._value.get() >= 1)
        assert service.histories[llm_key].samples == 1


async def test_checkpoints_from_before_groups_are_restored_and_then_moved_into_groups(
    nats_url: str,
) -> None:
    """A rolling upgrade: the bucket holds one checkpoint per workload, in plain JSON (as
    written before compression) and compressed (before groups). Both restore; once a group
    holding a workload is stored, its own key is deleted; the next start reads the group."""
    await reset_nats(nats_url)
    chat, llm = sample(name="chat", memory_share=0.3), sample(name="llm", memory_share=0.2)
    chat_state, _ = decide(WorkloadState(), chat, Policy())
    llm_state, _ = decide(WorkloadState(), llm, Policy())
    chat_key, llm_key = subjects.kv_key(chat.workload), subjects.kv_key(llm.workload)
    nc = await nats.connect(nats_url)
    kv = await nc.jetstream().create_key_value(bucket=subjects.DECISION_STATE_BUCKET)
    await kv.put(chat_key, state_json(chat_state))
    await kv.put(llm_key, dump_state(llm_state))
    settings = DecisionSettings(
        nats={"url": nats_url}, checkpoint={"interval_s": 3600, "when_idle_s": 0}
    )
    try:
        service = DecisionService(settings)
        async with running(service):
            reg = service.runtime.registry
            assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == 2
            assert counter(reg, "fracpilot_decision_checkpoints_corrupt_total") == 0
            assert_same_state(service.histories[chat_key], chat_state)
            assert_same_state(service.histories[llm_key], llm_state)
            await publish(nats_url, sample(name="chat", memory_share=0.3, minute=1))
            await wait_for(lambda: service.samples._value.get() >= 1)
        # the graceful stop wrote chat's group, and deleted chat's own key
        group = (await kv.get(group_key(chat_key) or "")).value or b""
        assert dict(load_group(group))[chat_key].samples == 2  # type: ignore[union-attr]
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get(chat_key)
        assert (await kv.get(llm_key)).value == dump_state(llm_state)  # unchanged: kept

        again = DecisionService(settings)
        async with running(again):
            reg = again.runtime.registry
            assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == 2
            assert again.histories[chat_key].samples == 2
            assert_same_state(again.histories[llm_key], llm_state)
    finally:
        await nc.close()


async def test_a_corrupt_group_or_state_in_a_group_is_skipped_and_counted(nats_url: str) -> None:
    """A group that does not load is counted once (its workloads start afresh); a state in a
    group that does not load is counted, and its neighbours restored."""
    await reset_nats(nats_url)
    by_group: dict[str, list[str]] = {}  # names that share groups: two groups of two, and more
    names: dict[str, str] = {}
    for i in range(5000):
        key = subjects.kv_key(sample(name=f"w{i}").workload)
        names[key] = f"w{i}"
        by_group.setdefault(group_key(key) or "", []).append(key)
    shared = [g for g, keys in by_group.items() if len(keys) >= 2][:2]
    by_group = {g: by_group[g] for g in [*shared, *list(by_group)[:6]]}
    states = {k: sample(name=names[k]) for keys in by_group.values() for k in keys}
    whole = shared[0]
    nc = await nats.connect(nats_url)
    kv = await nc.jetstream().create_key_value(bucket=subjects.DECISION_STATE_BUCKET)
    restored = set()
    for group, keys in by_group.items():
        if group == whole:
            await kv.put(group, b"x not a group")
            continue
        value = dump_group((k, decide(WorkloadState(), states[k], Policy())[0]) for k in keys)
        restored |= set(keys)
        await kv.put(group, value)
    # one state in a group made unreadable: the rest of the group restores (that group in the
    # first version's format, JSON lines, as written before binary states: read as well)
    bad_group = shared[1]
    bad_key = by_group[bad_group][0]
    lines = [b"fracpilot-states 1"]
    for k in by_group[bad_group]:
        lines.append(
            k.encode() + b" " + state_json(decide(WorkloadState(), states[k], Policy())[0])
        )
    lines[1] = bad_key.encode() + b' {"v": 99}'
    await kv.put(bad_group, zlib.compress(b"\n".join(lines)))
    restored.discard(bad_key)
    await nc.close()

    service = DecisionService(DecisionSettings(nats={"url": nats_url}))
    async with running(service):
        reg = service.runtime.registry
        assert counter(reg, "fracpilot_decision_checkpoints_corrupt_total") == 2
        assert counter(reg, "fracpilot_decision_checkpoints_restored_total") == len(restored)
        assert set(service.histories) == restored


async def test_a_large_checkpoint_is_spread_over_chunks(nats_url: str) -> None:
    """6,000 states at once held up the samples behind them: a scheduled checkpoint goes a
    chunk at a time with a pause in between (the event loop free), and every state is
    stored. (The pause is a lower bound: a sleep never ends early.)"""
    import time

    from prometheus_client import CollectorRegistry

    from fracpilot_decision.checkpoints import CHECKPOINT_CHUNK, Checkpointer

    await reset_nats(nats_url)
    n = 3 * CHECKPOINT_CHUNK + 7
    states = {}
    for i in range(n):
        s = sample(name=f"w{i:04d}", compute=0.2, memory_share=0.1)
        states[subjects.kv_key(s.workload)], _ = decide(WorkloadState(), s, Policy())
    nc = await nats.connect(nats_url)
    try:
        checkpoints = Checkpointer(nc, CollectorRegistry())
        await checkpoints.open()
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_work())
        started = time.monotonic()
        # four chunks spread over 0.2 s: a pause of 0.05 s between two
        failed = await checkpoints.write(states, list(states), spread_s=0.2)
        took = time.monotonic() - started
        ticker.cancel()
        assert failed == set()
        assert took >= 3 * 0.05  # three pauses: between four chunks
        assert turns >= 3  # the loop ran meanwhile
        restored = await checkpoints.restore(frozenset(range(4)), 4)
        assert {k for part in restored.values() for k in part} == set(states)
    finally:
        await nc.close()


async def test_a_stalled_restore_is_tried_again_and_no_workload_starts_afresh(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read of the checkpoints stalls after one state (as during a KV leader
    election): the partitions are given up and claimed again, and every workload keeps its
    history; none is restored from a partial read."""
    from fracpilot_decision import checkpoints as checkpoints_module
    from fracpilot_libs.nats.kv_snapshot import SnapshotStalledError

    await reset_nats(nats_url)
    feed = [sample(name=f"w{i}", memory_share=0.1 + 0.05 * i, minute=i) for i in range(6)]
    settings = DecisionSettings(
        nats={"url": nats_url}, checkpoint={"interval_s": 3600, "when_idle_s": 0}
    )
    first = DecisionService(settings)
    async with running(first):
        await publish(nats_url, *feed)
        await wait_for(lambda: first.samples._value.get() >= len(feed))
    before = dict(first.histories)
    assert len(before) == len(feed)

    real_chunks = checkpoints_module.kv_chunks
    stalls = 0

    async def stalls_once(*args: Any, **kwargs: Any) -> AsyncIterator[list[Any]]:
        nonlocal stalls
        if stalls:
            async for part in real_chunks(*args, **kwargs):
                yield part
            return
        stalls += 1
        async for part in real_chunks(*args, **kwargs):
            yield part[:1]
            raise SnapshotStalledError("stalled (injected)", 1, len(feed))

    monkeypatch.setattr(checkpoints_module, "kv_chunks", stalls_once)
    second = DecisionService(settings)
    async with running(second):
        await wait_for(lambda: set(second.histories) == set(before), timeout=30)
        assert stalls == 1
        for key, state in before.items():
            assert_same_state(second.histories[key], state)


async def test_a_bucket_that_cannot_be_opened_fails_the_open_at_once(nats_url: str) -> None:
    """Nothing swallowed (issue 29): a declaration retrying cannot mend (three replicas asked
    of a single server) is raised by ``Checkpointer.open`` at once, not logged and passed over,
    so the service does not start without its checkpoints."""
    import time

    from nats.js.errors import APIError
    from prometheus_client import CollectorRegistry

    from fracpilot_decision.checkpoints import Checkpointer

    await reset_nats(nats_url)
    nc = await nats.connect(nats_url)
    try:
        checkpoints = Checkpointer(nc, CollectorRegistry(), replicas=3)
        started = time.monotonic()
        with pytest.raises(APIError, match="replicas"):
            await checkpoints.open()
        assert time.monotonic() - started < 5  # not retried until the declaration deadline
        with pytest.raises(RuntimeError, match="not opened"):
            _ = checkpoints.kv
    finally:
        await nc.close()
