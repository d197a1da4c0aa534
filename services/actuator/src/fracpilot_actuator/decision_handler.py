"""The actuator's decision handling: decisions into cluster changes, one at a time.

For each decision it claims the decision id in KV before acting (so a redelivered or
republished decision is applied at most once), hands it to the cluster backend (which plans
with the pure planner and executes the plan), and publishes an ``ActuationResult`` saying
what it did and why (PENDING first for an action verified later: the backend reports the end).
A decision the API server refuses for good (a 4xx that every delivery would meet again, e.g.
KAI's validating webhook or RBAC: the backend's answer says so, :attr:`Actuation.refused`, or
the refusal escapes it as a :class:`PermanentKubeError`) gets a FAILED result with the
server's reason, then is dead-lettered: the bus keeps it on the dead-letter stream and counts
it (``fracpilot_dead_letters_total{kind="processing"}``), and it is never delivered again. A
failure that may pass (a PodDisruptionBudget's 429, a 5xx, a second 409) is a FAILED result,
and the decision is done with.
Decisions the opt-in rule holds back (:mod:`fracpilot_actuator.opt_in`:
a workload whose namespace or pods are not labelled ``fracpilot.io/mode=auto``, or a policy in
recommend mode) and dry-run are recorded as recommendations without changing anything; the
backend applies the rule, since it is the one that reads the labels.

Backends (``FRACPILOT_BACKEND``): ``simulated`` (the demo's cluster in NATS KV) and
``kubernetes`` (KAI Scheduler and HAMi pods through the API server, with guardrails:
:mod:`fracpilot_actuator.kube.backend`). A scale-up that waits for capacity is carried on by
a periodic check, which reports its end separately. :mod:`fracpilot_actuator.app` wires it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NoReturn

from fracpilot_actuator.actuation import Actuation, ClusterBackend
from fracpilot_actuator.election.elector import LeaderElector
from fracpilot_actuator.kube.errors import PermanentKubeError
from fracpilot_actuator.metrics import ActuatorMetrics
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_libs.contracts import ActuationResult, FractionDecision, Outcome, PlanKind, utcnow
from fracpilot_libs.deadlines import event_set
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.client_types import Msg
from fracpilot_libs.nats.consumer import PermanentError
from fracpilot_libs.nats.kv import KvBucket, RevisionMismatchError

log = logging.getLogger(__name__)


class NotLeaderError(RuntimeError):
    """Raised for a decision fetched just before the lease was lost: it is redelivered."""


class DecisionHandler:
    """Claims, actuates and reports each decision; the reconcile loop for waiting actions.

    ``elector``: None when every replica acts (no leader election)."""

    def __init__(
        self,
        settings: ActuatorSettings,
        bus: Bus,
        claims: KvBucket,
        backend: ClusterBackend,
        metrics: ActuatorMetrics,
        elector: LeaderElector | None = None,
        on_result: Callable[[FractionDecision, Actuation], None] | None = None,
    ) -> None:
        """``on_result``: told of every result reported (the FractionRecommendation writer);
        must not block."""
        self.settings = settings
        self.bus = bus
        self.claims = claims
        self.backend = backend
        self.metrics = metrics
        self.elector = elector
        self.on_result = on_result
        self.lock = asyncio.Lock()
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        """End the reconcile loop once the round in hand is done. Cancelling its task alone
        may not end it: nats-py awaits every reply (KV writes, JetStream publishes) through
        ``asyncio.wait_for``, which on Python 3.11 swallows a cancel that comes with the reply
        (nats-py 2.16.0, nats/aio/client.py ``_request_new_style``; see
        :mod:`fracpilot_libs.deadlines`), and the loop then ran on."""
        self.stopping.set()

    async def reconcile_loop(self) -> None:
        """Carry on with actions that wait (a scale-up waiting for capacity), until
        :meth:`stop`."""
        while not await event_set(self.stopping, self.settings.capacity.poll_s):
            try:
                async with self.lock:
                    await self.backend.reconcile(utcnow())
            except Exception:
                log.exception("reconcile failed")

    async def on_decision(self, decision: FractionDecision, _msg: Msg) -> None:
        async with self.lock:  # one decision at a time
            if self.elector is not None and not self.elector.is_leader:
                raise NotLeaderError("not the leader any more: the new leader will act")
            await self._handle(decision)

    async def _claim(self, decision: FractionDecision) -> str | None:
        """Record the decision before acting; returns the earlier record if there is one."""
        key = f"decision.{decision.decision_id}"
        try:
            await self.claims.create(key, b"started")
            return None
        except RevisionMismatchError:
            entry = await self.claims.get(key)
            if entry is None:  # deleted meanwhile: failed, the decision is delivered again
                raise LookupError(f"claim {key} exists, then not") from None
            return entry.value.decode()

    async def _handle(self, decision: FractionDecision) -> None:
        earlier = await self._claim(decision)
        if earlier is not None and earlier.startswith("done"):
            log.info(
                "decision already handled",
                extra={"decision_id": decision.decision_id, "record": earlier},
            )
            self.metrics.actions.labels("none", "duplicate").inc()
            return
        resumed = earlier is not None  # "started": an attempt stopped before it finished
        if resumed:
            log.warning(
                "resuming a decision whose earlier attempt did not finish",
                extra={"decision_id": decision.decision_id, "workload": decision.workload.key},
            )
            self.metrics.resumed.inc()
        why = "dry-run" if self.settings.dry_run else ""
        try:
            actuation = await self.backend.actuate(
                decision, dry_run=why, now=utcnow(), resumed=resumed
            )
        except PermanentKubeError as exc:
            # A refusal the backend had no answer for: another delivery meets it again.
            error = f"the API server refused ({exc.status}): {exc.message or exc}"
            failed = Actuation(
                plan=PlanKind.NONE,
                outcome=Outcome.FAILED,
                detail=error,
                error=error,
                refused=str(exc.status or ""),
            )
            await self._dead_end(decision, failed, exc)
        if actuation.permanent:
            await self._dead_end(decision, actuation)
        await self.claims.put(
            f"decision.{decision.decision_id}", f"done:{actuation.outcome}".encode()
        )
        await self.report(decision, actuation)

    async def _dead_end(
        self, decision: FractionDecision, failed: Actuation, cause: Exception | None = None
    ) -> NoReturn:
        """A decision no delivery can carry out: its FAILED result (with the server's reason)
        first, then the bus dead-letters it and counts it. The claim says done first, so a
        copy published again is not acted on either."""
        await self.claims.put(f"decision.{decision.decision_id}", b"done:failed")
        await self.report(decision, failed)
        raise PermanentError(failed.error or failed.detail) from cause

    async def report(
        self, decision: FractionDecision, actuation: Actuation, stage: str = ""
    ) -> None:
        """Publish the result; a later stage of the same decision (``stage``) is its own message."""
        a = actuation
        result = ActuationResult(
            decision_id=decision.decision_id,
            workload=decision.workload,
            plan=a.plan,
            outcome=a.outcome,
            fraction_before=a.fraction_before,
            fraction_after=a.fraction_after,
            node_before=a.node_before,
            node_after=a.node_after,
            gpu_before=a.gpu_before,
            gpu_after=a.gpu_after,
            enforced_fraction=a.enforced_fraction,
            detail=a.detail[:4000],
            error=a.error[:4000] if a.error else None,
            finished_at=utcnow(),
        )
        msg_id = f"{decision.decision_id}:result" + (f":{stage}" if stage else "")
        await self.bus.publish(subjects.actuation_subject(decision.workload), result, msg_id)
        self.metrics.actions.labels(a.plan.value, a.outcome.value).inc()
        if self.on_result is not None:
            self.on_result(decision, a)
        if a.held_back:
            self.metrics.held_back.labels(a.held_back).inc()
        log.info(
            "actuation",
            extra={
                "workload": decision.workload.display,
                "plan": a.plan.value,
                "outcome": a.outcome.value,
                "decision_id": decision.decision_id,
                "detail": a.detail,
                "held_back": a.held_back,
            },
        )
