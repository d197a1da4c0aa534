"""The inventory's inputs (nodes, pods, ReplicaSets, Jobs), kept current by watches.

Each resource is listed once, then watched from the list's resourceVersion in a daemon
thread (raw JSON, as the lists of :mod:`fracpilot_actuator.kube.api`); a watch that ends
is resumed from the last resourceVersion seen, one that fails (410 Gone, API trouble) lists
again. ``synced`` is set once every resource has been listed.

The backend must not plan on a cache older than its own writes: after a write it adds a
:class:`Fence` (the write's resourceVersion, or a pod that must be gone) and
:meth:`InventoryCache.wait_for` waits until the watches have passed it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import socket
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace or "", name)
RESOURCES = ("nodes", "pods", "replicasets", "jobs")
_RUNNING: weakref.WeakSet[InventoryCache] = weakref.WeakSet()


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


class _GoneError(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def _rv(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


@dataclass(frozen=True)
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    replica_sets: list[dict[str, Any]]
    jobs: list[dict[str, Any]]


class InventoryCache:
    """Nodes (matching ``node_selector``), pods, ReplicaSets and Jobs of every namespace."""

    def __init__(
        self,
        api: client.ApiClient,
        node_selector: str | None = None,
        resync_s: int = 300,
        timeout_s: float = 30.0,
    ) -> None:
        core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
        self._listers: dict[str, Callable[..., Any]] = {
            "nodes": lambda **kw: core.list_node(label_selector=node_selector, **kw),
            "pods": core.list_pod_for_all_namespaces,
            "replicasets": apps.list_replica_set_for_all_namespaces,
            "jobs": batch.list_job_for_all_namespaces,
        }
        self._resync_s = resync_s
        self._timeout_s = timeout_s
        self._stores: dict[str, dict[Key, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self._versions: dict[str, int] = dict.fromkeys(RESOURCES, 0)
        self._changed = threading.Condition()
        self._synced = {r: threading.Event() for r in RESOURCES}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._responses: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self.relists = 0

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        _RUNNING.add(self)
        for name in RESOURCES:
            thread = threading.Thread(
                target=self._run, args=(name,), name=f"inventory-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float) -> None:
        for thread in self._threads:
            thread.join(timeout_s)

    async def wait_synced(self, timeout_s: float = 30.0) -> bool:
        return await asyncio.to_thread(self.synced.wait, timeout_s)

    def stop(self) -> None:
        self._stop.set()
        _RUNNING.discard(self)
        for response in list(self._responses.values()):
            # Wake the thread blocked reading the watch: shutting the socket down does not
            # wait for it (closing the response would, on the reader's buffer lock).
            sock: Any = getattr(getattr(response, "connection", None), "sock", None)
            with contextlib.suppress(Exception):
                sock.shutdown(socket.SHUT_RDWR)
        with self._changed:
            self._changed.notify_all()

    # --- reading ----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._changed:
            return Snapshot(
                nodes=list(self._stores["nodes"].values()),
                pods=list(self._stores["pods"].values()),
                replica_sets=list(self._stores["replicasets"].values()),
                jobs=list(self._stores["jobs"].values()),
            )

    def resource_version(self, resource: str) -> int:
        with self._changed:
            return self._versions[resource]

    def passed(self, fences: Iterable[Fence]) -> bool:
        with self._changed:
            return self._passed(tuple(fences))

    def _passed(self, fences: tuple[Fence, ...]) -> bool:
        return all(
            (f.resource_version is None or self._versions[f.resource] >= f.resource_version)
            and (f.gone is None or f.gone not in self._stores[f.resource])
            for f in fences
        )

    async def wait_for(self, fences: Iterable[Fence], timeout_s: float) -> bool:
        """True once the watches have passed every fence; False after ``timeout_s``."""
        pending = tuple(fences)

        def wait() -> bool:
            with self._changed:
                return self._changed.wait_for(
                    lambda: self._stop.is_set() or self._passed(pending), timeout_s
                ) and self._passed(pending)

        return self.passed(pending) or await asyncio.to_thread(wait)

    # --- the watches ------------------------------------------------------------------------

    def _run(self, name: str) -> None:
        lister = self._listers[name]
        while not self._stop.is_set():
            try:
                version = self._list(name, lister)
                while not self._stop.is_set():
                    version = self._watch(name, lister, version)
            except _GoneError:
                log.info("inventory watch expired: listing again", extra={"watch": name})
            except Exception as exc:  # API down, connection reset: list again after a pause
                if self._stop.is_set():
                    return
                log.warning(
                    "inventory watch restarting", extra={"watch": name, "error": str(exc)[:200]}
                )
                self._stop.wait(1.0)

    def _list(self, name: str, lister: Callable[..., Any]) -> str:
        response = lister(_preload_content=False, _request_timeout=self._timeout_s)
        body = json.loads(response.data)
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        items = body.get("items") or []
        with self._changed:
            self._stores[name] = {_key(item): item for item in items}
            self._versions[name] = max(self._versions[name], _rv(version))
            self.relists += 1
            self._changed.notify_all()
        self._synced[name].set()
        if all(event.is_set() for event in self._synced.values()):
            self.synced.set()
        return version

    def _watch(self, name: str, lister: Callable[..., Any], version: str) -> str:
        """One watch request from ``version``; the last resourceVersion it delivered."""
        from kubernetes.watch.watch import iter_resp_lines

        response = lister(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._resync_s,
            _preload_content=False,
            _request_timeout=(self._timeout_s, self._resync_s + self._timeout_s),
        )
        self._responses[name] = response
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line or line.isspace():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _GoneError
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                with self._changed:
                    store = self._stores[name]
                    if kind == "DELETED":
                        store.pop(_key(obj), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        store[_key(obj)] = obj
                    self._versions[name] = max(self._versions[name], _rv(version))
                    self._changed.notify_all()
        finally:
            self._responses.pop(name, None)
            response.release_conn()
        return version
