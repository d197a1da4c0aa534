"""Kubernetes API failures as the actuator's own types, transient or permanent.

:mod:`fracpilot_actuator.kube.api` turns every client exception into one of these where it
enters, so the rest of the actuator asks ``isinstance(exc, TransientKubeError)`` and reads
``exc.status`` instead of probing raw client exceptions. Pure: no Kubernetes client here.

Transient or permanent is about one call (is another try worth it). Whether a *decision* that
met a refusal can ever succeed is :func:`refused_for_good`: a 4xx the server would answer
every delivery of it the same way (400/422 invalid, 403 RBAC or an admission webhook's denial,
...), so the handler dead-letters it. Not so: 404 (the object went: a fresh read plans
otherwise), 408 (timed out), 409 (a conflict: read again and judged again), 410 (gone), 429
(a PodDisruptionBudget allows no disruption now, or the server is busy), 5xx and no answer.
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


PASSING_REFUSALS = frozenset({404, 408, 409, 410, 429})
"""4xx statuses that say "not now" rather than "never" (see the module docstring)."""


def refused_for_good(status: int | None) -> bool:
    """Whether a refusal with this HTTP status would meet every later delivery of the same
    decision: a 4xx but those of :data:`PASSING_REFUSALS` (None: no answer, never)."""
    return status is not None and 400 <= status < 500 and status not in PASSING_REFUSALS
