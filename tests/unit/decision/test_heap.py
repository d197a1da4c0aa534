"""The heap freezer: survivors leave the collector's scans, cycles among them still go."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from fracpilot_decision.heap import HeapFreezer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # whatever a test did, the rest of the suite runs with a normal collector


async def test_survivors_are_frozen_until_it_stops() -> None:
    registry = CollectorRegistry()
    heap = HeapFreezer(0.02, 3600, registry)
    heap.start()
    await asyncio.sleep(0.1)
    assert gc.get_freeze_count() > 0
    assert (registry.get_sample_value("fracpilot_gc_frozen_objects") or 0) > 0
    await heap.stop()
    assert gc.get_freeze_count() == 0


async def test_a_frozen_cycle_survives_until_the_full_collection() -> None:
    registry = CollectorRegistry()
    heap = HeapFreezer(0.02, 3600, registry)
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    gc.freeze()  # as the freezer does: the cycle is alive and gets frozen
    del a, b  # garbage now, but only the collector can tell (a cycle)
    gc.collect()
    assert ref() is not None  # frozen: the collector does not look at it
    heap.full_collection()
    assert ref() is None
    assert registry.get_sample_value("fracpilot_gc_full_collection_seconds_count") == 1
    assert gc.get_freeze_count() > 0  # frozen again after the collection
    await heap.stop()


async def test_the_full_collection_comes_on_its_interval() -> None:
    registry = CollectorRegistry()
    heap = HeapFreezer(0.02, 0.1, registry)
    heap.start()

    def full_collections() -> float:
        return registry.get_sample_value("fracpilot_gc_full_collection_seconds_count") or 0

    try:  # each one scans the whole test process: slow on a busy machine, so no fixed sleep
        for _ in range(300):
            if full_collections() >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await heap.stop()
    assert full_collections() >= 2


async def test_an_interval_of_zero_leaves_the_collector_alone() -> None:
    heap = HeapFreezer(0, 600, CollectorRegistry())
    heap.start()
    await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0
    await heap.stop()
