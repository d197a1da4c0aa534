"""An in-process server (an ``http.server`` one, say) answering from a daemon thread, for the
test servers that run inside the test process: :meth:`ServingThread.close` stops it and frees
its port; the test servers subclass it. :class:`QuietHandler` is their request handler's base."""

from __future__ import annotations

import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Self


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (pytest shows stderr) and answers in one call."""

    def answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class ServingThread:
    """``server.serve_forever()`` in a daemon thread, from construction until :meth:`close`."""

    def __init__(
        self, server: socketserver.BaseServer, name: str, poll_interval: float = 0.5
    ) -> None:
        self.server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": poll_interval},
            name=name,
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
