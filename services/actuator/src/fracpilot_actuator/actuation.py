"""What a cluster backend does with a decision: the :class:`ClusterBackend` protocol and its
answer, :class:`Actuation`.

A backend turns one decision into an :class:`Actuation` (the plan it chose, what happened,
where the pod was and goes); the service claims the decision, calls the backend and
publishes the ``ActuationResult``. A backend whose action finishes later (a scale-up waits
for capacity, a recreate waits for its replacement to be bound) answers
:attr:`~fracpilot_libs.contracts.Outcome.PENDING` first and reports the verified end through
the ``report`` callback it was given. A FAILED answer says whether it is permanent
(:attr:`Actuation.refused`): the decision is then dead-lettered, never tried again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind


@dataclass(frozen=True)
class Actuation:
    plan: PlanKind
    outcome: Outcome
    detail: str
    fraction_before: float | None = None
    fraction_after: float | None = None  # the fraction the pods hold once this is done
    node_before: str = ""
    node_after: str = ""
    gpu_before: str = ""
    gpu_after: str = ""
    error: str | None = None
    enforced_fraction: float | None = None  # the container's memory limit after; None: none
    held_back: str = ""
    """Why a decision was not carried out, for the metric: policy, not_opted_in, off, dry_run
    (see :attr:`fracpilot_actuator.opt_in.Selected.held_back`), multi_device, queue_limit
    (:mod:`fracpilot_actuator.kube.kai`, :mod:`fracpilot_actuator.kube.queues`); "" otherwise."""
    stage: str = ""
    """Which later result of the decision this is ("verified", "correction-1", ...), so each
    is its own message; "" for the first."""
    refused: str = ""
    """A FAILED actuation that every delivery of the decision would meet again: the API
    server's status that refused it for good ("403", "422", ...:
    :func:`fracpilot_actuator.kube.errors.refused_for_good`). The handler dead-letters such a
    decision after its FAILED result (a later result, reported after the decision was
    acknowledged, is only published). "" for any other outcome, and for a failure another try
    may not meet (no answer, 5xx, a second 409, a PodDisruptionBudget's 429, a replacement
    not verified in time)."""

    @property
    def permanent(self) -> bool:
        """Failed in a way no later delivery of the decision changes."""
        return self.outcome is Outcome.FAILED and bool(self.refused)


Report = Callable[[FractionDecision, Actuation], Awaitable[None]]
"""Publishes an actuation that finished after ``actuate`` returned (a scale-up's eviction)."""


class ClusterBackend(Protocol):
    """Where decisions are carried out: the simulated cluster or a Kubernetes cluster."""

    async def start(self, now: datetime) -> None: ...

    async def resume(self, now: datetime) -> None:
        """Take up again what waits (a recreate's verification, a scale-up) as a previous
        leader left it; called when this replica starts leading after a standby."""

    async def actuate(
        self, decision: FractionDecision, *, dry_run: str, now: datetime, resumed: bool = False
    ) -> Actuation:
        """Plan and act, unless the opt-in rule (:mod:`fracpilot_actuator.opt_in`, the policy's
        mode included) or ``dry_run`` (why: "dry-run") says to change nothing.

        ``resumed``: an earlier attempt at this decision started and never finished (the
        actuator stopped in the middle): finish what is left, never repeat what was done."""

    async def reconcile(self, now: datetime) -> None:
        """Carry on with actions that wait for something (capacity); called periodically."""

    def close(self) -> None:
        """Stop what runs in the background (watches); nothing to do for some backends."""
