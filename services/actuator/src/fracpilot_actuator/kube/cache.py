"""The inventory's inputs (nodes, pods, ReplicaSets and Jobs), kept current by watches.

Each resource is an :class:`~fracpilot_libs.kube.informer.Informer` on the event loop: listed
in pages, then watched from the list's resourceVersion; a watch that ends is resumed from the
last resourceVersion seen, one that fails (410 Gone, API trouble) lists again, and the relist
removes what was deleted meanwhile. ``synced`` is set once every resource has been listed.

The backend must not plan on a cache older than its own writes: after a write it adds a
:class:`Fence` (the write's resourceVersion, or a pod that must be gone) and
:meth:`InventoryCache.wait_for` waits until the watches have passed it.
"""

from __future__ import annotations

import asyncio
import atexit
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from fracpilot_libs.kube.informer import Informer
from fracpilot_libs.kube.store import Key

RESOURCES = ("nodes", "pods", "replicasets", "jobs")
_RUNNING: weakref.WeakSet[InventoryCache] = weakref.WeakSet()

__all__ = ["RESOURCES", "Fence", "InventoryCache", "Key", "Snapshot"]


@atexit.register
def _stop_all() -> None:
    """Stop the watches before the interpreter goes: a daemon thread still reading a TLS
    stream at exit can crash it."""
    caches = list(_RUNNING)
    for cache in caches:
        cache.stop()
    for cache in caches:
        cache.join(1.0)


@dataclass(frozen=True)
class Fence:
    """What the cache must have seen: ``resource`` at ``resource_version`` or later, and
    (for a deleted or evicted pod) ``gone`` no longer in it."""

    resource: str = "pods"
    resource_version: int | None = None
    gone: Key | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    replica_sets: list[dict[str, Any]]
    jobs: list[dict[str, Any]]


class InventoryCache:
    """Nodes (matching ``node_selector``), pods, ReplicaSets and Jobs of every namespace.

    Start, read and wait on the event loop: the informers change the cache on it only.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_selector: str | None = None,
        resync_s: int = 300,
        timeout_s: float = 30.0,
    ) -> None:
        core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
        listers: dict[str, Callable[..., Any]] = {
            "nodes": lambda **kw: core.list_node(label_selector=node_selector, **kw),
            "pods": core.list_pod_for_all_namespaces,
            "replicasets": apps.list_replica_set_for_all_namespaces,
            "jobs": batch.list_job_for_all_namespaces,
        }
        self._informers = {
            name: Informer(
                name,
                listers[name],
                resync_s=resync_s,
                timeout_s=timeout_s,
                on_change=self._changed,
                log_as="inventory",
            )
            for name in RESOURCES
        }
        self.synced = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        self._stopped = False

    @property
    def relists(self) -> int:
        """Lists made so far (one per resource at start, more after a failed watch)."""
        return sum(i.relists for i in self._informers.values())

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watches on the running loop."""
        self._stopped = False
        _RUNNING.add(self)
        for informer in self._informers.values():
            informer.start()

    def join(self, timeout_s: float) -> None:
        for informer in self._informers.values():
            informer.join(timeout_s)

    async def wait_synced(self, timeout_s: float = 30.0) -> bool:
        try:
            await asyncio.wait_for(self.synced.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def stop(self) -> None:
        self._stopped = True
        _RUNNING.discard(self)
        for informer in self._informers.values():
            informer.stop()
        self._wake()

    # --- reading ----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        def items(name: str) -> list[dict[str, Any]]:
            return list(self._informers[name].store.values())

        return Snapshot(
            nodes=items("nodes"),
            pods=items("pods"),
            replica_sets=items("replicasets"),
            jobs=items("jobs"),
        )

    def resource_version(self, resource: str) -> int:
        return self._informers[resource].resource_version

    def passed(self, fences: Iterable[Fence]) -> bool:
        return all(self._passed(f) for f in fences)

    def _passed(self, f: Fence) -> bool:
        informer = self._informers[f.resource]
        return (f.resource_version is None or informer.resource_version >= f.resource_version) and (
            f.gone is None or f.gone not in informer.store
        )

    async def wait_for(self, fences: Iterable[Fence], timeout_s: float) -> bool:
        """True once the watches have passed every fence; False after ``timeout_s``."""
        pending = tuple(fences)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.passed(pending):
            remaining = deadline - loop.time()
            if self._stopped or remaining <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return self.passed(pending)
        return True

    def _changed(self) -> None:
        if not self.synced.is_set() and all(i.synced.is_set() for i in self._informers.values()):
            self.synced.set()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
