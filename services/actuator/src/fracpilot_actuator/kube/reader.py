"""How the Kubernetes backend reads the cluster for one decision.

With ``inventory_cache`` on, nodes, pods, ReplicaSets, Jobs and KAI's BindRequests and Queues
come from :class:`~fracpilot_actuator.kube.cache.InventoryCache`, kept current by watches,
instead of being listed per decision. The cache is never older than the backend's own
writes: each write leaves a :class:`Fence` (the write's resourceVersion, or the pod that must
be gone), and a read waits up to ``cache_fence_timeout_s`` for the watches to pass it, else
lists afresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.cache import Fence, InventoryCache
from fracpilot_actuator.kube.cluster_view import ClusterView
from fracpilot_actuator.kube.enforcement import Enforcement, configmaps_of, enforcement_map
from fracpilot_actuator.kube.inventory import Inventory, PodInfo, build_inventory, owner_parents
from fracpilot_actuator.kube.kai_objects import KaiReader
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.owners import Controller, OwnerKey

log = logging.getLogger(__name__)

RawLists = tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any], list[Any]]


def owner_links(replica_sets: list[Any], jobs: list[Any]) -> dict[OwnerKey, Controller]:
    """ReplicaSet -> Deployment and Job -> CronJob, as :func:`~fracpilot_libs.owners.top_owner`
    walks them."""
    return owner_parents(replica_sets, "ReplicaSet") | owner_parents(jobs, "Job")


class ClusterReader:
    """Reads a workload's :class:`ClusterView`, from the cache when it is current."""

    def __init__(self, api: KubeApi, settings: KubeBackendSettings) -> None:
        self.api = api
        self.settings = settings
        self.cache = (
            InventoryCache(
                api.api, settings.node_selector, timeout_s=api.timeout_s, kai=settings.kai
            )
            if settings.inventory_cache
            else None
        )
        self._fences: list[Fence] = []
        self._logged_problems: set[str] = set()
        self.kai = KaiReader(api, settings.kai, self.cache)  # BindRequests and Queues
        self.fresh_lists = 0  # decisions that listed because the cache was behind

    def fence(self, fence: Fence) -> None:
        """The next read must see the cluster as it is after this write."""
        if self.cache is not None:
            self._fences.append(fence)

    async def _from_cache(self, namespace: str) -> RawLists | None:
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

    async def nodes_and_pods(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every node (of the node selector) and every pod: from the cache when it is current,
        else listed (consolidation reads the whole cluster)."""
        cached = await self._from_cache("")
        if cached is not None:
            return cached[0], cached[1]
        nodes, pods = await asyncio.gather(
            self.api.list_nodes(self.settings.node_selector), self.api.list_pods()
        )
        return nodes, pods

    async def owners(self, namespaces: Collection[str]) -> dict[OwnerKey, Controller]:
        """The owner links of these namespaces' pods (:func:`owner_links`): from the cache once
        it is synced (no fence to wait for: our writes change no ReplicaSet nor Job), else
        listed, one namespace at a time."""
        cache = self.cache
        if cache is not None and cache.synced.is_set():
            snap = cache.snapshot()

            def mine(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return [
                    i for i in items if (i.get("metadata") or {}).get("namespace") in namespaces
                ]

            return owner_links(mine(snap.replica_sets), mine(snap.jobs))
        listed = await asyncio.gather(*(self.api.list_owners(n) for n in sorted(namespaces)))
        return owner_links([r for rs, _ in listed for r in rs], [j for _, js in listed for j in js])

    async def observe(self, workload: WorkloadRef, *, fresh: bool = False) -> ClusterView:
        """The cluster and the workload's pods (the workload object is not read here);
        ``fresh``: listed from the API server, never the cache (after a conflict)."""
        cached = None if fresh else await self._from_cache(workload.namespace)
        if cached is not None:
            nodes, pods, replica_sets, jobs = cached
        else:
            (nodes, pods), (replica_sets, jobs) = await asyncio.gather(
                asyncio.gather(
                    self.api.list_nodes(self.settings.node_selector), self.api.list_pods()
                ),
                self.api.list_owners(workload.namespace),
            )
        kai = await self.kai.read()
        inventory = build_inventory(
            nodes,
            pods,
            cluster=self.settings.cluster,
            default_gpu_memory_mib=self.settings.default_gpu_memory_mib,
            kai=self.settings.kai,
            bound=kai.bound,
            hami_memory_factor=self.settings.hami_memory_factor,
        )
        for problem in inventory.problems:
            if (text := str(problem)) not in self._logged_problems:
                self._logged_problems.add(text)
                log.warning("cluster problem", extra={"problem": text})
        parents = owner_links(replica_sets, jobs)
        mine = inventory.pods_of(workload, parents)
        enforcement = await self._enforcement(workload.namespace, mine, inventory)
        return ClusterView(
            inventory,
            mine,
            enforcement=enforcement,
            queues=kai.queues,
            pod_groups=kai.pod_groups,
            owners=parents,
        )

    async def _enforcement(
        self, namespace: str, pods: tuple[PodInfo, ...], inventory: Inventory
    ) -> dict[str, Enforcement]:
        """Each live pod's enforced memory limit; KAI's comes from the GPU-sharing ConfigMap
        its env refers to (read here; one that cannot be read leaves the limit unknown)."""
        live = [p for p in pods if not p.terminating]
        names = sorted({n for p in live for n in configmaps_of(p)})
        data: dict[str, dict[str, str] | None] = {}
        for name in names:
            try:
                data[name] = await self.api.read_configmap(namespace, name)
            except Exception as exc:
                log.warning(
                    "GPU-sharing ConfigMap not read: its pods' limits are unknown",
                    extra={"configmap": f"{namespace}/{name}", "error": str(exc)[:300]},
                )
                data[name] = None
        return enforcement_map(live, inventory, data, self.settings.default_gpu_memory_mib)
