"""One resource of the Kubernetes API kept in memory: list, then watch, on the event loop.

An :class:`Informer` lists its resource in pages (``limit``/``continue``), then watches from the
list's resourceVersion; a watch that ends is resumed from the last version seen, one that
expires (410 Gone) lists again, and a relist is diffed against the cache so that objects
deleted while the watch was down are removed. Objects are kept as the API's JSON without
``managedFields`` (or reduced further by ``project``).

Nothing blocks the loop: the synchronous client's calls and the JSON parsing run in daemon
threads (:func:`~fracpilot_libs.kube.client.in_thread`); the cache is changed on the loop
only, so readers on the loop need no lock. A key not in the cache can be read once from the
API (:meth:`Informer.get_or_read`), bounded by a timeout; a miss is remembered for a while
(:class:`~fracpilot_libs.kube.store.NegativeCache`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from fracpilot_libs.deadlines import event_set
from fracpilot_libs.kube.client import hand_over, in_thread
from fracpilot_libs.kube.store import (
    Key,
    NegativeCache,
    Obj,
    Page,
    Project,
    WatchEvent,
    WatchExpiredError,
    apply_event,
    diff,
    object_key,
    object_version,
    parse_event,
    parse_page,
    resource_version,
    trimmed,
)

log = logging.getLogger(__name__)
_END = object()  # the watch request ended normally


async def list_all(fetch: Callable[[str | None], Awaitable[Page]]) -> tuple[list[Obj], str]:
    """Every item of a paged list and the list's resourceVersion (that of its first page:
    later pages are served from the same snapshot)."""
    first = await fetch(None)
    items, version, token = list(first.items), first.resource_version, first.continue_token
    while token:
        page = await fetch(token)
        items.extend(page.items)
        token = page.continue_token
    return items, version


class Informer:
    """A list + watch cache of one resource (all namespaces, or what ``lister`` selects).

    ``lister`` is a list method of the kubernetes client (``list_pod_for_all_namespaces``);
    ``reader`` its read method (``read_namespaced_pod``), for :meth:`get_or_read`.
    ``on_change`` is called on the loop after every change applied.
    """

    def __init__(
        self,
        name: str,
        lister: Callable[..., Any],
        *,
        reader: Callable[..., Any] | None = None,
        project: Project = trimmed,
        page_size: int = 500,
        resync_s: int = 300,
        timeout_s: float = 30.0,
        lookup_timeout_s: float = 5.0,
        miss_ttl_s: float = 60.0,
        on_change: Callable[[], None] | None = None,
        log_as: str = "informer",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._lister = lister
        self._reader = reader
        self._project: Project = lambda obj: project(trimmed(obj))
        self._page_size = page_size
        self._resync_s = resync_s
        self._timeout_s = timeout_s
        self._lookup_timeout_s = lookup_timeout_s
        self._on_change = on_change
        self._log_as = log_as
        self._clock = clock
        self.store: dict[Key, Obj] = {}
        self.resource_version = 0  # the highest seen, for write fences
        self.synced = asyncio.Event()
        self.relists = 0
        self.lookups = 0
        self._missing = NegativeCache(miss_ttl_s)
        self._reading: dict[Key, asyncio.Future[Obj | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._response: Any = None
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Run on the current loop until :meth:`stop` (again after a stop: lists first)."""
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"watch-{self.name}")

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        # Wake the thread blocked reading the watch: shutting the socket down does not wait
        # for it (closing the response would, on the reader's buffer lock).
        sock: Any = getattr(getattr(self._response, "connection", None), "sock", None)
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    async def wait_synced(self, timeout_s: float) -> bool:
        return await event_set(self.synced, timeout_s)

    # --- reading ----------------------------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        return self.store.get(key)

    async def get_or_read(self, key: Key) -> Obj | None:
        """The cached object, else one read from the API (at most ``lookup_timeout_s``); None
        when it is not there or the API did not answer, remembered for ``miss_ttl_s``."""
        if (obj := self.store.get(key)) is not None:
            return obj
        if self._reader is None or self._missing.known_missing(key, self._clock()):
            return None
        reading = self._reading.get(key)
        if reading is None:  # concurrent askers share one read
            reading = asyncio.ensure_future(self._read(key))
            self._reading[key] = reading
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        return await asyncio.shield(reading)

    async def _read(self, key: Key) -> Obj | None:
        reader = self._reader
        assert reader is not None
        namespace, name = key
        timeout = self._lookup_timeout_s

        def call() -> Obj | None:
            args = (name, namespace) if namespace else (name,)
            try:
                response = reader(*args, _preload_content=False, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return self._project(json.loads(response.data))

        self.lookups += 1
        try:
            obj = await in_thread(call, timeout + 1.0, name=f"read-{self.name}")
        except Exception as exc:  # API trouble or too slow: a miss, remembered as well
            log.debug("lookup failed", extra={"watch": self.name, "error": str(exc)[:200]})
            obj = None
        if obj is None:
            self._missing.remember(key, self._clock())
            return None
        if object_version(obj) > self.resource_version and key not in self.store:
            # The watch has not reached it yet: it will bring its later changes (or deletion).
            self.store[key] = obj
        return obj

    # --- list and watch ---------------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping:
            try:
                version = await self.relist()
                while not self._stopping:
                    version = await self._watch(version)
            except WatchExpiredError:
                log.info(f"{self._log_as} watch expired: listing again", extra={"watch": self.name})
            except ApiException as exc:
                if self._stopping:
                    return
                if exc.status == 410:  # an expired continue token, or version too old
                    log.info(
                        f"{self._log_as} watch expired: listing again", extra={"watch": self.name}
                    )
                    continue
                await self._pause(exc)
            except Exception as exc:  # API down, connection reset: list again after a pause
                if self._stopping:
                    return
                await self._pause(exc)

    async def _pause(self, exc: BaseException) -> None:
        log.warning(
            f"{self._log_as} watch restarting",
            extra={"watch": self.name, "error": str(exc)[:200]},
        )
        await asyncio.sleep(1.0)

    async def relist(self) -> str:
        """List the resource (paged), replace the cache with it; the list's resourceVersion."""
        items, version = await list_all(self._fetch_page)
        self.store, delta = diff(self.store, items)
        self.resource_version = max(self.resource_version, resource_version(version))
        self.relists += 1
        if delta.deleted and self.synced.is_set():
            log.info(
                "relist removed objects deleted while the watch was down",
                extra={"watch": self.name, "deleted": len(delta.deleted)},
            )
        self.synced.set()
        self._changed()
        return version

    async def _fetch_page(self, token: str | None) -> Page:
        def call() -> Page:
            kwargs: dict[str, Any] = {
                "limit": self._page_size,
                "_preload_content": False,
                "_request_timeout": self._timeout_s,
            }
            if token:
                kwargs["_continue"] = token
            response = self._lister(**kwargs)
            return parse_page(json.loads(response.data), self._project)

        return await in_thread(call, self._timeout_s + 1.0, name=f"list-{self.name}")

    async def _watch(self, version: str) -> str:
        """One watch request from ``version``; the last resourceVersion it delivered."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        thread = threading.Thread(
            target=self._stream,
            args=(version, loop, queue),
            name=f"watch-{self.name}",
            daemon=True,
        )
        self._thread = thread
        thread.start()
        while True:
            batch = [await queue.get()]
            while not queue.empty():  # everything that arrived meanwhile, then one notification
                batch.append(queue.get_nowait())
            for i, item in enumerate(batch):
                if isinstance(item, WatchEvent):
                    version = self._apply(item, version)
                    continue
                if i:
                    self._changed()
                if isinstance(item, BaseException):
                    raise item
                return version  # _END
            self._changed()

    def _apply(self, event: WatchEvent, version: str) -> str:
        meta = event.object.get("metadata") or {}
        if event.type != "BOOKMARK":
            apply_event(self.store, event)
            if event.type == "ADDED":
                self._missing.forget(object_key(event.object))
        seen = meta.get("resourceVersion")
        self.resource_version = max(self.resource_version, resource_version(seen))
        return str(seen or version)

    def _stream(
        self, version: str, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]
    ) -> None:
        """In the watch thread: read and parse the stream, hand each event to the loop."""
        from kubernetes.watch.watch import iter_resp_lines

        put = queue.put_nowait
        try:
            response = self._lister(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._resync_s,
                _preload_content=False,
                _request_timeout=(self._timeout_s, self._resync_s + self._timeout_s),
            )
            self._response = response
            try:
                # A stop() while the request was in flight found no response to shut down.
                lines = () if self._stopping else iter_resp_lines(response)  # type: ignore[no-untyped-call]
                for line in lines:
                    if self._stopping:
                        break
                    event = parse_event(line, self._project)
                    if event is not None and not hand_over(loop, partial(put, event)):
                        return
            finally:
                self._response = None
                if self._stopping:  # the watch is still open: never hand it back to the pool
                    response.close()
                response.release_conn()
        except BaseException as exc:
            hand_over(loop, partial(put, exc))
        else:
            hand_over(loop, partial(put, _END))

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
