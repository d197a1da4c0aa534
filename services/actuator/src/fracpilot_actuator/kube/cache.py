"""The inventory's inputs (nodes, pods, ReplicaSets and Jobs), kept current by watches.

Each resource is an :class:`~fracpilot_libs.kube.informer.Informer` on the event loop: listed
in pages, then watched from the list's resourceVersion; a watch that ends is resumed from the
last resourceVersion seen, one that fails (410 Gone, API trouble) lists again, and the relist
removes what was deleted meanwhile. ``synced`` is set once every resource has been listed.

KAI-Scheduler's BindRequests, Queues and PodGroups (as :class:`KaiSettings` asks) are watched
too, each by a :class:`CrdWatch`: their CRDs may be absent (a cluster without KAI) or not watchable
(RBAC without ``watch``). A resource the API server refuses (404, 403) is logged once and
asked again after a doubling pause (``kai_retry_s`` up to ``resync_s``, never a hot loop);
meanwhile :meth:`InventoryCache.kai_objects` says "not served" for a 404 (what a list would
answer) and "unknown" otherwise, and the reader lists them per decision as without the cache.

The backend must not plan on a cache older than its own writes: after a write it adds a
:class:`Fence` (the write's resourceVersion, or a pod that must be gone) and
:meth:`InventoryCache.wait_for` waits until the watches have passed it.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fracpilot_actuator.kube.gangs import POD_GROUP_GROUP, POD_GROUP_PLURAL, POD_GROUP_VERSION
from fracpilot_actuator.kube.kai import (
    BIND_REQUEST_GROUP,
    BIND_REQUEST_PLURAL,
    BIND_REQUEST_VERSION,
)
from fracpilot_actuator.kube.kai_objects import CachedKaiObjects
from fracpilot_actuator.kube.queues import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from fracpilot_libs.deadlines import within
from fracpilot_libs.kai import KaiSettings
from fracpilot_libs.kube.client import hand_over, in_thread
from fracpilot_libs.kube.informer import Informer
from fracpilot_libs.kube.store import Key

log = logging.getLogger(__name__)

RESOURCES = ("nodes", "pods", "replicasets", "jobs")
_RUNNING: weakref.WeakSet[InventoryCache] = weakref.WeakSet()

__all__ = ["RESOURCES", "CrdWatch", "Fence", "InventoryCache", "Key", "Snapshot"]


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


CrdState = Literal["unknown", "served", "absent", "forbidden"]
REFUSALS: dict[int, CrdState] = {404: "absent", 403: "forbidden"}


class CrdWatch:
    """An :class:`Informer` of a custom resource the API server may not serve.

    First one small list asks whether it is served; if so the informer runs until the API
    server refuses it (404: the CRD was removed; 403: no RBAC to list or watch it), then the
    cache is emptied and, like a refused first ask, the resource is asked again after
    ``retry_s``, doubling up to ``retry_max_s``. Each change of state is logged once.
    ``settled`` is set once the state is known (served and listed, or refused).
    """

    def __init__(
        self,
        name: str,
        lister: Callable[..., Any],
        *,
        resync_s: int,
        timeout_s: float,
        retry_s: float,
        retry_max_s: float,
        on_change: Callable[[], None],
    ) -> None:
        self.name = name
        self._lister = lister
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._retry_max_s = max(retry_s, retry_max_s)
        self._on_change = on_change
        self.informer = Informer(
            name,
            self._list,
            resync_s=resync_s,
            timeout_s=timeout_s,
            on_change=self._changed,
            log_as="inventory",
        )
        self.state: CrdState = "unknown"
        self.settled = asyncio.Event()
        self.probes = 0  # asks whether it is served (for tests: no hot loop)
        self._run_id = 0
        self._refusal: asyncio.Future[int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def items(self) -> list[dict[str, Any]] | None:
        """The cached objects while served and listed; None otherwise."""
        if self.state != "served" or not self.informer.synced.is_set():
            return None
        return list(self.informer.store.values())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"crd-{self.name}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.informer.stop()

    def _list(self, **kwargs: Any) -> Any:
        """The informer's lister (in its threads): a refusal is handed to the loop."""
        run_id, loop, refusal = self._run_id, self._loop, self._refusal
        try:
            return self._lister(**kwargs)
        except ApiException as exc:
            if exc.status in REFUSALS and loop is not None and refusal is not None:
                hand_over(loop, partial(self._refused, run_id, exc.status))
            raise

    def _refused(self, run_id: int, status: int) -> None:
        refusal = self._refusal
        if run_id == self._run_id and refusal is not None and not refusal.done():
            refusal.set_result(status)

    async def _probe(self) -> int | None:
        """The refusing status (404, 403), or None: served (or the API is in trouble, which
        the informer rides out itself)."""
        self.probes += 1
        timeout = self._timeout_s

        def call() -> None:
            self._lister(limit=1, _preload_content=False, _request_timeout=timeout).release_conn()

        try:
            await in_thread(call, timeout + 1.0, name=f"probe-{self.name}")
        except ApiException as exc:
            if exc.status in REFUSALS:
                return int(exc.status)
        except Exception as exc:
            log.debug("KAI objects probe failed", extra={"watch": self.name, "error": str(exc)})
        return None

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        delay = self._retry_s
        while True:
            status = await self._probe()
            if status is None:
                self._run_id += 1
                self._refusal = self._loop.create_future()
                self._set_state("served")
                self.informer.start()
                try:
                    status = await self._refusal
                finally:
                    self.informer.stop()
                self.informer.store.clear()
                self.informer.synced.clear()
                delay = self._retry_s
            self._set_state(REFUSALS[status], status, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._retry_max_s)

    def _set_state(self, state: CrdState, status: int | None = None, delay: float = 0) -> None:
        if state != self.state:
            if state == "served":
                log.info("KAI objects served: watching them", extra={"watch": self.name})
            else:
                log.warning(
                    f"KAI {self.name} not served ({status}: "
                    + ("CRD not installed" if status == 404 else "no RBAC to list and watch")
                    + "): listed per decision if at all, watched again when served",
                    extra={"watch": self.name, "status": status, "retry_s": delay},
                )
            self.state = state
        self._changed()

    def _changed(self) -> None:
        if self.state != "unknown" and (self.state != "served" or self.informer.synced.is_set()):
            self.settled.set()
        self._on_change()


