"""The Kubernetes backend: one decision in, changes to the cluster out, never more than allowed.

For each decision it reads the cluster (nodes, pods, the namespace's ReplicaSets and Jobs for
owner references, and the workload object, read per decision), finds the workload's pods,
plans each pod with the pure planner, checks the guardrails
(:mod:`fracpilot_actuator.guardrails`) and then:

- records the workload's target (``WorkloadTarget`` in the targets KV bucket) first, so any
  pod created from now on gets the new fraction from the admission webhook;
- in place (KAI only): patches the running pod's ``gpu-fraction`` (or ``gpu-memory``)
  annotation, which KAI's scheduler re-reads, so the capacity is held at once; the new
  limit reaches the container when the pod is next recreated;
- recreate (KAI when it does not fit on the pod's GPU; HAMi always, as HAMi cannot change a
  running pod's limits): evicts through the Eviction API (policy/v1), which honours
  PodDisruptionBudgets; a 429 is retried with exponential backoff a bounded number of times,
  then reported failed; a pod is never deleted directly;
- scale up (fits on no GPU): creates a pending placeholder pod asking for a whole
  ``nvidia.com/gpu`` with the low PriorityClass ``fracpilot-capacity`` (value -10, created if
  missing), which the cluster-autoscaler sees, and evicts only once the capacity exists
  (:meth:`KubernetesBackend.reconcile`: the pod now fits somewhere, or the placeholder was
  scheduled); gives up after ``capacity_timeout_s``. The placeholder carries the decision, so
  a restarted actuator carries on where it was.

With ``inventory_cache`` (the default) nodes, pods, ReplicaSets and Jobs come from
:class:`~fracpilot_actuator.kube.cache.InventoryCache`, kept current by watches, instead of
being listed per decision. The cache is never older than the backend's own writes: each pod
patch, create, eviction or delete leaves a fence (the write's resourceVersion, or the pod
that must be gone), and a decision waits up to ``cache_fence_timeout_s`` for the watches to
pass it, else lists afresh as without the cache.

Every action leaves a Kubernetes Event on the pod (FractionResized,
FractionEvictionRequested, CapacityRequested, and Warning events when it fails).

Without the admission webhook (``targets_via="template"``), the target reaches new pods
through the workload's pod template instead: right after the target is recorded, a
Deployment's or StatefulSet's ``spec.template`` is patched the way the webhook would patch a
pod (:func:`fracpilot_actuator.admission.template_patch`: KAI's ``gpu-fraction`` /
``gpu-memory`` annotation, HAMi's limits), with a WARNING log each time, as each such patch
starts a rollout that replaces every pod. The plan's steps (in place, evictions, scale-ups)
run as they do with the webhook.

Crashes and faults. Before it acts, the backend records the target and, for a disruptive plan,
the disruption itself (in the actuator's KV bucket, so the disruption budget holds across
restarts and leader changes). A decision whose earlier attempt stopped half-way (the service
passes ``resumed``) and whose target was recorded is finished, not re-judged: the guardrails
it passed are not checked again, and only what the cluster shows as still to do is done
(evicted pods are terminating or gone, resized ones carry the new share), so no pod is evicted
twice. An eviction that got no answer (timeout, connection lost, 5xx) is checked before it is
sent again (:meth:`KubeApi.pod_is_going`); refusals (429 from a PDB or an overloaded server,
409) are retried with jittered backoff, a bounded number of times.

After an action is done (at once, or when a scale-up finishes) the workload's ``Allocation``
goes to the allocations KV bucket under ``subjects.kv_key(workload)``, as the simulated
cluster does, so that ingest knows the fractions: one record per workload, for one of its
pods (see :meth:`KubernetesBackend._publish_allocation`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from fracpilot_actuator.admission import template_patch
from fracpilot_actuator.backends import Actuation, Report
from fracpilot_actuator.guardrails import (
    Action,
    GuardrailSettings,
    GuardState,
    Subject,
    Verdict,
    check,
    opt_out,
)
from fracpilot_actuator.kube.api import KubeApi, status_of, transient, unanswered
from fracpilot_actuator.kube.cache import Fence, InventoryCache
from fracpilot_actuator.kube.inventory import (
    CAPACITY_ROLE,
    DECISION_ID,
    GPU_RESOURCE,
    KAI_FRACTION,
    KAI_MEMORY,
    RESIZED_AT,
    ROLE,
    Inventory,
    PodInfo,
    build_inventory,
    is_opted_out,
    last_change,
    owner_parents,
    parse_time,
)
from fracpilot_actuator.planner import (
    ResizePlan,
    WorkloadPlan,
    allocation_for,
    apply_pod_plan,
    plan_pod,
    plan_workload,
)
from fracpilot_libs import subjects
from fracpilot_libs.contracts import (
    FractionDecision,
    GpuBackend,
    Outcome,
    PlanKind,
    WorkloadRef,
    WorkloadTarget,
    utcnow,
)

log = logging.getLogger(__name__)

PRIORITY_CLASS = "fracpilot-capacity"
PRIORITY_VALUE = -10
COMPONENT = "fracpilot.io/actuator"
MANAGED_BY = "app.kubernetes.io/managed-by"
WORKLOAD = "fracpilot.io/workload"  # on a placeholder: the workload key it asks capacity for
FOR_POD = "fracpilot.io/for-pod"  # on a placeholder: the pod that moves once capacity exists
DECISION = "fracpilot.io/decision"  # on a placeholder: the decision, as JSON
TEMPLATE_KINDS = ("Deployment", "StatefulSet")  # whose pod template targets_via=template patches
DISRUPTIONS_KEY = "guardrails.disruptions"  # in the state bucket: recent disruptive actions


@dataclass(frozen=True)
class KubeBackendSettings:
    cluster: str = "default"
    """The cluster name in the WorkloadRefs of pods that no decision names."""
    node_selector: str | None = None
    """A label selector for the GPU nodes fracpilot may place pods on; None: every node."""
    default_gpu_memory_mib: int = 81920
    """GPU memory of a node without the label nvidia.com/gpu.memory (reported as a problem)."""
    eviction_attempts: int = 8
    """Evictions refused with 429 (a PDB allows no disruption) are tried this often in all."""
    eviction_backoff_s: float = 1.0
    """First wait between eviction attempts, doubling each time."""
    eviction_backoff_max_s: float = 30.0
    """Longest wait between eviction attempts."""
    capacity_timeout_s: float = 900.0
    """A scale-up gives up when no capacity appeared this long (cluster-autoscaler's default
    max-node-provision-time is 15 minutes)."""
    capacity_namespace: str | None = None
    """Where placeholder pods go; None: the workload's namespace."""
    placeholder_image: str = "registry.k8s.io/pause:3.10"
    targets_via: Literal["webhook", "template"] = "webhook"
    """How new pods get the target: the admission webhook, or (without it) a patch of the
    workload's pod template, which starts a rollout replacing every pod."""
    guardrails: GuardrailSettings = field(default_factory=GuardrailSettings)
    inventory_cache: bool = True
    """Read nodes, pods, ReplicaSets and Jobs from a watch-fed cache; False: list them for
    every decision."""
    cache_fence_timeout_s: float = 2.0
    """How long a decision waits for the cache to catch up with the backend's last write
    before it lists afresh."""


