"""The actuator service: a thin NATS adapter that turns decisions into cluster changes.

For each decision it claims the decision id in KV before acting (so a redelivered or
republished decision is applied at most once), hands it to the cluster backend (which plans
with the pure planner and executes the plan), and publishes an ``ActuationResult`` saying
what it did and why. Recommend-mode decisions and dry-run are recorded without changing
anything. Backends (``FRACPILOT_BACKEND``): ``simulated`` (the demo's cluster in NATS KV) and
``kubernetes`` (KAI Scheduler and HAMi pods through the API server, with guardrails:
:mod:`fracpilot_actuator.kube.backend`). Decisions are handled one at a time; a scale-up that
waits for capacity is carried on by a periodic check, which reports its end separately.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from nats.aio.msg import Msg
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter
from pydantic import Field

from fracpilot_actuator.backends import Actuation, ClusterBackend, SimulatedBackend
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.leader import ElectionTiming, KubernetesLeaseStore, LeaderElector
from fracpilot_actuator.simulated_cluster import SimulatedCluster, parse_seed_pods, seed_cluster
from fracpilot_actuator.webhook import WebhookServer, start_webhook
from fracpilot_libs import subjects
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    FractionDecision,
    Mode,
    utcnow,
)
from fracpilot_libs.runtime import ServiceRuntime

log = logging.getLogger(__name__)
SERVICE = "actuator"
GIB = 1024**3


BACKENDS = ("simulated", "kubernetes")


class ActuatorSettings(ServiceSettings):
    backend: str = Field(
        default="simulated", description="cluster backend: simulated (the demo) or kubernetes"
    )
    dry_run: bool = Field(default=False, description="plan and log, change nothing")
    # kubernetes backend
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file for backend=kubernetes; in-cluster if unset"
    )
    cluster: str = Field(default="default", description="cluster name in workload keys")
    gpu_node_selector: str | None = Field(
        default=None, description="label selector of the GPU nodes to plan on; unset: all"
    )
    max_disruptions: int = Field(
        default=5, ge=0, description="disruptive actions (evictions) per window, cluster-wide"
    )
    max_disruptions_per_namespace: int = Field(
        default=2, ge=0, description="disruptive actions per window and namespace"
    )
    disruption_window_s: float = Field(
        default=600.0, gt=0, description="sliding window of the two limits above, seconds"
    )
    allow_single_replica: bool = Field(
        default=False, description="whether a workload with one pod may be recreated"
    )
    eviction_attempts: int = Field(
        default=8, ge=1, description="attempts of an eviction a PDB refuses (429) before failing"
    )
    eviction_backoff_s: float = Field(
        default=1.0, gt=0, description="first wait between eviction attempts (doubles), seconds"
    )
    eviction_backoff_max_s: float = Field(
        default=30.0, gt=0, description="longest wait between eviction attempts, seconds"
    )
    kube_timeout_s: float = Field(
        default=30.0, gt=0, description="backend=kubernetes: how long one API call may take"
    )
    kube_retry_attempts: int = Field(
        default=5,
        ge=1,
        description="tries of an API call answered 429 or 5xx or not answered, first included",
    )
    kube_retry_backoff_s: float = Field(
        default=0.2, gt=0, description="first wait before an API call is tried again (doubles)"
    )
    kube_retry_backoff_max_s: float = Field(
        default=5.0, gt=0, description="longest wait before an API call is tried again"
    )
    capacity_timeout_s: float = Field(
        default=900.0, gt=0, description="a scale-up gives up when no capacity came this long"
    )
    capacity_poll_s: float = Field(
        default=10.0, gt=0, description="how often waiting scale-ups look for capacity, seconds"
    )
    capacity_namespace: str | None = Field(
        default=None,
        description="namespace of placeholder pods; unset: the actuator's own (the RBAC in "
        "deploy/rbac/actuator.yaml allows creating pods only there)",
    )
    namespace: str = Field(
        default="fracpilot", description="the actuator's own namespace (its Lease, placeholders)"
    )
    leader_election: bool = Field(
        default=True, description="backend=kubernetes: only the Lease holder acts"
    )
    identity: str | None = Field(default=None, description="leader identity; the hostname")
    lease_duration_s: int = Field(default=15, ge=1)
    lease_renew_deadline_s: float = Field(default=10.0, gt=0)
    lease_renew_period_s: float = Field(default=5.0, gt=0)
    lease_retry_period_s: float = Field(default=2.0, gt=0)
    placeholder_image: str = "registry.k8s.io/pause:3.10"
    default_gpu_memory_mib: int = Field(
        default=81920, gt=0, description="GPU memory of nodes without nvidia.com/gpu.memory"
    )
    targets_via: Literal["webhook", "template"] = Field(
        default="webhook",
        description="backend=kubernetes: how new pods get a workload's target: the admission "
        "webhook, or (without it) a patch of the Deployment's / StatefulSet's pod template, "
        "which starts a rollout replacing every pod",
    )
    inventory_cache: bool = Field(
        default=True,
        description="backend=kubernetes: read nodes, pods, ReplicaSets and Jobs from caches "
        "kept current by watches; false: list them for every decision",
    )
    # admission webhook (every replica serves it, leader or not)
    webhook_enabled: bool = Field(
        default=False, description="serve the mutating admission webhook that sizes new pods"
    )
    webhook_host: str = "0.0.0.0"
    webhook_port: int = Field(default=8443, ge=0, le=65535)
    webhook_cert_file: str = "/etc/fracpilot/webhook/tls.crt"
    webhook_key_file: str = "/etc/fracpilot/webhook/tls.key"
    # simulated backend
    sim_cluster: str = "demo"
    sim_nodes: int = Field(default=2, ge=0)
    sim_gpus_per_node: int = Field(default=2, ge=1)
    sim_gpu_memory_gib: int = Field(default=80, ge=1)
    sim_pods: str = Field(default="", description="seed pods: ns/name=fraction,...")


class NotLeaderError(RuntimeError):
    """Raised for a decision fetched just before the lease was lost: it is redelivered."""


class ActuatorService:
    def __init__(
        self,
        settings: ActuatorSettings,
        span_processor: SpanProcessor | None = None,
        kube_api: Any = None,
    ):
        """``kube_api``: an authenticated kubernetes ``ApiClient`` (else from the settings)."""
        if settings.backend not in BACKENDS:
            raise ValueError(f"unknown backend {settings.backend!r}; known: {', '.join(BACKENDS)}")
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        self.backend: ClusterBackend | None = None
        self.cluster: SimulatedCluster | None = None
        self._kube_api = kube_api
        self._claims: KeyValue | None = None
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.webhook: WebhookServer | None = None
        self.elector: LeaderElector | None = None
        self.actions = Counter(
            "fracpilot_actuator_actions_total",
            "Decisions handled",
            ["plan", "outcome"],
            registry=self.runtime.registry,
        )
        self.resumed = Counter(
            "fracpilot_actuator_resumed_total",
            "Decisions taken up again after an attempt that stopped before it finished",
            registry=self.runtime.registry,
        )

    async def start(self) -> None:
        bus = self.runtime.bus
        s = self.settings
        if s.webhook_enabled:
            self.webhook, _ = await start_webhook(
                bus,
                self.runtime.registry,
                cert_file=s.webhook_cert_file,
                key_file=s.webhook_key_file,
                cluster=s.cluster,
                host=s.webhook_host,
                port=s.webhook_port,
            )
        self._claims = await bus.kv(subjects.ACTUATOR_STATE_BUCKET)
        if self.settings.backend == "kubernetes":
            self.backend = await self._kubernetes_backend()
        else:
            self.backend = await self._simulated_backend()
        await self.backend.start()
        if s.backend == "kubernetes" and s.leader_election:
            self.elector = LeaderElector(
                KubernetesLeaseStore(self._kube_api, s.namespace),
                s.identity,
                ElectionTiming(
                    lease_duration_s=s.lease_duration_s,
                    renew_deadline_s=s.lease_renew_deadline_s,
                    renew_period_s=s.lease_renew_period_s,
                    retry_period_s=s.lease_retry_period_s,
                ),
                registry=self.runtime.registry,
                on_stopped_leading=self._lost_leadership,
            )
            await self.elector.start()
            self._tasks.append(asyncio.create_task(self._act_once_leading(), name="standby"))
        else:
            await self._begin_acting()

    async def _act_once_leading(self) -> None:
        assert self.elector is not None
        log.info("standing by for the lease", extra={"identity": self.elector.identity})
        await self.elector.wait_for_leadership()
        await self._begin_acting()

    def _lost_leadership(self) -> None:
        # As controller-runtime does: a replica that lost the lease exits, and comes back
        # (restarted by its Deployment) as a standby. Nothing acts after this point: every
        # action checks is_leader under the action lock.
        log.error("lost the lease: stopping so that only the new leader acts")
        self.runtime.stop_requested.set()

    async def _begin_acting(self) -> None:
        self._tasks.append(asyncio.create_task(self._reconcile_loop(), name="reconcile"))
        await self.runtime.bus.consume(
            stream=subjects.DECISION_STREAM,
            durable=subjects.ACTUATOR_CONSUMER,
            filter_subject=f"{subjects.DECISION_PREFIX}.>",
            model=FractionDecision,
            handler=self.on_decision,
        )

    async def _simulated_backend(self) -> SimulatedBackend:
        assert self._claims is not None
        s = self.settings
        cluster = self.cluster = SimulatedCluster(
            self._claims,
            await self.runtime.bus.kv(subjects.ALLOCATION_BUCKET),
            s.sim_gpus_per_node,
            s.sim_gpu_memory_gib * GIB,
        )
        seed = seed_cluster(
            s.sim_nodes,
            s.sim_gpus_per_node,
            s.sim_gpu_memory_gib * GIB,
            parse_seed_pods(s.sim_pods, s.sim_cluster),
        )
        return SimulatedBackend(cluster, lambda: cluster.load_or_seed(seed))

    async def _kubernetes_backend(self) -> ClusterBackend:
        from fracpilot_actuator.kube.api import ApiRetry, KubeApi, api_client
        from fracpilot_actuator.kube.backend import KubeBackendSettings, KubernetesBackend

        s = self.settings
        settings = KubeBackendSettings(
            cluster=s.cluster,
            node_selector=s.gpu_node_selector,
            default_gpu_memory_mib=s.default_gpu_memory_mib,
            eviction_attempts=s.eviction_attempts,
            eviction_backoff_s=s.eviction_backoff_s,
            eviction_backoff_max_s=s.eviction_backoff_max_s,
            capacity_timeout_s=s.capacity_timeout_s,
            capacity_namespace=s.capacity_namespace or s.namespace,
            placeholder_image=s.placeholder_image,
            targets_via=s.targets_via,
            inventory_cache=s.inventory_cache,
            guardrails=GuardrailSettings(
                max_disruptions=s.max_disruptions,
                max_disruptions_per_namespace=s.max_disruptions_per_namespace,
                window_s=s.disruption_window_s,
                allow_single_replica=s.allow_single_replica,
            ),
        )
        if self._kube_api is None:
            self._kube_api = await asyncio.to_thread(api_client, s.kubeconfig)
        retries = Counter(
            "fracpilot_actuator_kube_retries_total",
            "Kubernetes API calls tried again (429, 5xx, no answer, 409 on a patch)",
            ["call", "reason"],
            registry=self.runtime.registry,
        )
        api = KubeApi(
            self._kube_api,
            timeout_s=s.kube_timeout_s,
            retry=ApiRetry(
                s.kube_retry_attempts, s.kube_retry_backoff_s, s.kube_retry_backoff_max_s
            ),
            on_retry=lambda call, reason: retries.labels(call, reason).inc(),
        )
        return KubernetesBackend(
            api,
            await self.runtime.bus.kv(subjects.TARGET_BUCKET),
            settings,
            report=lambda decision, actuation: self._report(decision, actuation, "finished"),
            allocations=await self.runtime.bus.kv(subjects.ALLOCATION_BUCKET),
            state=self._claims,
        )

    async def stop(self) -> None:
        if self.webhook is not None:
            await self.webhook.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.elector is not None:
            async with self._lock:  # the action in hand finishes before the lease is released
                await self.elector.stop(release=True)
        close = getattr(self.backend, "close", None)
        if close is not None:  # the Kubernetes backend's watches
            close()

    async def _reconcile_loop(self) -> None:
        """Carry on with actions that wait (a scale-up waiting for capacity)."""
        while True:
            await asyncio.sleep(self.settings.capacity_poll_s)
            assert self.backend is not None
            try:
                async with self._lock:
                    await self.backend.reconcile(utcnow())
            except Exception:
                log.exception("reconcile failed")

    async def on_decision(self, decision: FractionDecision, _msg: Msg) -> None:
        async with self._lock:  # one decision at a time
            if self.elector is not None and not self.elector.is_leader:
                raise NotLeaderError("not the leader any more: the new leader will act")
            await self._handle(decision)

    async def _claim(self, decision: FractionDecision) -> str | None:
        """Record the decision before acting; returns the earlier record if there is one."""
        assert self._claims is not None
        key = f"decision.{decision.decision_id}"
        try:
            await self._claims.create(key, b"started")
            return None
        except KeyWrongLastSequenceError:
            entry = await self._claims.get(key)
            return (entry.value or b"").decode()

    async def _handle(self, decision: FractionDecision) -> None:
        assert self.backend is not None
        assert self._claims is not None
        earlier = await self._claim(decision)
        if earlier is not None and earlier.startswith("done"):
            log.info(
                "decision already handled",
                extra={"decision_id": decision.decision_id, "record": earlier},
            )
            self.actions.labels("none", "duplicate").inc()
            return
        resumed = earlier is not None  # "started": an attempt stopped before it finished
        if resumed:
            log.warning(
                "resuming a decision whose earlier attempt did not finish",
                extra={"decision_id": decision.decision_id, "workload": decision.workload.key},
            )
            self.resumed.inc()
        why = ""
        if decision.mode is Mode.RECOMMEND:
            why = "recommend mode"
        elif self.settings.dry_run:
            why = "dry-run"
        actuation = await self.backend.actuate(decision, dry_run=why, now=utcnow(), resumed=resumed)
        await self._claims.put(
            f"decision.{decision.decision_id}", f"done:{actuation.outcome}".encode()
        )
        await self._report(decision, actuation)

    async def _report(
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
            detail=a.detail[:4000],
            error=a.error[:4000] if a.error else None,
            finished_at=utcnow(),
        )
        msg_id = f"{decision.decision_id}:result" + (f":{stage}" if stage else "")
        await self.runtime.bus.publish(
            subjects.actuation_subject(decision.workload), result, msg_id
        )
        self.actions.labels(a.plan.value, a.outcome.value).inc()
        log.info(
            "actuation",
            extra={
                "workload": decision.workload.display,
                "plan": a.plan.value,
                "outcome": a.outcome.value,
                "decision_id": decision.decision_id,
                "detail": a.detail,
            },
        )

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = ActuatorSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(ActuatorService(settings).run())


if __name__ == "__main__":
    main()
