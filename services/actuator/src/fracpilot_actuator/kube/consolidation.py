"""Consolidation on the cluster: the imperative part of :mod:`.consolidation_round`.

Called from :meth:`~fracpilot_actuator.kube.backend.KubernetesBackend.reconcile` (the leader's
reconcile loop). Every ``interval_s`` (every call while a node is being emptied) it reads the
cluster (:mod:`.consolidation_read`: nodes and pods from the inventory cache when it is current,
KAI's BindRequests and PodGroups, PodDisruptionBudgets, the namespaces' labels), asks the round
what to do, and:

- sets the gauges ``fracpilot_consolidation_would_free_gpus`` / ``_nodes``, and logs the
  plan's summary and publishes it (a ``ConsolidationReport``, when the backend was given a
  publisher) when it changed (recommend and auto alike);
- auto: marks the node to empty (the NoSchedule taint ``fracpilot.io/consolidating=true``, the
  annotation ``fracpilot.io/consolidating-reason``: :mod:`.consolidation_marks`'s patches, and an
  Event on the node), then moves its pods one at a time, make before break: a move is allowed
  by the guardrails (the disruption
  budget, a workload in flight) and recorded as a disruption before the eviction, which goes
  through the Eviction API (PDBs hold: a 429 is retried, then the node is given up), with an
  Event on the pod saying why; the next move waits until the replacement is bound
  (:func:`.consolidation_moves.move_verdict`, read from the new pod);
- takes the mark off (with an Event) when the node is empty, or the plan is given up: a refusal
  of the round, an eviction refused, a replacement not bound within ``move_timeout_s``.

- auto, when no node can be emptied: empties one card (a GPU on a node that keeps other pods)
  the same way, without a taint (why: :mod:`.consolidation_round`), with Events on its node
  (``ConsolidationCardStarted``, ``ConsolidationCardDone`` / ``ConsolidationCardAbandoned``); a
  card move whose replacement KAI did not bind on the predicted GPU gives the card up;
- under shared isolation, a ``shrink`` step of the plan (room made on the target card) is an
  in-place annotation patch of the tenant's ``gpu-fraction``, read back, with a
  ``FractionRedivided`` Event (:func:`.shared_cards.patch_share`), before the move.

Each move's start and result, a plan given up and a node (card) freed go on the event stream too
(``ConsolidationMove``); the gauges, the reports, the event stream and the node Events are told
by :mod:`.consolidation_notices`. The node or card being emptied, the move in flight and the
recent moves are saved at each change (``progress``: the actuator's state bucket): a new
leader (:meth:`Consolidator.resume`) goes on with them, verifying the move in flight, or gives
them up when the cluster no longer matches.
Without a store, a new leader finds a marked node by its taint and re-plans it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Protocol

from fracpilot_actuator.guardrails import Disruption, GuardState, Subject, check
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import Fence
from fracpilot_actuator.kube.consolidation_marks import mark_patch, unmark_patch
from fracpilot_actuator.kube.consolidation_moves import MoveInFlight, move_verdict
from fracpilot_actuator.kube.consolidation_notices import ConsolidationNotices, Publish
from fracpilot_actuator.kube.consolidation_pods import card_forecasts
from fracpilot_actuator.kube.consolidation_progress import (
    Progress,
    progress_json,
    progress_of,
    resume_refusal,
)
from fracpilot_actuator.kube.consolidation_read import read_consolidation_view
from fracpilot_actuator.kube.consolidation_round import consolidation_round, marked_nodes
from fracpilot_actuator.kube.consolidation_view import ConsolidationView
from fracpilot_actuator.kube.executor import StepExecutor
from fracpilot_actuator.kube.namespaces import NamespaceLabels
from fracpilot_actuator.kube.reader import ClusterReader
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.kube.shared_cards import CONSOLIDATION_SHRINK, SharedCards, patch_share
from fracpilot_actuator.metrics import ConsolidationMetrics
from fracpilot_actuator.stores.ports import ConsolidationProgress, DisruptionHistory
from fracpilot_libs.contracts import GpuSharing, MoveState
from fracpilot_libs.owners import Controller, OwnerKey, top_owner
from fracpilot_libs.placement.consolidation_steps import ConsolidationStep, StepKind

log = logging.getLogger(__name__)


class ConsolidationHost(Protocol):
    """What consolidation uses of the backend that owns it (the backend imports this module,
    so naming the backend's class here would be an import circle)."""

    api: KubeApi
    settings: KubeBackendSettings
    reader: ClusterReader
    executor: StepExecutor
    guards: GuardState
    history: DisruptionHistory
    namespaces: NamespaceLabels | None
    instance: str
    cards: SharedCards  # the forecasts of the decisions seen (shared isolation's shrinks)


class Consolidator:
    """The backend's consolidation: the node being emptied and the move in flight."""

    def __init__(
        self,
        backend: ConsolidationHost,
        metrics: ConsolidationMetrics | None,
        publish: Publish | None = None,
        progress: ConsolidationProgress | None = None,
    ) -> None:
        """``progress``: where the node or card being emptied and its move in flight are
        saved for the next leader (None: in memory only; a new leader then finds a marked node
        by its taint and re-plans it)."""
        self.backend = backend
        self.metrics = metrics
        self.notices = ConsolidationNotices(backend, metrics, publish)
        self.progress = progress
        self.saved = ""  # the progress as last saved
        self.card = ""  # the card being emptied (its GPU uuid)
        self.card_node = ""  # its node
        self.move: MoveInFlight | None = None
        self.moves: list[datetime] = []  # when each move of the last hour started
        self.last_round: datetime | None = None
        self.workload = ""  # the moving pod's workload key, in flight for the guardrails
        self.marked = ""  # the node being emptied, as the last round saw it

    async def reconcile(self, now: datetime) -> None:
        settings = self.backend.settings.consolidation
        if settings.mode == "off":
            return
        if self.move is not None:
            busy = self.card or self.marked
            if not await self._verify(now):
                return  # make before break: the next move waits for the replacement
            if busy and not (self.card or self.marked):
                self.last_round = now  # given up: the next plan waits for the next interval
                return
        due = self.last_round is None or now - self.last_round >= timedelta(
            seconds=settings.interval_s
        )
        if not due and not self.marked and not self.card:
            return  # a node (card) being emptied goes on at every call; else every interval_s
        self.last_round = now
        view = await self._read()
        marked = marked_nodes(view.nodes)  # a new leader's first round finds the mark here
        self.marked = marked[0] if marked else ""
        if self.marked and self.card:  # one at a time: a marked node (a leftover) goes first
            await self._release_card(view, f"node {self.marked} is being emptied")
        for extra in marked[1:]:  # one node at a time: any other mark is a leftover
            await self._unmark(view, extra, "another node is being emptied")
        self.moves = [t for t in self.moves if now - t < timedelta(hours=1)]
        # once a round, from the reader's cache (listed only when the cache is off)
        owners = await self.backend.reader.owners(
            {p.namespace for p in view.inventory.pods.values() if p.backend is GpuSharing.KAI}
        )
        chosen = consolidation_round(
            view,
            settings,
            self.backend.settings.opt_in,
            marked=marked[0] if marked else "",
            recent_moves=self.moves,
            now=now,
            card=self.card,
            card_node=self.card_node,
            forecasts=card_forecasts(self.backend.cards.book, view, owners, now),
        )
        await self.notices.report(chosen.would, "" if chosen.unmark else chosen.node, now)
        if chosen.unmark and chosen.card:
            await self._release_card(view, chosen.unmark, done=chosen.done)
            return
        if chosen.unmark:
            freed = chosen.done
            gpus = sum(1 for g in view.inventory.state.gpus if g.node == chosen.node)
            if freed and self.metrics is not None:
                self.metrics.freed_nodes.inc()
                self.metrics.freed_gpus.inc(gpus)
            await self._unmark(view, chosen.node, chosen.unmark, done=freed, gpus=gpus)
            return
        if chosen.held_back or chosen.step is None:
            if chosen.held_back and chosen.node:
                log.info(
                    "consolidation waits",
                    extra={"node": chosen.node, "reason": chosen.held_back},
                )
            return
        if chosen.mark and chosen.card:  # no taint on a card (consolidation_round's docstring)
            self.card, self.card_node = chosen.card, chosen.node
            log.info("consolidating card", extra={"gpu": chosen.card, "reason": chosen.mark})
            await self.notices.node_event(
                view.nodes.get(chosen.node) or {"metadata": {"name": chosen.node}},
                "ConsolidationCardStarted",
                chosen.mark,
            )
            await self._save()
        elif chosen.mark:
            if not await self._mark(view, chosen.node, chosen.mark):
                return
            self.marked = chosen.node
            await self._save()
        await self._carry_out(view, owners, chosen.node, chosen.step, now)

    # --- leader change ----------------------------------------------------------------------

    async def resume(self, now: datetime) -> None:
        """Take up what the previous leader saved: the node or card being emptied, the move in
        flight (its replacement is verified as if this process had evicted it) and the recent
        moves (the rate limit); or give it up when the cluster no longer matches
        (:func:`.consolidation_progress.resume_refusal`). What this process held is replaced."""
        self.move, self.workload, self.card, self.card_node = None, "", "", ""
        self.marked, self.moves, self.last_round = "", [], None
        if self.progress is None or self.backend.settings.consolidation.mode == "off":
            return
        try:
            self.saved = await self.progress.load()
            saved = progress_of(self.saved) if self.saved else None
        except Exception as exc:  # a marked node is still found by its taint
            log.warning("consolidation progress not read", extra={"error": str(exc)[:300]})
            return
        if saved is None:
            return
        view = await self._read()
        self.moves = [t for t in saved.moves if now - t < timedelta(hours=1)]
        why = resume_refusal(saved, view)
        if why is not None:
            log.warning("consolidation not resumed", extra={"node": saved.node, "reason": why})
            if saved.card:
                self.card, self.card_node = saved.card, saved.node
                await self._release_card(view, why)
            else:  # no mark to take off
                await self.notices.moved(
                    MoveState.ABANDONED, saved.node, None, f"not resumed by a new leader: {why}"
                )
            await self._save()
            return
        if saved.card:
            self.card, self.card_node = saved.card, saved.node
        else:
            self.marked = saved.node
        if saved.move is not None:
            self.move, self.workload = saved.move, saved.workload
            self.backend.guards = self.backend.guards.begin(saved.workload)
        log.info(
            "consolidation resumed",
            extra={"node": saved.node, "gpu": saved.card, "in_flight": saved.move is not None},
        )
        await self._save()

    async def _save(self) -> None:
        """Save the progress when it changed; a failure is logged (this leader goes on; a new
        one would re-plan from the taint)."""
        if self.progress is None:
            return
        node = self.card_node if self.card else self.marked
        text = ""
        if node:
            progress = Progress(
                node=node,
                card=self.card,
                move=self.move,
                workload=self.workload if self.move is not None else "",
                moves=tuple(self.moves),
            )
            text = progress_json(progress)
        if text == self.saved:
            return
        try:
            await self.progress.save(text)
        except Exception as exc:
            log.warning("consolidation progress not saved", extra={"error": str(exc)[:300]})
            return
        self.saved = text

    async def _give_up(self, view: ConsolidationView, node: str, why: str) -> None:
        """Give up the card or node being emptied."""
        if self.card:
            await self._release_card(view, why)
        else:
            await self._unmark(view, node, why)

    async def _release_card(self, view: ConsolidationView, why: str, done: bool = False) -> None:
        """The card is empty (``done``), or its plan is given up: an Event on its node and the
        event stream say so (no taint to take off)."""
        card, node = self.card, self.card_node
        self.card, self.card_node = "", ""
        raw = view.nodes.get(node) or {"metadata": {"name": node}}
        if done:
            text = f"GPU {card} on node {node} emptied by consolidation: {why}"
            log.info("consolidation freed a card", extra={"gpu": card, "node": node})
            if self.metrics is not None:
                self.metrics.freed_gpus.inc()
            await self.notices.node_event(raw, "ConsolidationCardDone", text)
            await self.notices.moved(MoveState.FREED, node, None, text, freed_gpus=1)
        else:
            text = f"consolidation of GPU {card} on node {node} given up: {why}"
            log.warning("consolidation given up", extra={"gpu": card, "reason": why})
            await self.notices.node_event(raw, "ConsolidationCardAbandoned", text, warning=True)
            await self.notices.moved(MoveState.ABANDONED, node, None, text)
        await self._save()

    # --- reading --------------------------------------------------------------------------

    async def _read(self) -> ConsolidationView:
        backend = self.backend
        return await read_consolidation_view(
            backend.api, backend.reader, backend.settings, backend.namespaces
        )

    async def _mark(self, view: ConsolidationView, node: str, reason: str) -> bool:
        raw = view.nodes[node]
        try:
            version = await self.backend.api.patch_node(node, mark_patch(raw, reason))
        except Exception as exc:  # tried again next round, on the node as it then is
            log.warning("node not marked", extra={"node": node, "error": str(exc)[:300]})
            return False
        self.backend.reader.fence(Fence("nodes", version))  # the next round sees the mark
        log.info("consolidating node", extra={"node": node, "reason": reason})
        await self.notices.node_event(raw, "ConsolidationStarted", reason)
        return True

    async def _unmark(
        self, view: ConsolidationView, node: str, why: str, done: bool = False, gpus: int = 0
    ) -> None:
        raw = view.nodes.get(node)
        if raw is None:
            return
        try:
            version = await self.backend.api.patch_node(node, unmark_patch(raw))
        except Exception as exc:  # the next round sees the mark and tries again
            log.warning("mark not taken off", extra={"node": node, "error": str(exc)[:300]})
            return
        self.backend.reader.fence(Fence("nodes", version))
        if node == self.marked:
            self.marked = ""
            await self._save()
        if done:
            text = f"node {node} emptied of GPU pods by consolidation: {why}"
            log.info("consolidation freed a node", extra={"node": node})
            await self.notices.node_event(raw, "ConsolidationDone", text)
            await self.notices.moved(
                MoveState.FREED, node, None, text, freed_node=node, freed_gpus=gpus
            )
        else:
            text = f"consolidation of node {node} given up: {why}"
            log.warning("consolidation given up", extra={"node": node, "reason": why})
            await self.notices.node_event(raw, "ConsolidationAbandoned", text, warning=True)
            await self.notices.moved(MoveState.ABANDONED, node, None, text)

    # --- one step -------------------------------------------------------------------------

    async def _carry_out(
        self,
        view: ConsolidationView,
        owners: Mapping[OwnerKey, Controller],
        node: str,
        step: ConsolidationStep,
        now: datetime,
    ) -> None:
        backend = self.backend
        inventory = view.inventory
        pod = inventory.pods[step.pod_key]
        if step.kind is StepKind.SHRINK:
            await self._shrink(view, node, step, now)
            return
        kind, name = top_owner(pod.namespace, pod.controller, owners, pod.name)
        workload = f"{backend.settings.cluster}/{pod.namespace}/{kind}/{name}"
        siblings = [
            p
            for p in inventory.pods.values()
            if p.namespace == pod.namespace and p.controller == pod.controller
        ]
        subject = Subject(
            workload=workload,
            namespace=pod.namespace,
            decided_at=now,
            last_change=None,
            replicas=sum(1 for p in siblings if not p.terminating),
        )
        settings = backend.settings.guardrails
        verdict = check(subject, disruptive=True, state=backend.guards, settings=settings, now=now)
        if not verdict.allowed:
            log.info(
                "consolidation move waits for the guardrails",
                extra={"pod": pod.key, "guard": verdict.guard, "reason": verdict.reason},
            )
            return
        disruption = Disruption(workload, pod.namespace, now)
        backend.guards = backend.guards.record(disruption, settings.window_s)
        await backend.history.save(backend.guards.recent)
        if self.card:
            what = f"off GPU {self.card} on node {node} so that the whole GPU is free"
        else:
            what = f"off node {node} so that the autoscaler can remove it"
        explanation = f"consolidation moves {pod.key} ({step.fraction:g} GPU) {what}: {step.reason}"
        await backend.executor.event(pod, "ConsolidationMove", explanation)
        log.info("consolidation move", extra={"pod": pod.key, "node": node, "reason": step.reason})
        assert pod.controller is not None  # the round moves only pods a controller recreates
        # Written (and announced) ahead of the eviction: a leader lost right after it leaves
        # its successor the move to verify, never a pod gone with no record (which it would
        # plan afresh). Lost before the eviction, the successor waits out the move's timeout
        # and gives it up; a refused eviction is announced FAILED after STARTED.
        self.move = MoveInFlight(
            step=step,
            namespace=pod.namespace,
            controller=pod.controller,
            known_uids=frozenset(p.uid for p in siblings),
            started_at=now,
        )
        backend.guards = backend.guards.begin(workload)
        self.workload = workload
        await self._save()
        await self.notices.moved(MoveState.STARTED, node, step, explanation)
        failure = await backend.executor.evict_pod(pod)
        if failure is not None:
            self.move = None
            backend.guards = backend.guards.end(workload)
            if self.metrics is not None:
                self.metrics.moves.labels("failed").inc()
            await self.notices.moved(
                MoveState.FAILED, node, step, f"the eviction failed: {failure}"
            )
            await self._give_up(view, node, f"the eviction of {pod.key} failed: {failure}")
            return
        self.moves.append(now)
        await self._save()  # the rate limit's count of the last hour

    async def _shrink(
        self, view: ConsolidationView, node: str, step: ConsolidationStep, now: datetime
    ) -> None:
        """Shared isolation: a tenant of the target card shrinks in place to its budgeted
        share (scheduler accounting only, no restart), read back before the move that needs
        the room; not a disruption, and not a move of the rate limit."""
        pod = view.inventory.pods.get(step.pod_key)
        if pod is None:
            await self._give_up(view, node, f"{step.pod_key} to shrink is not in the cluster")
            return
        log.info("consolidation shrink", extra={"pod": pod.key, "reason": step.reason})
        error = await patch_share(
            self.backend.executor,
            self.backend.reader.fence,
            pod,
            step.placement.fraction,
            step.fraction,
            f"consolidation: {step.reason}",
            now=now,
            purpose=CONSOLIDATION_SHRINK,
        )
        if error is not None:
            await self._give_up(view, node, error)

    async def _verify(self, now: datetime) -> bool:
        """Whether the move in flight is over (verified, or given up)."""
        move = self.move
        assert move is not None
        view = await self._read()
        verdict = move_verdict(
            move, view.inventory, now, self.backend.settings.consolidation.move_timeout_s
        )
        if verdict.state == "waiting":
            return False
        self.move = None
        self.backend.guards = self.backend.guards.end(self.workload)
        await self._save()
        step = move.step
        if verdict.state == "verified":
            if self.metrics is not None:
                self.metrics.moves.labels("verified").inc()
            log.info(
                "consolidation move verified",
                extra={"pod": step.pod_key, "node": verdict.node, "detail": verdict.reason},
            )
            await self.notices.moved(
                MoveState.VERIFIED,
                step.from_node,
                step,
                verdict.reason,
                new_pod=verdict.pod,
                to_node=verdict.node,
            )
            new = view.inventory.pods.get(f"{move.namespace}/{verdict.pod}")
            if new is not None:
                text = f"replaces {step.pod_key}, moved off node {step.from_node}: {verdict.reason}"
                await self.backend.executor.event(new, "ConsolidationMoveVerified", text)
            if self.card and not verdict.as_predicted:
                # the plan's next steps assume KAI put it where predicted: stop, re-plan later
                await self._release_card(
                    view, f"KAI did not place it as predicted: {verdict.reason}"
                )
            return True
        if self.metrics is not None:
            self.metrics.moves.labels("failed").inc()
        await self.notices.moved(MoveState.FAILED, step.from_node, step, verdict.reason)
        await self._give_up(view, step.from_node, verdict.reason)
        return True