@dataclass
class PendingScaleUp:
    """A scale-up waiting for capacity: placeholders by the pod each one is for."""

    decision: FractionDecision
    started_at: datetime
    placeholders: dict[str, tuple[str, str]]  # pod name -> (namespace, placeholder name)
    notes: list[str] = field(default_factory=list)


def placeholder_name(namespace: str, pod: str) -> str:
    digest = hashlib.sha256(f"{namespace}/{pod}".encode()).hexdigest()[:12]
    return f"fracpilot-capacity-{digest}"


def placeholder_pod(
    *,
    name: str,
    namespace: str,
    decision: FractionDecision,
    pod: PodInfo,
    image: str,
) -> dict[str, Any]:
    """A pod that asks for one whole GPU where the moving pod may run, and does nothing.

    It copies the pod's node selector, affinity and tolerations (as KAI's node-scale-adjuster
    does), so the autoscaler adds a node the pod can use; ``preemptionPolicy: Never`` and the
    negative priority keep it from pushing any real pod aside.
    """
    spec = pod.raw.get("spec") or {}
    copied = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {ROLE: CAPACITY_ROLE, MANAGED_BY: "fracpilot"},
            "annotations": {
                WORKLOAD: decision.workload.key,
                FOR_POD: pod.name,
                DECISION: decision.model_dump_json(),
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
            },
        },
        "spec": {
            **copied,
            "priorityClassName": PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "capacity",
                    "image": image,
                    "resources": {
                        "requests": {GPU_RESOURCE: "1", "cpu": "10m", "memory": "16Mi"},
                        "limits": {GPU_RESOURCE: "1", "memory": "16Mi"},
                    },
                }
            ],
        },
    }


def _retry_eviction(exc: BaseException) -> bool:
    """Refused for now (429: a PDB allows no disruption, or the server is overloaded; 409), or
    failed in a way worth another try (5xx, no answer)."""
    return status_of(exc) in (409, 429) or transient(exc)


def _api_message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body).get("message", "")) if body else str(exc)
    except (ValueError, AttributeError):
        return str(body)[:300]


