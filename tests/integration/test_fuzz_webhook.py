"""Generated requests sent to the real admission webhook server over TLS (issue 29).

The server is :class:`~fracpilot_actuator.webhook.WebhookServer` in a process of its own
(tests/support/webhook_process.py: a 64 KiB body limit, a 2 s body deadline, 3 s idle), so a
crash is a process that exits and its memory is read from ``/proc``. Each input is one request
on a new TLS connection, eight at a time, of one kind:

- ``review``: ``POST /mutate`` with an AdmissionReview of a pod of the targeted Deployment,
  valid or broken one way (tests/support/fuzzing.py: random bytes, truncated, wrong types,
  NaN, huge, deep, out of range, any JSON), as it is or gzip/deflate encoded, or said to be
  encoded and not -> 200 allowed, or 400 with the reason;
- ``oversized``: a body over the limit, by Content-Length, chunked, declared but not sent, or
  gzip that inflates past it -> 413 (a declared length the parser refuses: 400);
- ``slow``: the review sent in pieces with pauses: done within the deadline -> 200; byte by
  byte past it -> 408, sent as soon as the deadline passes;
- ``content_type``: a review that is not ``application/json`` -> 415 (400: a header the parser
  refuses);
- ``method_path``: other methods and paths -> 200 (a probe), 404, 405 or 400;
- ``raw``: random bytes, or a valid request with bytes replaced, as the request head -> 400,
  or whatever the request turned out to be.

Every input gets a status line; a 4xx says why in its body; no 5xx; a 200 from /mutate is an
allowing AdmissionReview for the request's uid. Between batches /healthz answers, the process
is alive; at the end its resident memory has grown by less than a bound, and its peak (a
gzip body inflating to 60 MiB is never held) stayed under another. ``make test``
runs the profile's 300 inputs, ``make fuzz`` (FRACPILOT_FUZZ_LONG=1) 10,000. A client that
sends its request head slowly is cut off by the idle deadline (its own test, below).
"""

from __future__ import annotations

import base64
import collections
import functools
import http.client
import io
import itertools
import json
import select
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from fracpilot_actuator.admission.certificates import issue_serving_bundle
from fracpilot_libs.server_process import ServerProcess, free_port, port_open
from support.admission_reviews import chat_pod_review
from support.fuzzing import draw, examples_per_subject, junk_json

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 3.0
HOST = "localhost"  # the certificate's name; the server listens on 127.0.0.1
# Resident memory the server may gain between the warm-up and the end of the run, and its peak
# above the warm-up (a gzip body inflating to 60 MiB must not be held whole).
# (10,000 inputs: 61 MiB after the warm-up, 72 MiB at the end and at the peak.)
RSS_GROWTH_BOUND = 24 * 1024 * 1024
RSS_PEAK_BOUND = 40 * 1024 * 1024
WARM_UP = 50
BATCH = 200
CLIENTS = 8


# --- the server -----------------------------------------------------------------------------------


@dataclass
class Served:
    process: ServerProcess
    port: int
    context: ssl.SSLContext

    def rss(self) -> tuple[int, int]:
        """(resident, peak resident) bytes, from /proc."""
        assert self.process.proc is not None
        fields = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{self.process.proc.pid}/status").read_text().splitlines()
        )
        return (
            int(fields["VmRSS"].split()[0]) * 1024,
            int(fields["VmHWM"].split()[0]) * 1024,
        )

    def connect(self, timeout: float = 10.0) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.context.wrap_socket(raw, server_hostname=HOST)

    def healthz(self) -> int:
        with self.connect() as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            response = http.client.HTTPResponse(sock, method="GET")  # type: ignore[arg-type]
            response.begin()
            response.read()
            return response.status


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("webhook-fuzz")
    bundle = issue_serving_bundle("fracpilot-fuzz-ca", [HOST], datetime.now(UTC), timedelta(days=1))
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(bundle.tls_crt)
    key.write_bytes(bundle.tls_key)
    port = free_port()
    program = Path(__file__).parents[1] / "support" / "webhook_process.py"
    process = ServerProcess("webhook", directory / "webhook.log")
    process.start(
        [
            sys.executable,
            str(program),
            f"--port={port}",
            f"--cert={cert}",
            f"--key={key}",
            f"--max-body-bytes={MAX_BODY}",
            f"--body-timeout-s={BODY_TIMEOUT_S}",
            f"--idle-timeout-s={IDLE_TIMEOUT_S}",
        ],
        ready=lambda: port_open(port),
        timeout=30,
    )
    context = ssl.create_default_context(cadata=bundle.ca_crt.decode())
    try:
        yield Served(process, port, context)
    finally:
        process.stop()


