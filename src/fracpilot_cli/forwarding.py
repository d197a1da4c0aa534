"""A local loopback port that forwards each connection to a stream opened on demand.

``kubectl fracpilot`` reaches the release's NATS through the Kubernetes API: for each TCP
connection the NATS client makes to ``127.0.0.1:<port>``, :class:`Forwarder` asks its
connector for a socket to the far end (a pod's port, through a port-forward websocket of the
kubernetes client: :func:`fracpilot_cli.kube_access.pod_connector`) and copies bytes both
ways until either side closes. Threads, not asyncio: the kubernetes client's port forward is
a blocking socket pair, and the command's own event loop stays the NATS client's.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol


class Stream(Protocol):
    """What a connector returns: a socket, or the kubernetes client's wrapper of one."""

    def fileno(self) -> int: ...
    def recv(self, size: int, /) -> bytes: ...
    def sendall(self, data: bytes, /) -> Any: ...
    def close(self) -> None: ...


Connector = Callable[[], Stream]
_CHUNK = 64 * 1024


class Forwarder:
    """Listens on ``127.0.0.1`` (a free port: :attr:`port`) until :meth:`close`."""

    def __init__(self, connector: Connector, host: str = "127.0.0.1") -> None:
        self._connector = connector
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)  # so the accept loop sees close() soon
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self.errors: list[str] = []  # connector failures, for the command's error message
        self._closed = threading.Event()
        self._open: set[Stream | socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="fracpilot-forward", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.close()
            self._open.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                local, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(local,), name="fracpilot-forward-conn", daemon=True
            ).start()

    def _serve(self, local: socket.socket) -> None:
        try:
            remote = self._connector()
        except Exception as exc:  # the client sees a closed connection; the reason is kept
            self.errors.append(str(exc) or type(exc).__name__)
            local.close()
            return
        with self._lock:
            self._open.update((local, remote))
        try:
            pump(local, remote, self._closed)
        finally:
            with self._lock:
                self._open.difference_update((local, remote))
            for s in (local, remote):
                with contextlib.suppress(OSError):
                    s.close()


def pump(a: Stream, b: Stream, stop: threading.Event) -> None:
    """Copy bytes between ``a`` and ``b`` until one closes (or ``stop`` is set)."""
    peer = {a.fileno(): (a, b), b.fileno(): (b, a)}
    while not stop.is_set():
        try:
            ready, _, _ = select.select(list(peer), [], [], 0.2)
        except (OSError, ValueError):  # a socket was closed under us
            return
        for fd in ready:
            source, target = peer[fd]
            try:
                data = source.recv(_CHUNK)
                if not data:
                    return
                target.sendall(data)
            except OSError:
                return