@dataclass(frozen=True)
class _View:
    """The cluster as one decision sees it."""

    inventory: Inventory
    pods: tuple[PodInfo, ...]  # the workload's pods, terminating ones included

    @property
    def live(self) -> tuple[PodInfo, ...]:
        return tuple(p for p in self.pods if not p.terminating)


class KubernetesBackend:
    def __init__(
        self,
        api: KubeApi,
        targets: KeyValue,
        settings: KubeBackendSettings,
        report: Report,
        instance: str | None = None,
        allocations: KeyValue | None = None,
        state: KeyValue | None = None,
    ) -> None:
        """``state``: where the recent disruptive actions are kept across restarts (None: in
        memory only)."""
        self.api = api
        self.targets = targets
        self.allocations = allocations
        self.state = state
        self.settings = settings
        self.report = report
        self.instance = instance or socket.gethostname()
        self.guards = GuardState()
        self.pending: dict[str, PendingScaleUp] = {}
        self._logged_problems: set[str] = set()
        self.cache = (
            InventoryCache(api.api, settings.node_selector, timeout_s=api.timeout_s)
            if settings.inventory_cache
            else None
        )
        self._fences: list[Fence] = []
        self.fresh_lists = 0  # decisions that listed because the cache was behind

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the inventory cache; read the recent disruptions; pick up the scale-ups a
        previous run left waiting (their placeholders say which)."""
        await self._load_disruptions()
        if self.cache is not None:
            self.cache.start()
            if not await self.cache.wait_synced():
                log.warning("inventory cache not synced yet: listing until it is")
        for raw in await self.api.list_pods(label_selector=f"{ROLE}={CAPACITY_ROLE}"):
            meta = raw.get("metadata") or {}
            annotations = meta.get("annotations") or {}
            try:
                decision = FractionDecision.model_validate_json(annotations[DECISION])
                pod = annotations[FOR_POD]
            except (KeyError, ValueError):
                log.warning("placeholder without a decision", extra={"pod": meta.get("name")})
                continue
            key = decision.workload.key
            created = parse_time(meta.get("creationTimestamp")) or datetime.now(UTC)
            pending = self.pending.setdefault(
                key, PendingScaleUp(decision=decision, started_at=created, placeholders={})
            )
            pending.placeholders[pod] = (str(meta["namespace"]), str(meta["name"]))
            self.guards = self.guards.begin(key)
        if self.pending:
            log.info("resuming scale-ups", extra={"workloads": sorted(self.pending)})

    async def _load_disruptions(self) -> None:
        if self.state is None:
            return
        try:
            entry = await self.state.get(DISRUPTIONS_KEY)
        except KeyNotFoundError:
            return
        try:
            recent = tuple(
                Action(str(a["workload"]), str(a["namespace"]), datetime.fromisoformat(a["at"]))
                for a in json.loads(entry.value or b"[]")
            )
        except (ValueError, KeyError, TypeError) as exc:
            # Fail safe: with the history unknown, spend the whole budget for one window.
            log.error("disruption history unreadable: no disruption for one window", exc_info=exc)
            now = datetime.now(UTC)
            unknown = Action("unknown (history unreadable)", "", now)
            recent = (unknown,) * self.settings.guardrails.max_disruptions
        self.guards = replace(self.guards, recent=recent)
        if recent:
            log.info("disruption history restored", extra={"actions": len(recent)})

    async def _save_disruptions(self) -> None:
        if self.state is None:
            return
        body = [
            {"workload": a.workload, "namespace": a.namespace, "at": a.at.isoformat()}
            for a in self.guards.recent
        ]
        await self.state.put(DISRUPTIONS_KEY, json.dumps(body).encode())

    async def _target_is(self, decision: FractionDecision) -> bool:
        """Whether the recorded target is this decision's (an earlier attempt got that far)."""
        try:
            entry = await self.targets.get(subjects.kv_key(decision.workload))
            target = WorkloadTarget.model_validate_json(entry.value or b"")
        except (KeyNotFoundError, ValueError):
            return False
        return target.decision_id == decision.decision_id

    def close(self) -> None:
        """Stop the cache's watches."""
        if self.cache is not None:
            self.cache.stop()

    # --- reading the cluster ----------------------------------------------------------------

    def _fence(self, fence: Fence) -> None:
        if self.cache is not None:
            self._fences.append(fence)

    async def _from_cache(
        self, namespace: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any], list[Any]] | None:
        """The inventory's inputs from the cache; None when it cannot be used (off, not
        synced, or not caught up with our last write within the timeout)."""
        cache = self.cache
        if cache is None or not cache.synced.is_set():
            return None
        if self._fences:
            if not await cache.wait_for(self._fences, self.settings.cache_fence_timeout_s):
                self.fresh_lists += 1
                log.info("inventory cache behind our last write: listing afresh")
                return None
            self._fences.clear()
        snap = cache.snapshot()

        def mine(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [i for i in items if (i.get("metadata") or {}).get("namespace") == namespace]

        return snap.nodes, snap.pods, mine(snap.replica_sets), mine(snap.jobs)

    async def _observe(self, workload: WorkloadRef) -> _View:
        cached = await self._from_cache(workload.namespace)
        if cached is not None:
            nodes, pods, replica_sets, jobs = cached
        else:
            (nodes, pods), (replica_sets, jobs) = await asyncio.gather(
                asyncio.gather(
                    self.api.list_nodes(self.settings.node_selector), self.api.list_pods()
                ),
                self.api.list_owners(workload.namespace),
            )
        inventory = build_inventory(
            nodes,
            pods,
            cluster=self.settings.cluster,
            default_gpu_memory_mib=self.settings.default_gpu_memory_mib,
        )
        for problem in inventory.problems:
            if (text := str(problem)) not in self._logged_problems:
                self._logged_problems.add(text)
                log.warning("cluster problem", extra={"problem": text})
        parents = owner_parents(replica_sets, "ReplicaSet") | owner_parents(jobs, "Job")
        return _View(inventory, inventory.pods_of(workload, parents))

    # --- one decision -----------------------------------------------------------------------

    async def actuate(
        self, decision: FractionDecision, *, dry_run: str, now: datetime, resumed: bool = False
    ) -> Actuation:
        wl = decision.workload
        # An earlier attempt recorded the target, so it had passed the guardrails: finish it.
        resuming = resumed and not dry_run and await self._target_is(decision)
        view = await self._observe(wl)
        live = view.live
        if not live:
            return Actuation(
                plan=PlanKind.NONE,
                outcome=Outcome.SKIPPED,
                detail=f"{wl.owner_kind} {wl.display} has no running pods",
            )
        owner = await self.api.read_owner(wl.namespace, wl.owner_kind, wl.owner_name)
        opted_out_by = next((f"pod {p.key}" for p in live if is_opted_out(p.raw)), "")
        if not opted_out_by and owner is not None and is_opted_out(owner):
            opted_out_by = f"{wl.owner_kind} {wl.display}"
        subject = Subject(
            workload=wl.key,
            namespace=wl.namespace,
            decided_at=decision.decided_at,
            last_change=last_change(view.pods),
            replicas=len(live),
            opted_out_by=opted_out_by,
            busy=", ".join(f"pod {p.name} is terminating" for p in view.pods if p.terminating),
        )
        if not (verdict := opt_out(subject)).allowed:  # an opted-out workload is not looked at
            return self._skipped(PlanKind.NONE, f"{verdict.guard}: {verdict.reason}")

        problems = view.inventory.problems_of(live)
        if problems:
            text = "; ".join(map(str, problems))
            if not dry_run:
                for pod in live:
                    if mine := [p.message for p in problems if p.subject == f"pod {pod.key}"]:
                        await self._event(pod, "FractionInvalid", "; ".join(mine), warning=True)
            return Actuation(
                plan=PlanKind.NONE,
                outcome=Outcome.SKIPPED,
                detail=f"cannot plan {wl.display}: {text}",
                error=text,
            )
        backends = {p.backend for p in live}
        if None in backends or len(backends) != 1:
            what = sorted(b.value if b else "none" for b in backends)
            return self._skipped(
                PlanKind.NONE,
                f"{wl.display}'s pods do not all hold a fractional GPU share of one kind "
                f"(KAI annotation or HAMi limits): {', '.join(what)}",
            )
        backend = next(b for b in backends if b is not None)
        plan = plan_workload(
            view.inventory.state,
            wl,
            view.inventory.placements_of(live),
            decision.new_fraction,
            in_place=backend is GpuBackend.KAI,
        )
        if backend is GpuBackend.HAMI and plan.kind is not PlanKind.NONE:
            plan = plan.model_copy(
                update={"reason": f"HAMi cannot change a running pod's limits: {plan.reason}"}
            )
        primary = self._primary(plan, decision)
        if self._disruptive(plan):  # another replica may have led, and disrupted, since
            await self._load_disruptions()
        verdict = check(
            subject,
            disruptive=self._disruptive(plan),
            state=self.guards,
            settings=self.settings.guardrails,
            now=now,
        )
        if resuming:
            verdict = Verdict.allow("resumed", "an earlier attempt passed the guardrails")
            log.info(
                "finishing an interrupted decision", extra={"decision_id": decision.decision_id}
            )
        if plan.kind is PlanKind.NONE:
            if resuming:
                done = (
                    f"finished by an earlier attempt that stopped before reporting: {plan.reason}"
                )
                return self._result(view.inventory, plan.kind, primary, Outcome.APPLIED, done)
            return self._result(view.inventory, plan.kind, primary, Outcome.SKIPPED, plan.reason)
        if dry_run:
            would = f"{dry_run}: would {plan.kind.value} ({backend.value}): {plan.reason}"
            if not verdict.allowed:
                would += f"; but the guardrails would skip it: {verdict.guard}: {verdict.reason}"
            return self._result(view.inventory, plan.kind, primary, Outcome.DRY_RUN, would)
        if not verdict.allowed:
            return self._result(
                view.inventory,
                plan.kind,
                primary,
                Outcome.SKIPPED,
                f"{verdict.guard}: {verdict.reason} (plan was {plan.kind.value}: {plan.reason})",
            )
        return await self._execute(decision, view, plan, backend, primary, owner, now, resuming)

    @staticmethod
    def _primary(plan: WorkloadPlan, decision: FractionDecision) -> ResizePlan | None:
        """The step reported in the result: the decision's pod, else the first."""
        return next(
            (s for s in plan.steps if s.pod == decision.pod),
            plan.steps[0] if plan.steps else None,
        )

    @staticmethod
    def _skipped(plan: PlanKind, detail: str) -> Actuation:
        return Actuation(plan=plan, outcome=Outcome.SKIPPED, detail=detail)

    @staticmethod
    def _result(
        inventory: Inventory,
        kind: PlanKind,
        step: ResizePlan | None,
        outcome: Outcome,
        detail: str,
        error: str | None = None,
    ) -> Actuation:
        if step is None:
            return Actuation(plan=kind, outcome=outcome, detail=detail, error=error)
        applied = outcome is Outcome.APPLIED
        return Actuation(
            plan=kind,
            outcome=outcome,
            detail=detail,
            fraction_before=step.fraction_before,
            fraction_after=step.fraction_after if applied else step.fraction_before,
            node_before=inventory.gpu_node(step.gpu_before),
            node_after=inventory.gpu_node(step.gpu_after),
            gpu_before=step.gpu_before,
            gpu_after=step.gpu_after,
            error=error,
        )

    async def _execute(
        self,
        decision: FractionDecision,
        view: _View,
        plan: WorkloadPlan,
        backend: GpuBackend,
        primary: ResizePlan | None,
        owner: dict[str, Any] | None,
        now: datetime,
        resuming: bool = False,
    ) -> Actuation:
        wl, inventory = decision.workload, view.inventory
        by_name = {p.name: p for p in view.live}
        key = wl.key
        self.guards = self.guards.begin(key)
        try:
            target = await self._record_target(decision, backend, view, now)
            window = self.settings.guardrails.window_s
            counted = resuming and any(
                a.workload == key for a in self.guards.pruned(now, window).recent
            )
            if self._disruptive(plan) and not counted:
                # Recorded, and kept, before any pod is touched: a crash cannot hide it.
                self.guards = self.guards.record(Action(key, wl.namespace, now), window)
                await self._save_disruptions()
            notes = ["resumed: target recorded" if resuming else "target recorded"]
            if self.settings.targets_via == "template":
                note, error = await self._patch_template(target, owner)
                notes.append(note)
                if error is not None:
                    return self._result(
                        inventory,
                        plan.kind,
                        primary,
                        Outcome.FAILED,
                        f"{plan.reason}; {'; '.join(notes)}",
                        error,
                    )
            # In plan order: each step was planned on the cluster the earlier ones leave, so
            # a resize that counts on a pod having moved out waits for that eviction.
            for step in plan.steps:
                if step.kind is PlanKind.IN_PLACE:
                    await self._resize_in_place(decision, by_name[step.pod], step, view, now)
                    notes.append(f"{step.pod} resized in place to {step.fraction_after:g}")
                elif step.kind is PlanKind.RECREATE_ELSEWHERE:
                    error = await self._evict(decision, by_name[step.pod], step)
                    if error is not None:
                        return self._result(
                            inventory,
                            plan.kind,
                            primary,
                            Outcome.FAILED,
                            f"{plan.reason}; {'; '.join(notes)}; {error}",
                            error,
                        )
                    notes.append(f"{step.pod} evicted")
            scale_ups = plan.steps_of(PlanKind.SCALE_UP)
            if scale_ups:
                await self._request_capacity(decision, [by_name[s.pod] for s in scale_ups], now)
                notes.append(
                    "capacity requested for "
                    + ", ".join(s.pod for s in scale_ups)
                    + " (placeholder pods); they move once a GPU is free"
                )
                self.pending[key].notes = notes
            else:
                await self._publish_allocation(wl, inventory, plan.steps)
            return self._result(
                inventory, plan.kind, primary, Outcome.APPLIED, f"{plan.reason}; {'; '.join(notes)}"
            )
        finally:
            if key not in self.pending:
                self.guards = self.guards.end(key)

    # --- the actions ------------------------------------------------------------------------

    async def _record_target(
        self, decision: FractionDecision, backend: GpuBackend, view: _View, now: datetime
    ) -> WorkloadTarget:
        target = WorkloadTarget(
            workload=decision.workload,
            fraction=decision.new_fraction,
            memory_mib=self._memory_mib(decision, view),
            backend=backend,
            decision_id=decision.decision_id,
            updated_at=now,
        )
        await self.targets.put(subjects.kv_key(decision.workload), target.to_json())
        return target

    def _disruptive(self, plan: WorkloadPlan) -> bool:
        """Evicting pods is disruptive; so is every template patch (a rollout replaces every
        pod), counted before we know whether the template already holds the target."""
        return plan.disruptive or (
            self.settings.targets_via == "template" and plan.kind is not PlanKind.NONE
        )

    async def _patch_template(
        self, target: WorkloadTarget, owner: dict[str, Any] | None
    ) -> tuple[str, str | None]:
        """targets_via=template: size the workload's pod template; (a note, an error or None).

        Every patch that changes the template starts a rollout, and the log says so."""
        wl = target.workload
        what = f"{wl.owner_kind} {wl.display}"
        if wl.owner_kind not in TEMPLATE_KINDS or owner is None:
            log.warning(
                "no pod template to patch: without the webhook new pods keep the old share",
                extra={"workload": wl.key, "kind": wl.owner_kind},
            )
            return f"{what}'s pod template not patched (only a Deployment's or StatefulSet's)", None
        sizing, ops = template_patch(owner, target)
        if not sizing.applies:
            log.warning(
                "pod template cannot take the target",
                extra={"workload": wl.key, "reason": sizing.reason},
            )
            return f"{what}'s pod template not patched: {sizing.reason}", None
        if not ops:
            return f"{what}'s pod template holds the target already", None
        log.warning(
            "patching the pod template: this starts a rollout that replaces every pod of the "
            "workload",
            extra={
                "workload": wl.key,
                "change": sizing.reason,
                "decision_id": target.decision_id,
            },
        )
        try:
            await self.api.patch_pod_template(wl.namespace, wl.owner_kind, wl.owner_name, ops)
        except Exception as exc:
            error = f"pod template patch of {what} failed ({status_of(exc)}): {_api_message(exc)}"
            log.warning("pod template patch failed", extra={"workload": wl.key, "error": error})
            return "pod template not patched", error
        return f"pod template patched ({sizing.reason}): a rollout replaces every pod", None

    async def _publish_allocation(
        self, workload: WorkloadRef, inventory: Inventory, steps: tuple[ResizePlan, ...]
    ) -> None:
        """The workload's Allocation, where its pods are once the steps are done.

        One record per workload under ``subjects.kv_key(workload)`` (the key the simulated
        cluster uses and ingest reads), for the first pod by name among those that keep their
        name (in place or unchanged), else the first evicted one (its replacement's name is not
        known yet). A pod whose GPU is not known yet (a scale-up's) has no record; failing to
        write one never fails the action.
        """
        if self.allocations is None:
            return
        known = [s for s in steps if s.gpu_after and inventory.state.gpu(s.gpu_after)]
        kept = [s for s in known if s.kind in (PlanKind.IN_PLACE, PlanKind.NONE)]
        step = min(kept or known, key=lambda s: s.pod, default=None)
        gpu = inventory.state.gpu(step.gpu_after) if step is not None else None
        if step is None or gpu is None:
            return
        allocation = allocation_for(workload, step.pod, gpu, step.fraction_after, utcnow())
        try:
            await self.allocations.put(subjects.kv_key(workload), allocation.to_json())
        except Exception as exc:
            log.warning(
                "could not publish the allocation",
                extra={"workload": workload.key, "error": str(exc)[:300]},
            )

    @staticmethod
    def _memory_mib(decision: FractionDecision, view: _View) -> int:
        """The new share in MiB of the workload's GPUs (KAI divides by the node's label)."""
        for placement in view.inventory.placements_of(view.live):
            gpu = view.inventory.state.gpu(placement.gpu_uuid)
            if gpu is not None:
                return round(decision.new_fraction * gpu.memory_bytes / 2**20)
        return decision.new_memory_mib

    async def _resize_in_place(
        self,
        decision: FractionDecision,
        pod: PodInfo,
        step: ResizePlan,
        view: _View,
        now: datetime,
    ) -> None:
        annotations = {RESIZED_AT: now.isoformat(), DECISION_ID: decision.decision_id}
        if pod.share is not None and pod.share.kai_key == KAI_MEMORY:
            annotations[KAI_MEMORY] = str(self._memory_mib(decision, view))
        else:
            annotations[KAI_FRACTION] = f"{step.fraction_after:g}"
        version = await self.api.patch_pod_annotations(pod.namespace, pod.name, annotations)
        self._fence(Fence("pods", version, None if version else (pod.namespace, pod.name)))
        await self._event(
            pod,
            "FractionResized",
            f"GPU share {step.fraction_before:g} -> {step.fraction_after:g} in KAI's "
            f"accounting now; the container gets it when the pod is next recreated. "
            f"{decision.explanation} (decision {decision.decision_id}: {step.reason})",
        )

    async def _evict(
        self, decision: FractionDecision, pod: PodInfo, step: ResizePlan
    ) -> str | None:
        """Evict, retrying refusals and failures with jittered backoff; the error after the
        last attempt, or None. After a failure that may have evicted the pod all the same (no
        answer, 5xx) the pod is read before another eviction is sent."""
        await self._event(
            pod,
            "FractionEvictionRequested",
            f"evicting to recreate at GPU share {step.fraction_after:g} "
            f"(was {step.fraction_before:g}): {decision.explanation} "
            f"(decision {decision.decision_id}: {step.reason})",
        )
        s = self.settings
        attempts = 0
        unsure = False  # the last eviction may have taken effect: look before sending another
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retry_eviction),
                stop=stop_after_attempt(s.eviction_attempts),
                wait=wait_exponential(multiplier=s.eviction_backoff_s, max=s.eviction_backoff_max_s)
                + wait_random(0, s.eviction_backoff_s),  # jitter: replicas do not retry in step
                reraise=True,
            ):
                with attempt:
                    if unsure and await self.api.pod_is_going(pod.namespace, pod.name, pod.uid):
                        log.info("an unanswered eviction took effect", extra={"pod": pod.key})
                        break
                    attempts += 1
                    try:
                        await self.api.evict(pod.namespace, pod.name)
                    except Exception as exc:
                        unsure = unanswered(exc) or (status_of(exc) or 0) >= 500
                        raise
        except Exception as exc:
            await self._fence_pod(pod.namespace, pod.name)
            status = status_of(exc)
            if status == 404:
                return None  # gone already: its replacement gets the target
            if unsure and await self._went_all_the_same(pod):
                return None
            if status == 429:
                error = (
                    f"eviction of {pod.key} refused {attempts} times "
                    f"(429: {_api_message(exc)}); not forced"
                )
            else:
                error = f"eviction of {pod.key} failed ({status}): {_api_message(exc)}"
            await self._event(pod, "FractionEvictionFailed", error, warning=True)
            log.warning("eviction failed", extra={"pod": pod.key, "error": error})
            return error
        await self._fence_pod(pod.namespace, pod.name)
        log.info("evicted", extra={"pod": pod.key, "attempts": attempts})
        return None

    async def _went_all_the_same(self, pod: PodInfo) -> bool:
        """After the last eviction failed without a clear answer: whether it took effect, so
        that the result says what happened (False when that cannot be read either)."""
        try:
            going = await self.api.pod_is_going(pod.namespace, pod.name, pod.uid)
        except Exception:
            return False
        if going:
            log.info("the last, unanswered eviction took effect", extra={"pod": pod.key})
        return going

    async def _fence_pod(self, namespace: str, name: str) -> None:
        """After an eviction (done or not): the cache must show the pod as it is now."""
        if self.cache is None:
            return
        try:
            version = await self.api.read_pod_version(namespace, name)
        except Exception:  # cannot tell: the next decision lists afresh
            self._fence(Fence("pods", 2**62))
            return
        self._fence(Fence("pods", version, gone=None if version else (namespace, name)))

    async def _request_capacity(
        self, decision: FractionDecision, pods: list[PodInfo], now: datetime
    ) -> None:
        await self.api.ensure_priority_class(
            PRIORITY_CLASS,
            PRIORITY_VALUE,
            "fracpilot placeholder pods: ask the autoscaler for a GPU before a pod moves",
        )
        pending = PendingScaleUp(decision=decision, started_at=now, placeholders={})
        for pod in pods:
            namespace = self.settings.capacity_namespace or pod.namespace
            name = placeholder_name(pod.namespace, pod.name)
            body = placeholder_pod(
                name=name,
                namespace=namespace,
                decision=decision,
                pod=pod,
                image=self.settings.placeholder_image,
            )
            try:
                version = await self.api.create_pod(namespace, body)
                self._fence(Fence("pods", version))
            except Exception as exc:
                if status_of(exc) != 409:  # 409: it is there from an earlier attempt
                    raise
            pending.placeholders[pod.name] = (namespace, name)
            await self._event(
                pod,
                "CapacityRequested",
                f"GPU share {decision.new_fraction:g} fits on no GPU: asked for a GPU with "
                f"placeholder pod {namespace}/{name}; the pod is evicted once it exists. "
                f"{decision.explanation} (decision {decision.decision_id})",
            )
        self.pending[decision.workload.key] = pending

    async def _event(self, pod: PodInfo, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on the pod; failing to write one never fails the action."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        suffix = hashlib.sha256(f"{reason}{message}{now}".encode()).hexdigest()[:10]
        body = {
            "metadata": {"name": f"{pod.name}.{suffix}"[:253], "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "fracpilot-actuator"},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.create_event(pod.namespace, body)
        except Exception as exc:
            log.warning(
                "could not write an event",
                extra={"pod": pod.key, "reason": reason, "error": str(exc)[:300]},
            )

    # --- scale-ups waiting for capacity -----------------------------------------------------

    async def reconcile(self, now: datetime) -> None:
        """Move the pods of each waiting scale-up whose capacity now exists; give up on time."""
        for key, pending in list(self.pending.items()):
            try:
                await self._advance(pending, now)
            except Exception:
                log.exception("scale-up check failed; trying again", extra={"workload": key})

    async def _advance(self, pending: PendingScaleUp, now: datetime) -> None:
        decision = pending.decision
        view = await self._observe(decision.workload)
        inventory = view.inventory
        live = {p.name: p for p in view.live}
        placements = {p.pod: p for p in inventory.placements_of(view.live)}
        bound = {(p.namespace, p.name): p.node for p in inventory.placeholders if p.node}
        timed_out = now - pending.started_at > timedelta(seconds=self.settings.capacity_timeout_s)
        state, last = inventory.state, None
        done: list[ResizePlan] = []
        for pod_name, (namespace, placeholder) in list(pending.placeholders.items()):
            pod, placement = live.get(pod_name), placements.get(pod_name)
            if pod is not None and placement is not None:
                step = plan_pod(
                    state, placement, decision.new_fraction, in_place=pod.backend is GpuBackend.KAI
                )
                node = bound.get((namespace, placeholder))
                if step.kind is PlanKind.SCALE_UP and node is None:  # no capacity yet
                    if not timed_out:
                        continue
                    error = (
                        f"no GPU with {decision.new_fraction:g} free appeared within "
                        f"{self.settings.capacity_timeout_s:g} s; placeholder removed"
                    )
                    await self._event(pod, "CapacityNotAvailable", error, warning=True)
                    await self._finish(pending, Outcome.FAILED, inventory, step, error)
                    return
                state, last = apply_pod_plan(state, step), step
                done.append(step)
            # Free the placeholder's GPU first: the recreated pod is to take it.
            await self.api.delete_pod(namespace, placeholder)
            self._fence(Fence("pods", gone=(namespace, placeholder)))
            pending.placeholders.pop(pod_name)
            if pod is None or placement is None:
                pending.notes.append(f"{pod_name} is gone; its replacement gets the target")
            elif step.kind is PlanKind.IN_PLACE:
                await self._resize_in_place(decision, pod, step, view, now)
                pending.notes.append(f"{pod_name} now fits on its GPU: resized in place")
            elif step.kind is not PlanKind.NONE:
                where = node or inventory.gpu_node(step.gpu_after) or "a node the scheduler found"
                failure = await self._evict(decision, pod, step)
                if failure is not None:
                    await self._finish(pending, Outcome.FAILED, inventory, step, failure)
                    return
                pending.notes.append(f"capacity appeared on {where}; {pod_name} evicted")
        if not pending.placeholders:
            await self._publish_allocation(decision.workload, inventory, tuple(done))
            await self._finish(pending, Outcome.APPLIED, inventory, last, None)

    async def _finish(
        self,
        pending: PendingScaleUp,
        outcome: Outcome,
        inventory: Inventory,
        step: ResizePlan | None,
        error: str | None,
    ) -> None:
        for namespace, placeholder in pending.placeholders.values():
            await self.api.delete_pod(namespace, placeholder)
            self._fence(Fence("pods", gone=(namespace, placeholder)))
        key = pending.decision.workload.key
        self.pending.pop(key, None)
        self.guards = self.guards.end(key)
        detail = "; ".join([*pending.notes, *([error] if error else [])])
        await self.report(
            pending.decision,
            self._result(inventory, PlanKind.SCALE_UP, step, outcome, detail, error),
        )