# --- the inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One request: its head, its body in pieces (a pause after each but the last), and the
    statuses that are a right answer."""

    kind: str
    head: bytes
    pieces: tuple[bytes, ...]
    pause_s: float
    expect: frozenset[int]
    uid: str | None = None  # a 200 from /mutate must answer this review

    def __repr__(self) -> str:  # a failure shows what was sent, shortened
        body = b"".join(self.pieces)
        return f"Probe({self.kind}, head={self.head[:300]!r}, body[{len(body)}]={body[:200]!r})"


REVIEW = json.dumps(chat_pod_review("fuzz-uid")).encode()  # Deployment chat has a target


def head(
    method: str = "POST",
    path: str = "/mutate",
    headers: dict[str, str] | None = None,
    length: int | None = None,
) -> bytes:
    fields = {"Host": HOST, "Content-Type": "application/json", **(headers or {})}
    if length is not None:
        fields["Content-Length"] = str(length)
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items() if v)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def uid_of(body: bytes) -> str | None:
    """The request uid a server that accepted ``body`` must answer with (None: no such)."""
    try:
        uid = json.loads(body)["request"]["uid"]
    except Exception:
        return None
    return uid if isinstance(uid, str) else None


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def review_probe(body: bytes, encoding: str = "") -> Probe:
    """``body`` (the review, or junk) sent as it is or in a Content-Encoding (gzip, deflate:
    compressed so; any other: as it is)."""
    sent = body
    if encoding in ("gzip", "deflate"):
        sent = zlib.compress(body, wbits=31 if encoding == "gzip" else 15)
    return Probe(
        "review",
        head(headers={"Content-Encoding": encoding}, length=len(sent)),
        (sent,),
        0.0,
        frozenset({200, 400}),
        # an encoding aiohttp does not know is read as identity; br and zstd it cannot read
        None if encoding in ("br", "zstd") else uid_of(body),
    )


BODIES = st.one_of(st.just(REVIEW), junk_json(REVIEW, MAX_BODY))
ENCODINGS = st.one_of(
    st.just(""), st.sampled_from(["gzip", "deflate", "identity", "br", "zstd", "x-bogus"])
)
reviews = st.one_of(
    BODIES.map(review_probe),
    # encoded, or said to be and not: refused as unreadable (never a 500)
    st.tuples(BODIES, ENCODINGS, st.booleans()).map(
        lambda p: review_probe(p[0], p[1]) if p[2] else garbled(review_probe(p[0], p[1]))
    ),
)


def garbled(probe: Probe) -> Probe:
    """The probe's body with its first bytes replaced (a gzip header, a zlib one, JSON's
    opening brace: each broken)."""
    body = b"".join(probe.pieces)
    return Probe(probe.kind, probe.head, (b"\xff\x00" + body[2:],), 0.0, probe.expect, None)


@functools.cache
def gzipped_spaces(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip format
    block = b" " * (1 << 20)
    out = [
        packer.compress(block[: min(len(block), size - done)])
        for done in range(0, size, len(block))
    ]
    return b"".join(out) + packer.flush()


def inflating(size: int) -> Probe:
    """gzip that inflates past the limit: a small body (under it), ``size`` bytes once read."""
    packed = gzipped_spaces(size)
    return Probe(
        "oversized",
        head(headers={"Content-Encoding": "gzip"}, length=len(packed)),
        (packed,),
        0,
        frozenset({413}),
    )


TOO_BIG = st.integers(min_value=MAX_BODY + 1, max_value=4 * MAX_BODY)
oversized = st.one_of(
    TOO_BIG.map(lambda n: Probe("oversized", head(length=n), (b" " * n,), 0, frozenset({413}))),
    st.tuples(TOO_BIG, st.integers(min_value=1, max_value=MAX_BODY)).map(
        lambda p: Probe(
            "oversized",
            head(headers={"Transfer-Encoding": "chunked"}),
            (chunked(b"[" + b"0," * (p[0] // 2) + b"0]", p[1]),),
            0,
            frozenset({413}),
        )
    ),
    # declared, not sent: refused on the header alone (too large a number: by the parser)
    st.integers(min_value=MAX_BODY + 1, max_value=10**30).map(
        lambda n: Probe("oversized", head(length=n), (REVIEW,), 0, frozenset({400, 413}))
    ),
    # gzip bombs: up to 60 MiB from under 64 KiB
    st.sampled_from([MAX_BODY + 1, 1 << 20, 16 << 20, 60 << 20]).map(inflating),
)

slow = st.one_of(
    # within the deadline: a few pieces, short pauses (at most 0.14 s in all)
    st.tuples(st.integers(min_value=2, max_value=8), st.floats(0.001, 0.02)).map(
        lambda p: Probe(
            "slow",
            head(length=len(REVIEW)),
            split(REVIEW, p[0]),
            p[1],
            frozenset({200}),
            "fuzz-uid",
        )
    ),
    # byte by byte, past it
    st.floats(min_value=0.05, max_value=0.2).map(
        lambda pause: Probe(
            "slow",
            head(length=len(REVIEW)),
            split(REVIEW, len(REVIEW)),
            pause,
            frozenset({408}),
        )
    ),
)


def split(body: bytes, pieces: int) -> tuple[bytes, ...]:
    size = -(-len(body) // pieces)
    return tuple(body[i : i + size] for i in range(0, len(body), size))


HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=60
)
content_types = st.one_of(
    st.sampled_from(
        [
            "",  # none at all
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/yaml",
            "application/jsonx",
            "application/json-patch+json",
            "multipart/form-data; boundary=x",
            "*/*",
            "application",
            "json",
            ";",
            "application/octet-stream",
        ]
    ),
    HEADER_TEXT,
).filter(lambda t: t.split(";")[0].strip().lower() != "application/json")
wrong_types = content_types.map(
    lambda t: Probe(
        "content_type",
        head(headers={"Content-Type": t}, length=len(REVIEW)),
        (REVIEW,),
        0,
        frozenset({400, 415}),
    )
)

METHODS = st.one_of(
    st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST", "TRACE"]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
)
PATHS = st.one_of(
    st.sampled_from(
        [
            "/mutate",
            "/mutate/",
            "//mutate",
            "/MUTATE",
            "/mutate/../healthz",
            "/healthz",
            "/livez",
            "/readyz",
            "/metrics",
            "/",
            "*",
            "/%2e%2e/mutate",
            "/mutate?x=" + "y" * 5000,
            "/" + "a" * 10_000,
        ]
    ),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(
        lambda p: "/" + p
    ),
)
methods_and_paths = st.tuples(METHODS, PATHS, st.booleans()).map(
    lambda p: Probe(
        "method_path",
        head(p[0], p[1], length=len(REVIEW) if p[2] else None),
        (REVIEW,) if p[2] else (),
        0,
        frozenset({200, 400, 404, 405, 415}),
        "fuzz-uid" if p[2] else None,  # POST /mutate with the review: answered for it
    )
)


def flipped(request: bytes, changes: list[tuple[int, int]]) -> bytes:
    data = bytearray(request)
    for at, value in changes:
        data[at % len(data)] = value
    return bytes(data)


VALID_REQUEST = head(length=len(REVIEW))[:-2]  # without the blank line
raw = (
    st.one_of(
        st.binary(min_size=0, max_size=2048),
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8).map(
            lambda c: flipped(VALID_REQUEST, c)
        ),
    )
    .filter(lambda data: data.lstrip(b"\r\n") != b"")
    .map(
        lambda data: Probe(
            "raw",
            # one whole head, so it is parsed; empty lines before a request are skipped (RFC 9112)
            data.lstrip(b"\r\n").replace(b"\r\n\r\n", b"\r\n") + b"\r\n\r\n",
            (),
            0,
            frozenset({200, 400, 404, 405, 408, 413, 415}),
        )
    )
)

KINDS = {
    "review": reviews,
    "oversized": oversized,
    "slow": slow,
    "content_type": wrong_types,
    "method_path": methods_and_paths,
    "raw": raw,
}
PROBES = st.sampled_from(sorted(KINDS)).flatmap(lambda kind: KINDS[kind])  # kinds equally often


# --- sending --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    seconds: float


def arrived(sock: ssl.SSLSocket, wait_s: float) -> bytes | None:
    """What the server sent within ``wait_s``: data, b"" when it closed, None for nothing.

    A readable socket may carry only TLS 1.3 session tickets (sent after the handshake), which
    a read takes in without returning data."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable and not sock.pending():
        return None
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except (ssl.SSLWantReadError, BlockingIOError):
        return None
    finally:
        sock.setblocking(True)


