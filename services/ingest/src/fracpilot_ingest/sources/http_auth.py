"""How ingest authenticates to Prometheus: the shared access settings and token reader
(:mod:`fracpilot_libs.prometheus_access`) made into a requests session.

The token is never logged.
"""

from __future__ import annotations

import requests
from requests.auth import AuthBase

from fracpilot_libs.prometheus_access import BearerTokenFile as TokenFile
from fracpilot_libs.prometheus_access import PrometheusAccess


class BearerTokenFile(AuthBase):
    """``Authorization: Bearer <the file's content>``, the file read again when it changes
    (checked on every request: one ``stat``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = TokenFile(path)

    def token(self) -> str:
        return self._file.token()

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = self._file.header()
        return request


def prometheus_session(settings: PrometheusAccess) -> tuple[requests.Session, AuthBase | None]:
    """A session that verifies the server's certificate (against ``ca_file`` when given, the
    system's CAs otherwise; not at all only with ``verify_tls=false``) and sends the extra
    headers; and the bearer-token auth, when a token file is set."""
    session = requests.Session()
    session.verify = settings.ca_file or settings.verify_tls
    session.headers.update(settings.headers)
    auth = BearerTokenFile(settings.bearer_token_file) if settings.bearer_token_file else None
    return session, auth
