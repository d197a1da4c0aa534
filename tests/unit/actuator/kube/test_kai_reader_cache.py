"""The KAI reader with the watch-fed cache as its source (in-memory cache and API): what the
cache holds is read without a list; what it cannot say is listed as without a cache."""

from __future__ import annotations

import asyncio
from typing import Any

from fracpilot_actuator.kube.kai_objects import CachedKaiObjects, KaiReader
from fracpilot_libs.kai import KaiSettings

REQUEST = {
    "metadata": {"name": "chat-1", "namespace": "inference"},
    "spec": {"podName": "chat-1", "selectedNode": "n1", "selectedGPUGroups": ["g1"]},
}
QUEUE = {
    "metadata": {"name": "team"},
    "spec": {"resources": {"gpu": {"quota": 1, "limit": 2}}},
    "status": {"allocated": {"nvidia.com/gpu": "1500m"}},
}
GROUP = {  # as KAI's podgrouper writes it (scheduling.run.ai/v2alpha2)
    "metadata": {"name": "pg-train-0", "namespace": "inference"},
    "spec": {"minMember": 2, "queue": "team"},
}


class ListingApi:
    def __init__(self, objects: dict[str, list[dict[str, Any]] | None]) -> None:
        self.objects = objects
        self.calls: list[str] = []

    async def list_kai_objects(
        self, group: str, version: str, plural: str
    ) -> list[dict[str, Any]] | None:
        self.calls.append(plural)
        return self.objects.get(plural)


class MemoryCache:
    def __init__(self, held: dict[str, CachedKaiObjects]) -> None:
        self.held = held
        self.asked: list[str] = []

    def kai_objects(self, plural: str) -> CachedKaiObjects | None:
        self.asked.append(plural)
        return self.held.get(plural)


def read(api: ListingApi, cache: MemoryCache, settings: KaiSettings | None = None) -> Any:
    reader = KaiReader(api, settings or KaiSettings(), cache)
    return reader, asyncio.run(reader.read())


def test_what_the_cache_holds_is_read_without_a_list() -> None:
    api = ListingApi({"queues": [], "bindrequests": [], "podgroups": []})  # would find nothing
    cache = MemoryCache(
        {
            "queues": CachedKaiObjects([QUEUE]),
            "bindrequests": CachedKaiObjects([REQUEST]),
            "podgroups": CachedKaiObjects([GROUP]),
        }
    )
    reader, got = read(api, cache)
    assert got.queues is not None
    assert got.queues["team"].allocated == 1.5
    assert got.bound["inference/chat-1"].node == "n1"
    assert got.pod_groups["inference/pg-train-0"].min_member == 2
    assert got.pod_groups["inference/pg-train-0"].queue == "team"
    assert (api.calls, reader.lists) == ([], 0)


def test_what_the_cache_cannot_say_is_listed() -> None:
    api = ListingApi({"queues": [QUEUE], "bindrequests": [REQUEST], "podgroups": [GROUP]})
    cache = MemoryCache(  # BindRequests and PodGroups: not synced yet
        {"queues": CachedKaiObjects([])}
    )
    reader, got = read(api, cache)
    assert got.queues == {}  # from the cache, although the API has one
    assert set(got.bound) == {"inference/chat-1"}
    assert set(got.pod_groups) == {"inference/pg-train-0"}
    assert (sorted(api.calls), reader.lists) == (["bindrequests", "podgroups"], 2)


def test_a_crd_the_cache_found_absent_reads_as_not_served_without_a_list() -> None:
    api = ListingApi({"queues": [QUEUE], "bindrequests": [REQUEST]})
    absent = CachedKaiObjects(None)
    cache = MemoryCache({"queues": absent, "bindrequests": absent, "podgroups": absent})
    _, got = read(api, cache)
    assert (got.queues, dict(got.bound), got.pod_groups) == (None, {}, None)
    assert api.calls == []


def test_kinds_switched_off_are_neither_asked_of_the_cache_nor_listed() -> None:
    api = ListingApi({"queues": [QUEUE]})
    cache = MemoryCache({"queues": CachedKaiObjects([QUEUE])})
    settings = KaiSettings(read_queues=False, read_bind_requests=False, read_pod_groups=False)
    _, got = read(api, cache, settings)
    assert got.queues is None
    assert (api.calls, cache.asked) == ([], [])
