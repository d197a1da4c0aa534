"""The asyncio leader elector on an in-memory Lease: it leads and says so, a standby takes
over from a dead or stopped leader in time, and a leader cut off from the apiserver stops
before another starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from fracpilot_actuator.election.core import ElectionTiming, RoundResult
from fracpilot_actuator.election.elector import LeaderElector
from fracpilot_actuator.election.lease_stores import MemoryLeaseStore, SeverableLeaseStore

QUICK = ElectionTiming(
    lease_duration_s=1, renew_deadline_s=0.6, renew_period_s=0.2, retry_period_s=0.1
)


async def watch_leaders(
    electors: list[LeaderElector], until: asyncio.Event, overlaps: list[float]
) -> None:
    """Sample every elector's is_leader every millisecond and note any overlap."""
    while not until.is_set():
        if sum(e.is_leader for e in electors) > 1:
            overlaps.append(time.monotonic())
        await asyncio.sleep(0.001)


async def wait_until(condition: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``condition()`` holds (polling every millisecond)."""
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return time.monotonic() - start
            await asyncio.sleep(0.001)


async def test_one_elector_leads_and_reports_it() -> None:
    registry = CollectorRegistry()
    events: list[str] = []
    elector = LeaderElector(
        MemoryLeaseStore(),
        "a",
        QUICK,
        registry=registry,
        on_started_leading=lambda: events.append("started"),
        on_stopped_leading=lambda: events.append("stopped"),
    )
    assert not elector.is_leader
    assert registry.get_sample_value("fracpilot_actuator_leader") == 0
    await elector.start()
    async with asyncio.timeout(2):
        await elector.wait_for_leadership()
    assert elector.is_leader
    assert elector.leading.is_set()
    assert registry.get_sample_value("fracpilot_actuator_leader") == 1
    await asyncio.sleep(0.5)  # renewals keep it leading past the renew deadline
    assert elector.is_leader
    renewed = {"outcome": "renewed"}
    assert (registry.get_sample_value("fracpilot_actuator_lease_rounds_total", renewed) or 0) >= 2
    await elector.stop()
    assert not elector.is_leader
    assert events == ["started", "stopped"]
    assert registry.get_sample_value("fracpilot_actuator_leader") == 0
    for to in ("leader", "standby"):
        labels = {"to": to}
        assert registry.get_sample_value("fracpilot_actuator_leader_transitions_total", labels) == 1


async def test_the_standby_takes_over_from_a_dead_leader_within_the_lease() -> None:
    store = MemoryLeaseStore()
    a = LeaderElector(store, "a", QUICK)
    b = LeaderElector(store, "b", QUICK)
    stop, overlaps = asyncio.Event(), list[float]()
    watcher = asyncio.create_task(watch_leaders([a, b], stop, overlaps))
    await a.start()
    async with asyncio.timeout(2):
        await a.wait_for_leadership()
    await b.start()
    await asyncio.sleep(0.5)
    assert a.is_leader
    assert not b.is_leader
    await a.stop(release=False)  # dies: the lease is left to run out
    took = await wait_until(lambda: b.is_leader, timeout=3)
    assert took <= QUICK.lease_duration_s + QUICK.retry_period_s
    stop.set()
    await watcher
    await b.stop()
    assert overlaps == []


async def test_a_graceful_stop_hands_over_within_a_retry_period() -> None:
    store = MemoryLeaseStore()
    a = LeaderElector(store, "a", QUICK)
    b = LeaderElector(store, "b", QUICK)
    await a.start()
    async with asyncio.timeout(2):
        await a.wait_for_leadership()
    await b.start()
    await asyncio.sleep(0.3)
    await a.stop()
    took = await wait_until(lambda: b.is_leader, timeout=3)
    assert took <= QUICK.retry_period_s + 0.1
    record = store.get()
    assert record is not None
    assert (record[0].holder, record[0].transitions) == ("b", 1)
    await b.stop()


async def test_a_leader_cut_off_from_the_apiserver_stops_before_the_other_starts() -> None:
    shared = MemoryLeaseStore()
    cut_off = SeverableLeaseStore(shared)
    a = LeaderElector(cut_off, "a", QUICK)
    b = LeaderElector(shared, "b", QUICK)
    stop, overlaps = asyncio.Event(), list[float]()
    watcher = asyncio.create_task(watch_leaders([a, b], stop, overlaps))
    await a.start()
    async with asyncio.timeout(2):
        await a.wait_for_leadership()
    await b.start()
    await asyncio.sleep(0.3)
    cut_off.down = True
    cut = time.monotonic()
    gave_up = await wait_until(lambda: not a.is_leader, timeout=2)
    assert gave_up <= QUICK.renew_deadline_s
    # The watchdog fired, not only the property: it is a timer at the same deadline, so a
    # loaded loop may run it a little after the property (which reads the clock) turned.
    await wait_until(lambda: not a.leading.is_set(), timeout=0.5)
    await wait_until(lambda: b.is_leader, timeout=3)
    assert time.monotonic() - cut <= QUICK.lease_duration_s + QUICK.retry_period_s
    cut_off.down = False  # back: a sees b's lease and stands by
    await asyncio.sleep(0.5)
    assert b.is_leader
    assert not a.is_leader
    assert isinstance(a.last_result, RoundResult)
    assert a.last_result.decision.holder == "b"
    stop.set()
    await watcher
    await a.stop()
    await b.stop()
    assert overlaps == []


async def test_a_failing_callback_does_not_stop_the_election() -> None:
    def boom() -> None:
        raise RuntimeError("callback failed")

    elector = LeaderElector(MemoryLeaseStore(), "a", QUICK, on_started_leading=boom)
    async with elector:
        async with asyncio.timeout(2):
            await elector.wait_for_leadership()
        await asyncio.sleep(0.3)
        assert elector.is_leader


def test_identity_defaults_to_host_and_a_random_suffix() -> None:
    a, b = LeaderElector(MemoryLeaseStore()), LeaderElector(MemoryLeaseStore())
    assert a.identity != b.identity
    assert a.identity.rsplit("_", 1)[0] == b.identity.rsplit("_", 1)[0]
