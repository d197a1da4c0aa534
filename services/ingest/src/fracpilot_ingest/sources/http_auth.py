"""How ingest authenticates to Prometheus: a bearer token read from a file, re-read when the
file changes (a Kubernetes projected service-account token or a mounted Secret is rotated by
replacing the file), and the TLS and header settings made into a requests session.

The token is never logged.
"""

from __future__ import annotations

import os
import threading

import requests
from requests.auth import AuthBase

from fracpilot_ingest.settings import PrometheusSettings


class BearerTokenFile(AuthBase):
    """``Authorization: Bearer <the file's content>``, read again whenever the file's
    inode, modification time or size changes (checked on every request: one ``stat``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._token = ""

    def token(self) -> str:
        info = os.stat(self.path)
        seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if seen != self._seen:
                with open(self.path, encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._seen = seen
            return self._token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        return request


def prometheus_session(settings: PrometheusSettings) -> tuple[requests.Session, AuthBase | None]:
    """A session that verifies the server's certificate (against ``ca_file`` when given, the
    system's CAs otherwise; not at all only with ``verify_tls=false``) and sends the extra
    headers; and the bearer-token auth, when a token file is set."""
    session = requests.Session()
    session.verify = settings.ca_file or settings.verify_tls
    session.headers.update(settings.headers)
    auth = BearerTokenFile(settings.bearer_token_file) if settings.bearer_token_file else None
    return session, auth
