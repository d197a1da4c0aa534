"""The shared informer (fracpilot_libs.kube.informer) against a real kube-apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from fracpilot_libs.kube.informer import Informer
from helpers import wait_for

pytestmark = pytest.mark.integration


def make_pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "informer-test"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="x")]),
    )


@contextlib.contextmanager
def running(informer: Informer) -> Iterator[Informer]:
    informer.start()
    try:
        yield informer
    finally:
        informer.stop()


def namespaced(core: client.CoreV1Api, ns: str, calls: list[dict[str, Any]] | None = None) -> Any:
    """The namespace's pod list, recording each list call's arguments."""

    def lister(**kw: Any) -> Any:
        if calls is not None and not kw.get("watch"):
            calls.append(kw)
        return core.list_namespaced_pod(ns, **kw)

    return lister


async def test_lists_in_pages_and_drops_managed_fields(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    for i in range(7):
        core.create_namespaced_pod(kube_namespace, make_pod(f"p{i}"))
    calls: list[dict[str, Any]] = []
    informer = Informer("pods", namespaced(core, kube_namespace, calls), page_size=2)
    with running(informer):
        assert await informer.wait_synced(30)
        assert {name for _, name in informer.store} == {f"p{i}" for i in range(7)}
        assert [c["limit"] for c in calls] == [2, 2, 2, 2]
        assert [bool(c.get("_continue")) for c in calls] == [False, True, True, True]
        assert all("managedFields" not in o["metadata"] for o in informer.store.values())
        assert all(o["kind"] == "Pod" for o in informer.store.values())

        core.create_namespaced_pod(kube_namespace, make_pod("late"))
        await wait_for(lambda: informer.get((kube_namespace, "late")) is not None, timeout=10)
        assert informer.relists == 1  # by the watch, not by a list


async def test_a_pod_deleted_while_the_watch_is_down_is_gone_after_the_relist(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    for name in ("stays", "goes"):
        core.create_namespaced_pod(kube_namespace, make_pod(name))
    informer = Informer("pods", namespaced(core, kube_namespace), page_size=1)
    with running(informer):
        assert await informer.wait_synced(30)
        assert (kube_namespace, "goes") in informer.store
    # The watch is down: the deletion is never seen as an event.
    core.delete_namespaced_pod("goes", kube_namespace, grace_period_seconds=0)
    before = informer.relists
    with running(informer):
        await wait_for(lambda: informer.relists > before, timeout=30)
        assert set(informer.store) == {(kube_namespace, "stays")}


async def test_a_miss_is_read_once_and_remembered(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    informer = Informer(
        "pods",
        namespaced(core, kube_namespace),
        reader=core.read_namespaced_pod,
        lookup_timeout_s=5.0,
        miss_ttl_s=300.0,
    )
    with running(informer):
        assert await informer.wait_synced(30)
        ghost = (kube_namespace, f"ghost-{uuid.uuid4().hex[:6]}")
        assert await informer.get_or_read(ghost) is None
        assert await informer.get_or_read(ghost) is None
        assert informer.lookups == 1  # the second miss was remembered, not asked again

        core.create_namespaced_pod(kube_namespace, make_pod("real"))
        found = await informer.get_or_read((kube_namespace, "real"))
        assert found is not None  # read from the API, or already delivered by the watch
        assert found["metadata"]["name"] == "real"
        assert "managedFields" not in found["metadata"]


async def test_a_stop_while_the_watch_request_is_in_flight_closes_the_watch(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    """stop() finds no response to shut down while the watch request is on its way; the watch
    thread must close the response itself once it comes, not block on the open watch (seen:
    an owners informer's watch held the session's kube-apiserver up to its SIGKILL)."""
    core = client.CoreV1Api(kube_admin)
    asked, stopped = threading.Event(), threading.Event()
    responses: list[Any] = []

    def lister(**kw: Any) -> Any:
        if not kw.get("watch"):
            return core.list_namespaced_pod(kube_namespace, **kw)
        asked.set()
        stopped.wait(10)  # the request is sent only after stop() ran
        responses.append(core.list_namespaced_pod(kube_namespace, **kw))
        return responses[-1]

    informer = Informer("pods", lister)
    informer.start()
    assert await informer.wait_synced(30)
    await wait_for(asked.is_set, timeout=10)
    informer.stop()
    stopped.set()
    await asyncio.to_thread(informer.join, 10)  # the namespace is quiet: no event would wake it
    assert informer._thread is not None
    assert not informer._thread.is_alive()
    [response] = responses
    assert response.closed  # not handed back to the pool with the watch still open
