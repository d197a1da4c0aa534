"""A deliberately broken metrics endpoint for the fuzz tests: it answers each GET with the next
of the bodies it was given (garbage, partial or huge exposition text), in turn."""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from support.serving_thread import QuietHandler, ServingThread


class JunkHttpServer:
    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies or [b""]
        self.served = 0
        owner = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = owner.bodies[owner.served % len(owner.bodies)]
                owner.served += 1
                self.answer(200, body, "text/plain; version=0.0.4")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._serving: ServingThread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/metrics"

    def __enter__(self) -> JunkHttpServer:
        self._serving = ServingThread(self._server, "junk-http")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._serving is not None:
            self._serving.close()
