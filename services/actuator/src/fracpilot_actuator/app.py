"""The one place that wires the actuator: settings in, a running service out.

:class:`ActuatorService` builds the cluster backend named by ``FRACPILOT_BACKEND``
(``simulated``: :mod:`fracpilot_actuator.simulated.backend`; ``kubernetes``:
:mod:`fracpilot_actuator.kube.backend` on its NATS KV stores), the admission webhook (every
replica, leader or not), leader election (backend=kubernetes: only the Lease holder acts) and
the :class:`~fracpilot_actuator.decision_handler.DecisionHandler` that consumes the decisions.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import Counter

from fracpilot_actuator.actuation import Actuation, ClusterBackend
from fracpilot_actuator.decision_handler import DecisionHandler
from fracpilot_actuator.election.core import ElectionTiming
from fracpilot_actuator.election.elector import LeaderElector
from fracpilot_actuator.election.lease_stores import KubernetesLeaseStore
from fracpilot_actuator.metrics import ActuatorMetrics, ConsolidationMetrics
from fracpilot_actuator.settings import CLUSTER_KINDS, ActuatorSettings
from fracpilot_actuator.simulated.backend import SimulatedBackend
from fracpilot_actuator.simulated.cluster import SimulatedCluster, parse_seed_pods, seed_cluster
from fracpilot_actuator.stores.nats_kv import (
    KvAllocationStore,
    KvConsolidationProgress,
    KvDisruptionHistory,
    KvPendingRecreates,
    KvTargetStore,
)
from fracpilot_actuator.webhook import WebhookServer, start_webhook
from fracpilot_libs.contracts import FractionDecision, utcnow
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.runtime import ServiceRuntime

if TYPE_CHECKING:
    from fracpilot_actuator.kube.api import KubeApi
    from fracpilot_actuator.kube.namespaces import NamespaceLabels
    from fracpilot_actuator.policy_sync.controller import PolicySync
    from fracpilot_actuator.policy_sync.recommendations import RecommendationWriter

log = logging.getLogger(__name__)
SERVICE = "actuator"
GIB = 1024**3


class ActuatorService:
    def __init__(
        self,
        settings: ActuatorSettings,
        span_processor: SpanProcessor | None = None,
        kube_api: Any = None,
    ):
        """``kube_api``: an authenticated kubernetes ``ApiClient`` (else from the settings)."""
        if settings.backend not in CLUSTER_KINDS:
            raise ValueError(
                f"unknown backend {settings.backend!r}; known: {', '.join(CLUSTER_KINDS)}"
            )
        self.settings = settings
        self.runtime = ServiceRuntime(SERVICE, settings, span_processor)
        # Set once this replica acts on decisions (at once, or once it leads and took up the
        # previous leader's work).
        self.acting = asyncio.Event()
        self.metrics = ActuatorMetrics(self.runtime.registry)
        self.backend: ClusterBackend | None = None
        self.cluster: SimulatedCluster | None = None
        self.handler: DecisionHandler | None = None
        self._kube_api = kube_api
        self._tasks: list[asyncio.Task[None]] = []
        self._standby: asyncio.Task[None] | None = None
        self._stopping = False  # a standby that has not begun acting never does
        self.webhook: WebhookServer | None = None
        self.elector: LeaderElector | None = None
        self.policy_sync: PolicySync | None = None
        self.recommendations: RecommendationWriter | None = None
        self._kube: KubeApi | None = None
        self.namespaces: NamespaceLabels | None = None

    @property
    def resumed(self) -> Counter:
        """Decisions taken up again after an attempt that stopped before it finished."""
        return self.metrics.resumed

    async def start(self) -> None:
        bus = self.runtime.bus
        s = self.settings
        if s.backend == "kubernetes":
            await self._start_namespace_labels()
        if s.webhook.enabled:
            namespaces = self.namespaces
            self.webhook, _ = await start_webhook(
                bus,
                self.runtime.registry,
                s.webhook,
                cluster=s.cluster,
                opt_in=s.optin,
                namespace_labels=namespaces.cached if namespaces is not None else None,
                hami_memory_factor=s.hami.memory_factor,
            )
        claims = await bus.kv(subjects.ACTUATOR_STATE_BUCKET)
        if s.backend == "kubernetes":
            backend = await self._kubernetes_backend(claims)
        else:
            backend = await self._simulated_backend(claims)
        self.backend = backend
        await backend.start(utcnow())
        if s.backend == "kubernetes" and s.leader_election:
            self.elector = LeaderElector(
                KubernetesLeaseStore(self._kube_api, s.namespace),
                s.identity,
                ElectionTiming(
                    lease_duration_s=s.lease.duration_s,
                    renew_deadline_s=s.lease.renew_deadline_s,
                    renew_period_s=s.lease.renew_period_s,
                    retry_period_s=s.lease.retry_period_s,
                ),
                registry=self.runtime.registry,
                on_stopped_leading=self._lost_leadership,
            )
        self.handler = DecisionHandler(s, bus, claims, backend, self.metrics, self.elector)
        if self.elector is not None:
            await self.elector.start()
            self._standby = asyncio.create_task(self._act_once_leading(), name="standby")
        else:
            await self._begin_acting()

    async def _start_namespace_labels(self) -> None:
        """Watch the namespaces' labels: the opt-in rule of the backend and the webhook."""
        from fracpilot_actuator.kube.api import api_client
        from fracpilot_actuator.kube.namespaces import NamespaceLabels

        if self._kube_api is None:
            self._kube_api = await asyncio.to_thread(api_client, self.settings.kubeconfig)
        self.namespaces = NamespaceLabels(self._kube_api, timeout_s=self.settings.kube.timeout_s)
        self.namespaces.start()

    async def _act_once_leading(self) -> None:
        assert self.elector is not None
        log.info("standing by for the lease", extra={"identity": self.elector.identity})
        await self.elector.wait_for_leadership()
        assert self.backend is not None
        # What it read at its start is out of date: the old leader went on acting since.
        try:
            await self.backend.resume(utcnow())
            # The stop's cancel may be lost in resume's KV reads (nats-py's wait_for: see
            # DecisionHandler.stop); a stopped standby must not start acting.
            if self._stopping:
                return
            await self._begin_acting()
        except Exception:
            # A leader that cannot take up its predecessor's work must not sit on the lease
            # doing nothing: exit, and come back (restarted by the Deployment) as a standby.
            log.exception("could not start acting as the leader: stopping")
            self.runtime.stop_requested.set()

    def _lost_leadership(self) -> None:
        # As controller-runtime does: a replica that lost the lease exits, and comes back
        # (restarted by its Deployment) as a standby. Nothing acts after this point: every
        # action checks is_leader under the action lock.
        log.error("lost the lease: stopping so that only the new leader acts")
        self.runtime.stop_requested.set()

    async def _begin_acting(self) -> None:
        assert self.handler is not None
        if self.settings.backend == "kubernetes" and self.settings.policysync.enabled:
            await self._start_policy_sync()
        if self._kube is not None and self.settings.policysync.recommendations != "off":
            self._start_recommendations(self._kube)
        self._tasks.append(asyncio.create_task(self.handler.reconcile_loop(), name="reconcile"))
        await self.runtime.bus.consume(
            stream=subjects.DECISION_STREAM,
            durable=subjects.ACTUATOR_CONSUMER,
            filter_subject=f"{subjects.DECISION_PREFIX}.>",
            model=FractionDecision,
            handler=self.handler.on_decision,
        )
        self.acting.set()

    async def _start_policy_sync(self) -> None:
        """FractionPolicy objects -> the policy bucket, on the leader only."""
        from fracpilot_actuator.kube.api import api_client
        from fracpilot_actuator.policy_sync.controller import PolicySync

        if self._kube_api is None:
            self._kube_api = await asyncio.to_thread(api_client, self.settings.kubeconfig)
        self.policy_sync = PolicySync(
            self._kube_api, self.runtime.bus, self.runtime.registry, self.settings.policysync
        )
        self.policy_sync.start()

    def _start_recommendations(self, api: KubeApi) -> None:
        """Each workload's last result as a FractionRecommendation, on the leader only."""
        from fracpilot_actuator.policy_sync.recommendations import RecommendationWriter

        assert self.handler is not None
        sync = self.settings.policysync
        writer = RecommendationWriter(
            api,
            self.runtime.registry,
            sync.timeout_s,
            scope=sync.recommendations,
            namespace_labels=self.namespaces.labels_of if self.namespaces is not None else None,
            opt_in=self.settings.optin,
            recheck_s=sync.recommendations_recheck_s,
        )
        writer.start()
        self.handler.on_result = writer.offer
        self.recommendations = writer

    async def _simulated_backend(self, claims: KvBucket) -> SimulatedBackend:
        sim = self.settings.sim
        cluster = self.cluster = SimulatedCluster(
            claims,
            await self.runtime.bus.kv(subjects.ALLOCATION_BUCKET),
            sim.gpus_per_node,
            sim.gpu_memory_gib * GIB,
        )
        seed = seed_cluster(
            sim.nodes,
            sim.gpus_per_node,
            sim.gpu_memory_gib * GIB,
            parse_seed_pods(sim.pods, sim.cluster),
        )
        return SimulatedBackend(
            cluster,
            lambda: cluster.load_or_seed(seed),
            self.settings.optin,
            sim.namespace_labels,
            consolidation=self.settings.consolidation,
            publish=self.runtime.bus.publish,
            cluster_name=sim.cluster,
        )

    async def _kubernetes_backend(self, claims: KvBucket) -> ClusterBackend:
        from fracpilot_actuator.kube.api import KubeApi, api_client
        from fracpilot_actuator.kube.api_retry import ApiRetry
        from fracpilot_actuator.kube.backend import KubernetesBackend
        from fracpilot_actuator.kube.settings import KubeBackendSettings

        s = self.settings
        settings = KubeBackendSettings(
            cluster=s.cluster,
            node_selector=s.gpu_node_selector,
            default_gpu_memory_mib=s.default_gpu_memory_mib,
            hami_memory_factor=s.hami.memory_factor,
            eviction=s.eviction,
            capacity_timeout_s=s.capacity.timeout_s,
            placeholder_priority=s.capacity.priority,
            verify_timeout_s=s.verify.timeout_s,
            corrections=s.verify.corrections,
            capacity_namespace=s.capacity.namespace or s.namespace,
            placeholder_image=s.placeholder_image,
            targets_via=s.targets_via,
            inventory_cache=s.inventory_cache,
            guardrails=s.guardrails,
            opt_in=s.optin,
            kai=s.kai,
            consolidation=s.consolidation,
        )
        if self._kube_api is None:
            self._kube_api = await asyncio.to_thread(api_client, s.kubeconfig)
        kube = s.kube
        api = KubeApi(
            self._kube_api,
            timeout_s=kube.timeout_s,
            retry=ApiRetry(kube.retry_attempts, kube.retry_backoff_s, kube.retry_backoff_max_s),
            on_retry=self.metrics.track_kube_retries(),
        )
        self._kube = api
        bus = self.runtime.bus
        return KubernetesBackend(
            api,
            KvTargetStore(await bus.kv(subjects.TARGET_BUCKET)),
            settings,
            report=self._report_finished,
            allocations=KvAllocationStore(await bus.kv(subjects.ALLOCATION_BUCKET)),
            history=KvDisruptionHistory(claims),
            namespaces=self.namespaces,
            pending_recreates=KvPendingRecreates(claims),
            consolidation_metrics=ConsolidationMetrics(self.runtime.registry),
            consolidation_events=bus.publish,
            consolidation_progress=KvConsolidationProgress(claims),
        )

    async def _report_finished(self, decision: FractionDecision, actuation: Actuation) -> None:
        assert self.handler is not None
        await self.handler.report(decision, actuation, actuation.stage or "finished")

    async def stop(self) -> None:
        self._stopping = True
        if self._standby is not None:  # first: it would start the loops stopped below
            self._standby.cancel()
            await asyncio.gather(self._standby, return_exceptions=True)
            self._standby = None
        if self.policy_sync is not None:
            await self.policy_sync.stop()
        if self.recommendations is not None:
            await self.recommendations.stop()
        if self.webhook is not None:
            await self.webhook.stop()
        if self.handler is not None:
            self.handler.stop()  # ends the reconcile loop even if a library loses the cancel
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.elector is not None:
            lock = self.handler.lock if self.handler is not None else asyncio.Lock()
            async with lock:  # the action in hand finishes before the lease is released
                await self.elector.stop(release=True)
        if self.backend is not None:
            self.backend.close()  # the Kubernetes backend's watches
        if self.namespaces is not None:
            self.namespaces.stop()

    async def run(self) -> None:
        await self.runtime.run(self.start, self.stop)


def main() -> None:
    from fracpilot_libs.telemetry import setup_logging

    settings = ActuatorSettings()
    setup_logging(SERVICE, settings.log_level)
    asyncio.run(ActuatorService(settings).run())


if __name__ == "__main__":
    main()