class _Replayed(io.RawIOBase):
    """The socket's stream, starting with the bytes read from it already."""

    def __init__(self, sock: ssl.SSLSocket, first: bytes) -> None:
        self._sock, self._first = sock, first

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            n = min(len(buffer), len(self._first))
            buffer[:n] = self._first[:n]
            self._first = self._first[n:]
            return n
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str) -> io.BufferedReader:  # what HTTPResponse asks a socket for
        return io.BufferedReader(self)


def send(served: Served, probe: Probe) -> Answer:
    """Send the probe on a new connection and read the answer (at once when it comes early)."""
    started = time.monotonic()
    first = b""
    with served.connect(timeout=30) as sock:
        try:
            sock.sendall(probe.head)
            for i, piece in enumerate(probe.pieces):
                sock.sendall(piece)
                if probe.pause_s and i < len(probe.pieces) - 1:
                    early = arrived(sock, probe.pause_s)
                    if early is not None:
                        first = early
                        break  # answered (or closed) before the body was all sent
        except OSError:
            pass  # the server answered and closed: read what it said
        method = probe.head.split(b" ", 1)[0].decode("latin-1")
        response = http.client.HTTPResponse(_Replayed(sock, first), method=method)  # type: ignore[arg-type]
        response.begin()
        body = response.read()
    return Answer(response.status, body, time.monotonic() - started)