class InventoryCache:
    """Nodes (matching ``node_selector``), pods, ReplicaSets and Jobs of every namespace, and
    KAI's BindRequests, Queues and PodGroups as ``kai`` asks (none without it).

    Start, read and wait on the event loop: the informers change the cache on it only.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_selector: str | None = None,
        resync_s: int = 300,
        timeout_s: float = 30.0,
        kai: KaiSettings | None = None,
        kai_retry_s: float = 30.0,
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
        custom = client.CustomObjectsApi(api)
        kinds = (  # group, version, plural, watched
            (
                BIND_REQUEST_GROUP,
                BIND_REQUEST_VERSION,
                BIND_REQUEST_PLURAL,
                kai and kai.read_bind_requests,
            ),
            (QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, kai and kai.read_queues),
            (POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL, kai and kai.read_pod_groups),
        )
        self._kai = {
            plural: CrdWatch(
                plural,
                partial(custom.list_cluster_custom_object, group, version, plural),
                resync_s=resync_s,
                timeout_s=timeout_s,
                retry_s=kai_retry_s,
                retry_max_s=resync_s,
                on_change=self._wake,
            )
            for group, version, plural, watched in kinds
            if watched
        }
        self.synced = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        self._stopped = False

    @property
    def relists(self) -> int:
        """Lists made so far (one per resource at start, more after a failed watch)."""
        informers = [*self._informers.values(), *(w.informer for w in self._kai.values())]
        return sum(i.relists for i in informers)

    @property
    def kai_watches(self) -> dict[str, CrdWatch]:
        """The KAI objects watched, by plural (``bindrequests``, ``queues``, ``podgroups``)."""
        return dict(self._kai)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watches on the running loop."""
        self._stopped = False
        _RUNNING.add(self)
        for informer in self._informers.values():
            informer.start()
        for watch in self._kai.values():
            watch.start()

    def join(self, timeout_s: float) -> None:
        for informer in [*self._informers.values(), *(w.informer for w in self._kai.values())]:
            informer.join(timeout_s)

    async def wait_synced(self, timeout_s: float = 30.0) -> bool:
        """True once the inventory is listed and each KAI watch knows whether it is served."""

        async def every() -> None:
            await self.synced.wait()
            for watch in self._kai.values():
                await watch.settled.wait()

        try:
            await within(every(), timeout_s)
        except TimeoutError:
            return False
        return True

    def stop(self) -> None:
        self._stopped = True
        _RUNNING.discard(self)
        for informer in self._informers.values():
            informer.stop()
        for watch in self._kai.values():
            watch.stop()
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

    def kai_objects(self, plural: str) -> CachedKaiObjects | None:
        """KAI's ``plural`` as the cache has them; None when it cannot say (not watched, not
        listed yet, or refused for want of RBAC): the caller lists them."""
        watch = self._kai.get(plural)
        if watch is None:
            return None
        if watch.state == "absent":
            return CachedKaiObjects(None)
        items = watch.items
        return None if items is None else CachedKaiObjects(items)

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
                await within(waiter, remaining)
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
