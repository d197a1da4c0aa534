"""The Kubernetes backend: one decision in, changes to the cluster out, never more than allowed.

For each decision it reads the cluster (:mod:`.reader`: nodes, pods, the namespace's
ReplicaSets and Jobs for owner references, the workload object, read per decision, and the
namespace's labels from :class:`~.namespaces.NamespaceLabels`), asks the pure judge
(:mod:`.judge`: opt-out, the opt-in rule, validity, the plan, the guardrails, dry-run, resume)
for a plan or a skip, and carries a plan out (:mod:`.executor`):

- the workload's target (``WorkloadTarget``, :class:`~fracpilot_actuator.stores.ports.TargetStore`)
  is recorded first, so any pod created from now on gets the new fraction from the admission
  webhook (or, with ``targets_via="template"``, from the patched pod template);
- in place (KAI), recreate (eviction) and scale up (placeholder pods) steps, in plan order;
- a result is what was verified: an in-place patch is conditional on the pod as read (its
  resourceVersion) and the pod is read back; a 409 conflict re-reads the cluster and re-judges
  once, a second one is FAILED. A recreate answers PENDING once its pods are evicted, and the
  final result comes from the replacement pods (:mod:`.verification`); a scale-up answers
  PENDING until its pods moved and their replacements are bound (:mod:`.scale_ups`, which
  :meth:`KubernetesBackend.reconcile` drives). The placeholder carries the decision, and
  each waiting recreate is saved (``pending_recreates``), so a restarted actuator, or a new
  leader, carries on where it was (:meth:`KubernetesBackend.resume`).
- every refusal of the API server (a PDB, KAI's validating webhook, RBAC) is a FAILED result
  with the server's reason; one that every delivery of the decision would meet again (a 4xx
  but 404, 408, 409, 410 and 429: :func:`~.errors.refused_for_good`) says so
  (:attr:`~fracpilot_actuator.actuation.Actuation.refused`), and the decision is
  dead-lettered. A PDB's 429, a second 409, a 5xx or no answer are FAILED, nothing more.

Crashes and faults. Before it acts, the backend records the target and, for a disruptive plan,
the disruption itself (:class:`~fracpilot_actuator.stores.ports.DisruptionHistory`, so the
disruption budget holds across restarts and leader changes). An eviction the cluster refused
(a PDB, 429 after the retries) disrupted nothing: that record is taken back, and only then, so
a crash between the two still counts it (too cautious, never too lax). A decision whose earlier
attempt stopped half-way (the service passes ``resumed``) and whose target was recorded is finished,
not re-judged: the guardrails it passed are not checked again, and only what the cluster
shows as still to do is done (evicted pods are terminating or gone, resized ones carry the new
share), so no pod is evicted twice.

After an action is done (at once, or when a scale-up finishes) the workload's ``Allocation``
goes to the :class:`~fracpilot_actuator.stores.ports.AllocationStore`, as the simulated
cluster does, so that ingest knows the fractions: one record per workload, for one of its pods (see
:mod:`.allocations`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from fracpilot_actuator.actuation import Actuation, Report
from fracpilot_actuator.guardrails import Disruption, GuardState
from fracpilot_actuator.kube.allocations import enforced_allocation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import InventoryCache
from fracpilot_actuator.kube.cluster_view import ClusterView, Guards
from fracpilot_actuator.kube.consolidation import Consolidator
from fracpilot_actuator.kube.consolidation_notices import Publish
from fracpilot_actuator.kube.enforcement import (
    NOT_ENFORCED,
    Enforcement,
    enforcement_note,
)
from fracpilot_actuator.kube.executor import InPlaceConflictError, StepExecutor, StepFailure
from fracpilot_actuator.kube.inventory import Inventory
from fracpilot_actuator.kube.judge import judge
from fracpilot_actuator.kube.judgement import ActuationPlan, Skip
from fracpilot_actuator.kube.namespaces import NamespaceLabels
from fracpilot_actuator.kube.object_values import CAPACITY_ROLE, ROLE, parse_time
from fracpilot_actuator.kube.placeholders import PendingScaleUp, pending_of
from fracpilot_actuator.kube.reader import ClusterReader
from fracpilot_actuator.kube.scale_ups import ScaleUps, pending_result
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.kube.shared_cards import SharedCards, redivide
from fracpilot_actuator.kube.verification import PendingRecreate
from fracpilot_actuator.metrics import ConsolidationMetrics
from fracpilot_actuator.stores.memory import MemoryDisruptionHistory
from fracpilot_actuator.stores.ports import (
    AllocationStore,
    ConsolidationProgress,
    DisruptionHistory,
    PendingRecreates,
    TargetStore,
    UnreadableHistoryError,
)
from fracpilot_libs.contracts import (
    FractionDecision,
    Outcome,
    PlanKind,
    WorkloadRef,
)
from fracpilot_libs.placement.planner import ResizePlan

log = logging.getLogger(__name__)


def _failed(chosen: ActuationPlan, detail: str, failure: StepFailure) -> Actuation:
    """The FAILED answer of a step that failed, saying whether it was refused for good."""
    failed = chosen.result(Outcome.FAILED, detail, str(failure))
    return replace(failed, refused=failure.refused)


class KubernetesBackend:
    def __init__(
        self,
        api: KubeApi,
        targets: TargetStore,
        settings: KubeBackendSettings,
        report: Report,
        instance: str | None = None,
        allocations: AllocationStore | None = None,
        history: DisruptionHistory | None = None,
        namespaces: NamespaceLabels | None = None,
        pending_recreates: PendingRecreates | None = None,
        consolidation_metrics: ConsolidationMetrics | None = None,
        consolidation_events: Publish | None = None,
        consolidation_progress: ConsolidationProgress | None = None,
    ) -> None:
        """``history``: where the recent disruptive actions are kept across restarts (None:
        in memory only); ``allocations``: None publishes none; ``namespaces``: the namespace
        labels the opt-in rule reads (started and stopped by whoever made it; None: no
        namespace has labels, so the default mode decides); ``pending_recreates``: where the
        recreates waiting for their replacements are kept across restarts (None: in memory
        only); ``consolidation_events``: publishes consolidation's reports and moves (None:
        none); ``consolidation_progress``: where the node or card being emptied is kept for
        the next leader (None: in memory only)."""
        self.api = api
        self.targets = targets
        self.allocations = allocations
        self.history: DisruptionHistory = history or MemoryDisruptionHistory()
        self.settings = settings
        self.report = report
        self.namespaces = namespaces
        self.instance = instance or socket.gethostname()
        self.guards = GuardState()
        self.reader = ClusterReader(api, settings)
        self.executor = StepExecutor(
            api, settings, self.instance, self.reader.fence, caching=self.reader.cache is not None
        )
        self.scale_ups = ScaleUps(self, pending_recreates)
        self.cards = SharedCards(api)  # shared isolation: co-tenants' forecasts (card_plan.py)
        self.consolidation = Consolidator(
            self, consolidation_metrics, consolidation_events, consolidation_progress
        )

    @property
    def cache(self) -> InventoryCache | None:
        """The watch-fed inventory cache; None when every decision lists."""
        return self.reader.cache

    @property
    def fresh_lists(self) -> int:
        """Decisions that listed because the cache was behind our last write."""
        return self.reader.fresh_lists

    @property
    def pending(self) -> dict[str, PendingScaleUp]:
        """The scale-ups waiting for capacity, by workload key."""
        return self.scale_ups.pending

    @property
    def recreates(self) -> dict[str, PendingRecreate]:
        """The recreates waiting for their replacements to be bound, by workload key."""
        return self.scale_ups.recreates

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self, now: datetime) -> None:
        """Start the inventory cache, then :meth:`resume`."""
        if (cache := self.reader.cache) is not None:
            cache.start()
            if not await cache.wait_synced():
                log.warning("inventory cache not synced yet: listing until it is")
        await self.resume(now)

    async def resume(self, now: datetime) -> None:
        """Take up what a previous run, or the previous leader, left: the recent disruptions,
        the recreates waiting for their replacements (as saved) and the scale-ups waiting for
        capacity (their placeholders say which). What this process held before is replaced:
        a standby that read it at its start is out of date by the time it leads."""
        await self._load_disruptions(now)
        self.pending.clear()
        self.guards = replace(self.guards, in_flight=frozenset())
        await self.scale_ups.load_recreates()
        for key in self.recreates:
            self.guards = self.guards.begin(key)
        for raw in await self.api.list_pods(label_selector=f"{ROLE}={CAPACITY_ROLE}"):
            meta = raw.get("metadata") or {}
            found = pending_of(raw)
            if found is None:
                log.warning("placeholder without a decision", extra={"pod": meta.get("name")})
                continue
            decision, pod = found
            key = decision.workload.key
            if key in self.recreates:  # kept until its recreate's replacements are bound
                continue
            created = parse_time(meta.get("creationTimestamp")) or now
            pending = self.pending.setdefault(
                key, PendingScaleUp(decision=decision, started_at=created, placeholders={})
            )
            pending.placeholders[pod] = (str(meta["namespace"]), str(meta["name"]))
            self.guards = self.guards.begin(key)
        if self.pending:
            log.info("resuming scale-ups", extra={"workloads": sorted(self.pending)})
        try:
            await self.consolidation.resume(now)
        except Exception:
            log.exception("consolidation not resumed; a marked node is found by its taint")

    def close(self) -> None:
        """Stop the cache's watches."""
        if (cache := self.reader.cache) is not None:
            cache.stop()

    async def _load_disruptions(self, now: datetime) -> None:
        try:
            recent = await self.history.load()
        except UnreadableHistoryError as exc:
            # Fail safe: with the history unknown, spend the whole budget for one window.
            log.error("disruption history unreadable: no disruption for one window", exc_info=exc)
            unknown = Disruption("unknown (history unreadable)", "", now)
            recent = (unknown,) * self.settings.guardrails.max_disruptions
        if recent is None:
            return
        self.guards = replace(self.guards, recent=recent)
        if recent:
            log.info("disruption history restored", extra={"actions": len(recent)})

    async def observe(self, workload: WorkloadRef) -> ClusterView:
        return await self.reader.observe(workload)

    # --- one decision -----------------------------------------------------------------------

    async def actuate(
        self, decision: FractionDecision, *, dry_run: str, now: datetime, resumed: bool = False
    ) -> Actuation:
        wl = decision.workload
        # An earlier attempt recorded the target, so it had passed the guardrails: finish it.
        resuming = resumed and not dry_run and await self._target_is(decision)
        view = await self.cards.facts(await self._view(wl), decision, now)
        judgement = self._judge(decision, view, now, dry_run, resuming)
        if judgement.disruptive:  # another replica may have led, and disrupted, since
            await self._load_disruptions(now)
            judgement = self._judge(decision, view, now, dry_run, resuming)
        # Resuming, a plan was made (an earlier attempt's pods may be done: applied already).
        if resuming and (
            isinstance(judgement, ActuationPlan) or judgement.actuation.outcome is Outcome.APPLIED
        ):
            log.info(
                "finishing an interrupted decision", extra={"decision_id": decision.decision_id}
            )
        if isinstance(judgement, Skip):
            for warning in judgement.warnings:
                await self.executor.event(
                    warning.pod, warning.reason, warning.message, warning=True
                )
            return judgement.actuation
        return await self._execute(judgement, view, now)

    def _judge(
        self,
        decision: FractionDecision,
        view: ClusterView,
        now: datetime,
        dry_run: str,
        resuming: bool,
    ) -> ActuationPlan | Skip:
        guards = Guards(
            self.guards,
            self.settings.guardrails,
            self.settings.targets_via == "template",
            self.settings.opt_in,
            kai=self.settings.kai,
        )
        return judge(decision, view, guards, now, dry_run=dry_run, resuming=resuming)

    async def _target_is(self, decision: FractionDecision) -> bool:
        """Whether the recorded target is this decision's (an earlier attempt got that far)."""
        target = await self.targets.get(decision.workload)
        return target is not None and target.decision_id == decision.decision_id

    async def correct(
        self, decision: FractionDecision, now: datetime, corrections: int
    ) -> Actuation:
        """Act again on a decision whose replacement was born at another share (the webhook was
        down): judged afresh, within the disruption budget; when the budget is spent the
        change is left as a recommendation. The replacement is the decision's own doing, so
        the decision counts as made now (not stale)."""
        again = decision.model_copy(update={"decided_at": now})
        view = await self._view(again.workload)
        judgement = self._judge(again, view, now, "", False)
        if isinstance(judgement, Skip):
            done = judgement.actuation
            if done.outcome is Outcome.SKIPPED and done.plan is not PlanKind.NONE:
                return replace(
                    done,
                    outcome=Outcome.DRY_RUN,
                    held_back="policy",
                    detail=f"correction left as a recommendation: {done.detail}",
                )
            return replace(done, detail=f"correction: {done.detail}")
        return await self._execute(judgement, view, now, corrections=corrections)

    async def _view(self, workload: WorkloadRef, fresh: bool = False) -> ClusterView:
        view = await self.reader.observe(workload, fresh=fresh)
        if view.live:  # the workload object, for its opt-out and its pod template
            owner = await self.api.read_owner(
                workload.namespace, workload.owner_kind, workload.owner_name
            )
            view = replace(view, owner=owner)
        if self.namespaces is not None:
            labels = await self.namespaces.labels_of(workload.namespace)
            view = replace(view, namespace_labels=labels)
        return view

    async def _execute(
        self,
        chosen: ActuationPlan,
        view: ClusterView,
        now: datetime,
        *,
        rejudged: bool = False,
        corrections: int = 0,
    ) -> Actuation:
        decision, plan = chosen.decision, chosen.plan
        wl = decision.workload
        by_name = {p.name: p for p in view.live}
        key = wl.key
        self.guards = self.guards.begin(key)
        try:
            target = chosen.target(now)
            await self.targets.put(target)
            window = self.settings.guardrails.window_s
            counted = chosen.resuming and any(
                a.workload == key for a in self.guards.pruned(now, window).recent
            )
            disruption: Disruption | None = None
            if chosen.disruptive and not counted:
                # Recorded, and kept, before any pod is touched: a crash cannot hide it.
                disruption = Disruption(key, wl.namespace, now)
                self.guards = self.guards.record(disruption, window)
                await self.history.save(self.guards.recent)
            notes = ["resumed: target recorded" if chosen.resuming else "target recorded"]
            if self.settings.targets_via == "template":
                owner = dict(view.owner) if view.owner is not None else None
                note, error = await self.executor.patch_template(target, owner)
                notes.append(note)
                if error is not None:
                    detail = f"{plan.reason}; {'; '.join(notes)}"
                    return _failed(chosen, detail, error)
            # Shared isolation: co-tenants shrink first, so the card never sums above 1.0.
            redivided, refusal = await redivide(
                self.executor, self.reader.fence, chosen, now, shrinking=True
            )
            notes += redivided
            if refusal is not None:
                # (not dead-lettered: the co-tenant, not this decision, was refused)
                detail = f"{plan.reason}; {'; '.join(notes)}"
                return chosen.result(Outcome.FAILED, detail, refusal)
            # In plan order: each step was planned on the cluster the earlier ones leave, so
            # a resize that counts on a pod having moved out waits for that eviction.
            evicted: list[ResizePlan] = []
            for step in plan.steps:
                enforced = chosen.enforcement.get(step.pod, NOT_ENFORCED)
                if step.kind is PlanKind.IN_PLACE:
                    try:
                        error = await self.executor.resize_in_place(
                            decision, by_name[step.pod], step, chosen.memory_mib, now, enforced
                        )
                    except InPlaceConflictError as conflict:
                        if rejudged or evicted:
                            detail = f"{plan.reason}; {'; '.join(notes)}; {conflict}"
                            return chosen.result(Outcome.FAILED, detail, str(conflict))
                        log.info("in-place conflict: re-reading and judging again once")
                        return await self._rejudge(chosen, now, f"{conflict}; re-read")
                    if error is not None:
                        detail = f"{plan.reason}; {'; '.join(notes)}; {error}"
                        return _failed(chosen, detail, error)
                    notes.append(
                        f"{step.pod} resized in place and read back "
                        f"({enforcement_note(step, enforced)})"
                    )
                elif step.kind is PlanKind.RECREATE_ELSEWHERE:
                    error = await self.executor.evict(decision, by_name[step.pod], step, enforced)
                    if error is not None:
                        if disruption is not None and not evicted:
                            await self._take_back(disruption, window)
                            notes.append("the refused eviction used none of the budget")
                        detail = f"{plan.reason}; {'; '.join(notes)}; {error}"
                        return _failed(chosen, detail, error)
                    evicted.append(step)
                    notes.append(f"{step.pod} evicted")
            scale_ups = plan.steps_of(PlanKind.SCALE_UP)
            if scale_ups:
                pending = await self.executor.request_capacity(
                    decision, [by_name[s.pod] for s in scale_ups], now
                )
                self.pending[key] = pending
                notes.append(
                    "capacity requested for "
                    + ", ".join(s.pod for s in scale_ups)
                    + " (placeholder pods); they move once a GPU is free"
                )
                pending.notes = notes
                return pending_result(
                    PlanKind.SCALE_UP,
                    chosen.primary,
                    chosen.inventory,
                    f"{plan.reason}; " + "; ".join(notes),
                )
            if evicted:
                primary = chosen.primary if chosen.primary in evicted else evicted[0]
                await self.scale_ups.wait_for_replacements(
                    PendingRecreate(
                        decision=decision,
                        kind=plan.kind,
                        step=primary,
                        node_before=chosen.inventory.gpu_node(primary.gpu_before),
                        evicted=len(evicted),
                        known_uids=frozenset(p.uid for p in view.pods),
                        started_at=now,
                        notes=[plan.reason, *notes],
                        corrections=corrections,
                    )
                )
                detail = f"{plan.reason}; {'; '.join(notes)}; waiting for the replacement"
                return pending_result(plan.kind, primary, chosen.inventory, detail)
            notes += (
                await redivide(self.executor, self.reader.fence, chosen, now, shrinking=False)
            )[0]
            await self.publish_allocation(wl, chosen.inventory, plan.steps, now, chosen.enforcement)
            return chosen.result(Outcome.APPLIED, f"{plan.reason}; {'; '.join(notes)}")
        finally:
            if not self.scale_ups.waiting(key):
                self.guards = self.guards.end(key)

    async def _rejudge(self, chosen: ActuationPlan, now: datetime, why: str) -> Actuation:
        """After a 409 on an in-place patch: read the cluster afresh and judge once more (the
        target is recorded, so as a resumed decision: only what is left is done)."""
        decision = chosen.decision
        self.guards = self.guards.end(decision.workload.key)
        view = await self._view(decision.workload, fresh=True)
        judgement = self._judge(decision, view, now, "", True)
        if isinstance(judgement, Skip):
            done = judgement.actuation
            return replace(done, detail=f"{why}: {done.detail}")
        result = await self._execute(judgement, view, now, rejudged=True)
        return replace(result, detail=f"{why}: {result.detail}")

    async def _take_back(self, disruption: Disruption, window: float) -> None:
        """An eviction the cluster refused disrupted nothing: forget its record."""
        recent = tuple(d for d in self.guards.recent if d is not disruption)
        self.guards = replace(self.guards, recent=recent)
        try:
            await self.history.save(self.guards.recent)
        except Exception as exc:  # kept counted: too cautious, never too lax
            log.warning("disruption not taken back", extra={"error": str(exc)[:300]})

    async def publish_allocation(
        self,
        workload: WorkloadRef,
        inventory: Inventory,
        steps: tuple[ResizePlan, ...],
        now: datetime,
        enforcement: Mapping[str, Enforcement] | None = None,
    ) -> None:
        """The workload's Allocation (:func:`~.allocations.enforced_allocation`); failing to
        write one never fails the action."""
        if self.allocations is None:
            return
        allocation = enforced_allocation(workload, inventory, steps, now, enforcement)
        if allocation is None:
            return
        try:
            await self.allocations.put(allocation)
        except Exception as exc:
            log.warning(
                "could not publish the allocation",
                extra={"workload": workload.key, "error": str(exc)[:300]},
            )

    # --- scale-ups waiting for capacity -----------------------------------------------------

    async def reconcile(self, now: datetime) -> None:
        """Move the pods of each waiting scale-up whose capacity now exists, verify each
        waiting recreate; give up on time. Then a consolidation round (:mod:`.consolidation`)."""
        await self.scale_ups.reconcile(now)
        try:
            await self.consolidation.reconcile(now)
        except Exception:
            log.exception("consolidation round failed; trying again")