def check(probe: Probe, answer: Answer) -> None:
    assert answer.status in probe.expect, (probe, answer)
    if answer.status >= 400 and not probe.head.startswith(b"HEAD "):
        assert answer.body.strip(), ("a refusal without a reason", probe, answer)
    if probe.kind == "slow" and answer.status == 408:
        # cut off when the deadline passed, not when the client was done
        assert answer.seconds < BODY_TIMEOUT_S + 3.0, (probe, answer)
    if answer.status == 200 and probe.head.startswith(b"POST /mutate "):
        document = json.loads(answer.body)
        assert document["kind"] == "AdmissionReview"
        assert document["response"]["allowed"] is True
        assert document["response"]["uid"] == probe.uid, (probe, answer)
        if "patch" in document["response"]:
            json.loads(base64.b64decode(document["response"]["patch"]))


def test_every_generated_request_is_answered_or_refused_with_a_reason(served: Served) -> None:
    n = examples_per_subject()
    probes = draw(PROBES, n)
    assert len(probes) == n
    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    lock = threading.Lock()

    def one(probe: Probe) -> None:
        try:
            answer = send(served, probe)
        except OSError as exc:  # RemoteDisconnected too: closed without an answer
            raise AssertionError(f"no answer to {probe!r}: {exc!r}") from exc
        check(probe, answer)
        with lock:
            statuses[(probe.kind, answer.status)] += 1

    warm_rss = 0
    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        # a warm-up batch, after which memory is measured, then batches of BATCH
        for first, last in itertools.pairwise(
            [0, *range(WARM_UP, len(probes), BATCH), len(probes)]
        ):
            list(pool.map(one, probes[first:last]))
            served.process.check_alive()
            assert served.healthz() == 200
            if first == 0:
                warm_rss = served.rss()[0]
    rss, peak = served.rss()
    print(
        f"\nwebhook fuzz: {len(probes)} requests in {time.monotonic() - started:.0f} s; "
        f"RSS after the first batch {warm_rss / 2**20:.0f} MiB, at the end "
        f"{rss / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB\n"
        + "\n".join(
            f"  {kind} {status}: {count}" for (kind, status), count in sorted(statuses.items())
        )
    )
    kinds = {kind for kind, _ in statuses}
    assert kinds == set(KINDS)
    assert rss - warm_rss < RSS_GROWTH_BOUND, (warm_rss, rss)
    assert peak - warm_rss < RSS_PEAK_BOUND, (warm_rss, peak)  # no body was held whole


def test_a_slow_request_head_is_cut_off_while_others_are_served(served: Served) -> None:
    """Slowloris: 20 connections each sending a request head a byte every 0.2 s. The server
    closes each within its idle deadline, and answers /healthz meanwhile."""
    request = head("GET", "/healthz")

    def trickle(_: int) -> float:
        started = time.monotonic()
        with served.connect(timeout=30) as sock:
            try:
                for byte in request[:-4]:  # never the blank line that ends the head
                    sock.sendall(bytes([byte]))
                    if arrived(sock, 0.2) == b"":
                        break  # closed by the server
            except OSError:
                pass  # reset by the server
        return time.monotonic() - started

    with ThreadPoolExecutor(20) as pool:
        tricklers = [pool.submit(trickle, i) for i in range(20)]
        time.sleep(1.0)
        assert served.healthz() == 200
        held = [t.result() for t in tricklers]
    assert all(s < IDLE_TIMEOUT_S + 2.0 for s in held), held
    served.process.check_alive()
