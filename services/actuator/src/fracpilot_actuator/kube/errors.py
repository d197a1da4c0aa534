"""Kubernetes API failures as the actuator's own types, transient or permanent.

:mod:`fracpilot_actuator.kube.api` turns every client exception into one of these where it
enters, so the rest of the actuator asks ``isinstance(exc, TransientKubeError)`` and reads
``exc.status`` instead of probing raw client exceptions. Pure: no Kubernetes client here.
"""

from __future__ import annotations


class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP status, None when none came back.

    ``str()`` is the client's own text; ``message`` the server's message from the body."""

    def __init__(self, text: str, *, status: int | None, message: str) -> None:
        super().__init__(text)
        self.status = status
        self.message = message

    @property
    def unanswered(self) -> bool:
        """No HTTP answer (timeout, refused, reset): the call may or may not have happened."""
        return self.status is None

    @property
    def server_failed(self) -> bool:
        """No answer or a 5xx: a write may have taken effect all the same."""
        return self.status is None or self.status >= 500


class TransientKubeError(KubeError):
    """Worth another try: no answer, overloaded (429) or a server error (5xx)."""


class PermanentKubeError(KubeError):
    """The server refused for a reason another identical try does not change (4xx but 429).

    A 409 is one: a create whose object exists, or a conflict the caller resolves."""
