"""How fracpilot reaches a Prometheus: the address, TLS, a bearer token file and extra headers.

One settings shape for ingest (``FRACPILOT_PROMETHEUS_*``) and ``fracpilot recommend`` (its
options), and one token reader. Each caller makes its own HTTP client from them (ingest a
requests session, the CLI the standard library's), so this module imports no HTTP library.
The token is never logged.
"""

from __future__ import annotations

import os
import threading

from pydantic import BaseModel, Field


class PrometheusAccess(BaseModel):
    """Where Prometheus is, how to reach it safely, and which series to ask it for."""

    url: str = "http://127.0.0.1:9090"
    matchers: str = Field(
        default="", description='extra PromQL label matchers, e.g. job="dcgm-exporter"'
    )
    verify_tls: bool = Field(
        default=True, description="verify an https server's certificate (false: do not)"
    )
    ca_file: str | None = Field(
        default=None, description="CA bundle to verify the server with (default: the system's)"
    )
    bearer_token_file: str | None = Field(
        default=None, description="file holding a bearer token; re-read when it changes"
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description='extra request headers as JSON, e.g. {"X-Scope-OrgID": "team-a"}',
    )


class BearerTokenFile:
    """The token in a file, read again whenever the file's inode, modification time or size
    changes (a Kubernetes projected service-account token or a mounted Secret is rotated by
    replacing the file); one ``stat`` per call."""

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

    def header(self) -> str:
        """The ``Authorization`` header's value."""
        return f"Bearer {self.token()}"
