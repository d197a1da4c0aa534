"""The informer against a scripted, in-memory API: paging, relist diff, 410, misses.

The fake plays the synchronous kubernetes client: lists return pages of JSON, watches return
a stream of lines, reads raise ``ApiException(404)`` for what is not there.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from fracpilot_libs.kube.informer import Informer, list_all
from fracpilot_libs.kube.store import Page

Obj = dict[str, Any]


def pod(name: str, rv: int) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": str(rv),
            "managedFields": [{"manager": "x"}],
        }
    }


class FakeResponse:
    def __init__(self, data: bytes = b"", lines: list[str] | None = None) -> None:
        self.data = data
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for line in self._lines:
            yield (line + "\n").encode()

    def release_conn(self) -> None:
        return None


class FakeApi:
    """Pods of one namespace; each watch call plays the next scripted stream."""

    def __init__(self, pods: list[Obj]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.version = 100
        self.lists: list[dict[str, Any]] = []
        self.watches: list[list[str] | Exception] = []
        self.reads: list[str] = []
        self.read_delay_s = 0.0
        self.lock = threading.Lock()

    def list(self, **kw: Any) -> FakeResponse:
        if kw.get("watch"):
            with self.lock:
                step = self.watches.pop(0) if self.watches else None
            if step is None:  # nothing to say: the request idles, then ends
                time.sleep(0.02)
                return FakeResponse(lines=[])
            if isinstance(step, Exception):
                raise step
            return FakeResponse(lines=step)
        self.lists.append(kw)
        items = [self.pods[n] for n in sorted(self.pods)]
        start = int(kw.get("_continue") or 0)
        limit = kw.get("limit") or len(items)
        end = start + limit
        meta: dict[str, Any] = {"resourceVersion": str(self.version)}
        if end < len(items):
            meta["continue"] = str(end)
        body = {"kind": "PodList", "metadata": meta, "items": items[start:end]}
        return FakeResponse(data=json.dumps(body).encode())

    def read(self, name: str, namespace: str, **kw: Any) -> FakeResponse:
        self.reads.append(name)
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return FakeResponse(data=json.dumps(self.pods[name]).encode())


def event(kind: str, obj: Obj) -> str:
    return json.dumps({"type": kind, "object": obj})


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def informer(api: FakeApi, **kw: Any) -> Informer:
    return Informer("pods", api.list, reader=api.read, timeout_s=2.0, **kw)


async def test_list_all_follows_continue_tokens() -> None:
    pages = {
        None: Page([{"n": 1}], "7", "a"),
        "a": Page([{"n": 2}], "", "b"),
        "b": Page([{"n": 3}], "", None),
    }
    asked: list[str | None] = []

    async def fetch(token: str | None) -> Page:
        asked.append(token)
        return pages[token]

    items, version = await list_all(fetch)
    assert items == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert version == "7"  # the snapshot of the first page
    assert asked == [None, "a", "b"]


async def test_lists_in_pages_and_drops_managed_fields() -> None:
    api = FakeApi([pod(f"p{i}", i) for i in range(5)])
    inf = informer(api, page_size=2)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        assert len(inf.store) == 5
        assert [kw.get("limit") for kw in api.lists] == [2, 2, 2]
        assert [kw.get("_continue") for kw in api.lists] == [None, "2", "4"]
        assert all("managedFields" not in o["metadata"] for o in inf.store.values())
        assert inf.resource_version == 100
    finally:
        inf.stop()


async def test_watch_events_are_applied_and_notified() -> None:
    api = FakeApi([pod("a", 1)])
    changes: list[int] = []
    inf = informer(api, on_change=lambda: changes.append(len(inf.store)))
    inf.start()
    try:
        assert await inf.wait_synced(5)
        api.watches.append([event("ADDED", pod("b", 101)), event("DELETED", pod("a", 102))])
        await until(lambda: set(inf.store) == {("ns", "b")})
        assert inf.resource_version == 102
        assert inf.relists == 1  # by watch events, not by a list
        assert changes
    finally:
        inf.stop()


async def test_a_pod_deleted_while_the_watch_was_down_is_gone_after_the_relist() -> None:
    api = FakeApi([pod("a", 1), pod("b", 2)])
    inf = informer(api)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        del api.pods["a"]  # no DELETED event ever comes for it
        api.version = 200
        expired = {"code": 410, "message": "too old resource version"}
        api.watches.append([json.dumps({"type": "ERROR", "object": expired})])
        await until(lambda: inf.relists == 2)
        assert set(inf.store) == {("ns", "b")}
        assert inf.resource_version == 200
    finally:
        inf.stop()


async def test_api_trouble_during_the_watch_relists_after_a_pause() -> None:
    api = FakeApi([pod("a", 1)])
    inf = informer(api)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        api.pods["b"] = pod("b", 150)
        api.watches.append(ConnectionResetError("reset by peer"))
        await until(lambda: ("ns", "b") in inf.store)
        assert inf.relists == 2
    finally:
        inf.stop()


async def test_a_miss_is_read_once_and_remembered_for_its_ttl() -> None:
    now = [1000.0]
    api = FakeApi([pod("a", 1)])
    inf = informer(api, miss_ttl_s=60, clock=lambda: now[0])
    inf.start()
    try:
        assert await inf.wait_synced(5)
        assert await inf.get_or_read(("ns", "a")) is not None
        assert api.reads == []  # cached: no read
        assert await inf.get_or_read(("ns", "ghost")) is None
        assert await inf.get_or_read(("ns", "ghost")) is None
        assert api.reads == ["ghost"]
        assert inf.lookups == 1
        now[0] += 61
        assert await inf.get_or_read(("ns", "ghost")) is None
        assert api.reads == ["ghost", "ghost"]  # the TTL is over: asked again
    finally:
        inf.stop()


async def test_a_pod_newer_than_the_cache_is_read_and_kept() -> None:
    api = FakeApi([])
    inf = informer(api)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        api.pods["late"] = pod("late", 500)  # created after the list; its event not seen yet
        found = await inf.get_or_read(("ns", "late"))
        assert found is not None
        assert "managedFields" not in found["metadata"]
        assert ("ns", "late") in inf.store
    finally:
        inf.stop()


async def test_concurrent_misses_share_one_read_bounded_by_the_timeout() -> None:
    api = FakeApi([])
    api.read_delay_s = 5.0  # an API that does not answer
    inf = informer(api, lookup_timeout_s=0.2)
    inf.start()
    try:
        assert await inf.wait_synced(5)
        started = time.monotonic()
        results = await asyncio.gather(*(inf.get_or_read(("ns", "slow")) for _ in range(10)))
        assert time.monotonic() - started < 3.0
        assert results == [None] * 10
        assert api.reads == ["slow"]
        assert await inf.get_or_read(("ns", "slow")) is None  # remembered, no second wait
        assert api.reads == ["slow"]
    finally:
        inf.stop()


async def test_the_event_loop_is_not_blocked_while_listing() -> None:
    api = FakeApi([pod("a", 1)])
    slow_list = api.list

    def list_slowly(**kw: Any) -> FakeResponse:
        if not kw.get("watch"):
            time.sleep(0.3)
        return slow_list(**kw)

    inf = Informer("pods", list_slowly, timeout_s=2.0)
    inf.start()
    try:
        ticks = 0
        while not inf.synced.is_set():
            ticks += 1
            await asyncio.sleep(0.01)
        assert ticks >= 10  # the loop kept running during the 0.3 s list
    finally:
        inf.stop()
