"""A fault-injecting HTTP proxy on loopback in front of the real kube-apiserver (chaos tests).

Clients speak plain HTTP to the proxy (``http://127.0.0.1:<port>``, no credentials); the proxy
re-originates each request over TLS to the apiserver with the admin client certificate, so
the apiserver, its authentication and its answers stay real. Every request is logged
(:attr:`FaultProxy.log`), and rules switched at runtime make matching requests fail:

- ``status``: answer 409 / 429 / 500 / 503 ... at once with a Kubernetes ``Status`` body (and
  ``Retry-After`` when set), never forwarded;
- ``delay``: wait, then forward (a slow apiserver);
- ``hang``: hold the request without forwarding it, then close without an answer (a timeout);
- ``drop``: close the connection at once without an answer (a reset);
- ``lose_response``: forward it, let the apiserver act, then close without passing the answer
  on (the write happened, the client cannot know).

A rule matches a method and a path (regular expressions, ``re.search``), applies to the first
``first`` matching requests or to each with ``probability``, and leaves watch requests alone
unless told otherwise. :meth:`FaultProxy.down` stops listening and cuts every open connection
(the apiserver unreachable) until :meth:`FaultProxy.up`. The proxy runs its own event loop in
a thread, so blocking test code does not stall it; rule changes are thread-safe.

Each response carries ``Connection: close``: one request per connection keeps the proxy a
byte pipe for streamed (watch) answers.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
Action = Literal["status", "delay", "hang", "drop", "lose_response"]
REASONS = {
    409: ("Conflict", "Conflict"),
    429: ("Too Many Requests", "TooManyRequests"),
    500: ("Internal Server Error", "InternalError"),
    502: ("Bad Gateway", "InternalError"),
    503: ("Service Unavailable", "ServiceUnavailable"),
    504: ("Gateway Timeout", "Timeout"),
}
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}


@dataclass
class Rule:
    """Which requests fail, and how (see the module docstring)."""

    action: Action
    method: str = "."
    path: str = "."
    status: int = 500
    delay_s: float = 0.0
    first: int | None = None
    probability: float = 1.0
    retry_after_s: float | None = None
    watches: bool = False
    name: str = ""
    matched: int = 0  # requests it applied to

    def label(self) -> str:
        return self.name or (f"status:{self.status}" if self.action == "status" else self.action)

    def wants(self, method: str, path: str, rng: random.Random) -> bool:
        if not self.watches and _is_watch(path):
            return False
        if not (re.search(self.method, method) and re.search(self.path, path)):
            return False
        if self.first is not None and self.matched >= self.first:
            return False
        return self.probability >= 1.0 or rng.random() < self.probability


@dataclass(frozen=True)
class Logged:
    """One request as the proxy saw it."""

    at: float  # time.time() when it arrived
    method: str
    path: str
    fault: str | None  # the rule's label, when one applied
    status: int | None  # what the client was answered; None: no answer
    forwarded: bool  # whether it reached the apiserver


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def path(self) -> str:
        return self.target


def _is_watch(path: str) -> bool:
    query = urlsplit(path).query
    return bool(re.search(r"(^|&)watch=(true|1)", query))


def status_body(code: int, message: str) -> bytes:
    _, reason = REASONS.get(code, ("Error", "Unknown"))
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


@dataclass
class FaultProxy:
    """See the module docstring. ``upstream_ssl`` trusts the apiserver and presents the
    identity the proxy uses there."""

    upstream_host: str
    upstream_port: int
    upstream_ssl: ssl.SSLContext
    port: int = 0
    seed: int = 0
    rules: list[Rule] = field(default_factory=list)
    log: list[Logged] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    # --- lifecycle (called from the test's thread) --------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        self.up()
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self.down()
        self._run(self._cancel_handlers())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = None

    def up(self) -> None:
        """Listen (again, on the same port)."""
        self._run(self._listen())

    def down(self) -> None:
        """Stop listening and cut every open connection: the apiserver is unreachable."""
        self._run(self._close_all())

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- rules (thread-safe) -------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self.rules:
                self.rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def requests(self, method: str = ".", path: str = ".") -> list[Logged]:
        with self._lock:
            return [r for r in self.log if re.search(method, r.method) and re.search(path, r.path)]

    def _pick(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.wants(method, path, self._rng):
                    rule.matched += 1
                    self.injected[rule.label()] += 1
                    return rule
        return None

    def _record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    # --- the event loop side -------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "the proxy is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _cancel_handlers(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            request = await _read_request(reader)
            if request is not None:
                await self._handle(request, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # the proxy is stopping: end quietly
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def _handle(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        arrived = time.time()
        rule = self._pick(request.method, request.path)
        label = rule.label() if rule else None

        def record(status: int | None, forwarded: bool) -> None:
            self._record(Logged(arrived, request.method, request.path, label, status, forwarded))

        if rule is not None and rule.action == "status":
            extra = (
                f"Retry-After: {rule.retry_after_s:g}\r\n" if rule.retry_after_s is not None else ""
            )
            body = status_body(rule.status, f"injected by the fault proxy ({label})")
            phrase = REASONS.get(rule.status, ("Error", ""))[0]
            writer.write(
                f"HTTP/1.1 {rule.status} {phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            record(rule.status, False)
            return
        if rule is not None and rule.action == "drop":
            record(None, False)
            return
        if rule is not None and rule.action == "hang":
            record(None, False)
            await asyncio.sleep(rule.delay_s)
            return
        if rule is not None and rule.action == "delay":
            await asyncio.sleep(rule.delay_s)
        lose = rule is not None and rule.action == "lose_response"
        await self._forward(request, writer, lose=lose, record=record)

    async def _forward(
        self,
        request: _Request,
        writer: asyncio.StreamWriter,
        *,
        lose: bool,
        record: Callable[[int | None, bool], None],
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host,
                self.upstream_port,
                ssl=self.upstream_ssl,
                server_hostname=self.upstream_host,
            )
        except OSError:
            record(502, False)
            body = status_body(502, "fault proxy: apiserver unreachable")
            writer.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            return
        try:
            headers = [(k, v) for k, v in request.headers if k.lower() not in HOP_HEADERS]
            headers = [(k, v) for k, v in headers if k.lower() not in ("host", "content-length")]
            head = [f"{request.method} {request.target} HTTP/1.1"]
            head += [f"{k}: {v}" for k, v in headers]
            head += [
                f"Host: {self.upstream_host}:{self.upstream_port}",
                f"Content-Length: {len(request.body)}",
                "Connection: close",
            ]
            up_writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + request.body)
            await up_writer.drain()
            response_head = await up_reader.readuntil(b"\r\n\r\n")
            status = int(response_head.split(b" ", 2)[1])
            if lose:  # the apiserver has answered, so it acted; the client never hears
                record(None, True)
                return
            record(status, True)
            writer.write(_close_after(response_head))
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.transport.abort()


def _close_after(head: bytes) -> bytes:
    """The response head with ``Connection: close`` instead of any keep-alive."""
    lines = head.decode("latin-1").split("\r\n")
    kept = [line for line in lines[1:] if line and not line.lower().startswith("connection:")]
    return ("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    lowered = {k.lower(): v for k, v in headers}
    body = b""
    if "chunked" in lowered.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(data[:-2])
        body = b"".join(parts)
    elif length := int(lowered.get("content-length", "0") or 0):
        body = await reader.readexactly(length)
    return _Request(method, target, version, headers, body)


def upstream_context(ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS to the apiserver: trust its CA, present the given client certificate."""
    context = ssl.create_default_context(cafile=ca_file)
    context.load_cert_chain(cert_file, key_file)
    return context


def proxy_kubeconfig(url: str) -> dict[str, Any]:
    """A kubeconfig (JSON is YAML) that sends a client through the proxy, without credentials."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fault-proxy", "cluster": {"server": url}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [
            {"name": "fault-proxy", "context": {"cluster": "fault-proxy", "user": "anonymous"}}
        ],
        "current-context": "fault-proxy",
    }
