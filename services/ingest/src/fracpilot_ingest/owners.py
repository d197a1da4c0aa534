"""Which workload a pod belongs to: decisions are per workload, not per pod.

The Kubernetes resolver follows owner references (Pod -> ReplicaSet -> Deployment, Pod ->
StatefulSet, Pod -> Job -> CronJob) from informers (:mod:`fracpilot_libs.kube.informer`: list
and watch on the event loop, a pod not cached yet read once, a miss remembered; the pods
cache also keeps what :mod:`fracpilot_ingest.pod_facts` reads). Without API access, the
pod-name resolver reads the controllers' naming conventions and says so in the workload's
kind when it has to guess (``Pod``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from fracpilot_ingest.node_facts import node_projection
from fracpilot_ingest.pod_facts import pod_projection
from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.kube.client import make_api_client
from fracpilot_libs.kube.informer import Informer
from fracpilot_libs.kube.store import metadata_only
from fracpilot_libs.owners import (
    Controller,
    OwnerKey,
    controller_of,
    owner_from_pod_name,
    top_owner,
)

log = logging.getLogger(__name__)


class OwnerResolver(Protocol):
    async def resolve(self, namespace: str, pod: str) -> WorkloadRef: ...


class PodNameOwners:
    """Guesses the owner from the pod's name; used when the Kubernetes API is not configured."""

    CACHED = 1 << 18  # pods remembered; past this the cache starts again (a bound on memory)

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        # The same pods come back every interval: their names are parsed once.
        self._known: dict[tuple[str, str], WorkloadRef] = {}

    async def resolve(self, namespace: str, pod: str) -> WorkloadRef:
        return self.owner_of(namespace, pod)

    def owner_of(self, namespace: str, pod: str) -> WorkloadRef:
        """:meth:`resolve` without a coroutine: ingest's sample loop calls it for every sample
        (nothing here waits)."""
        key = (namespace, pod)
        if (workload := self._known.get(key)) is None:
            if len(self._known) >= self.CACHED:
                self._known.clear()
            workload = self._known[key] = owner_from_pod_name(self.cluster, namespace, pod)
        return workload


# --- the Kubernetes resolver ------------------------------------------------------------------


class _Parents(Mapping[OwnerKey, Controller]):
    """The controllers of cached ReplicaSets and Jobs, as :func:`top_owner` reads them."""

    def __init__(self, by_kind: Mapping[str, Informer]) -> None:
        self._by_kind = by_kind

    def __getitem__(self, key: OwnerKey) -> Controller:
        namespace, kind, name = key
        informer = self._by_kind.get(kind)
        obj = informer.get((namespace, name)) if informer is not None else None
        parent = controller_of(obj) if obj is not None else None
        if parent is None:
            raise KeyError(key)
        return parent

    def __iter__(self) -> Iterator[OwnerKey]:
        for kind, informer in self._by_kind.items():
            for (namespace, name), obj in informer.store.items():
                if controller_of(obj) is not None:
                    yield namespace, kind, name

    def __len__(self) -> int:
        return sum(1 for _ in self)


class KubernetesOwners:
    """Owners from the Kubernetes API: pods, ReplicaSets and Jobs kept by informers.

    A pod not in the cache yet (it appeared since the last event) is read once directly,
    within ``lookup_timeout_s``; one that is not there is remembered for ``miss_ttl_s`` and
    named by the conventions meanwhile. Needs ``get``/``list``/``watch`` on pods, replicasets
    and jobs. Start and resolve on the event loop.
    """

    def __init__(
        self,
        api: Any,
        cluster: str,
        resync_s: int = 300,
        *,
        page_size: int = 500,
        lookup_timeout_s: float = 5.0,
        miss_ttl_s: float = 60.0,
        nodes: bool = False,
    ) -> None:
        from kubernetes import client

        self.cluster = cluster
        core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)

        def informer(name: str, lister: Any, reader: Any, project: Any = metadata_only) -> Informer:
            return Informer(
                name,
                lister,
                reader=reader,
                project=project,
                page_size=page_size,
                resync_s=resync_s,
                lookup_timeout_s=lookup_timeout_s,
                miss_ttl_s=miss_ttl_s,
                log_as="owner",
            )

        # Pods keep a little more than their owners: KAI's GPU groups, OOM kills (pod_facts).
        self.pods = informer(
            "pods", core.list_pod_for_all_namespaces, core.read_namespaced_pod, pod_projection
        )
        self.replicasets = informer(
            "replicasets",
            apps.list_replica_set_for_all_namespaces,
            apps.read_namespaced_replica_set,
        )
        self.jobs = informer("jobs", batch.list_job_for_all_namespaces, batch.read_namespaced_job)
        # Nodes only when asked (HAMi's register annotation; needs list/watch on nodes).
        self.nodes = (
            Informer(
                "nodes",
                core.list_node,
                project=node_projection,
                page_size=page_size,
                resync_s=resync_s,
                log_as="node",
            )
            if nodes
            else None
        )
        self._by_kind = {"ReplicaSet": self.replicasets, "Job": self.jobs}
        self._parents = _Parents(self._by_kind)

    @property
    def informers(self) -> tuple[Informer, ...]:
        extra = (self.nodes,) if self.nodes is not None else ()
        return self.pods, self.replicasets, self.jobs, *extra

    @property
    def misses(self) -> int:
        """Pods read from the API because they were not in the cache."""
        return self.pods.lookups

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    async def wait_synced(self, timeout_s: float = 30.0) -> bool:
        return all([await i.wait_synced(timeout_s) for i in self.informers])

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    async def resolve(self, namespace: str, pod: str) -> WorkloadRef:
        obj = await self.pods.get_or_read((namespace, pod))
        if obj is None:  # not there (any more) or API trouble: name conventions
            return owner_from_pod_name(self.cluster, namespace, pod)
        direct = controller_of(obj)
        kind, name = top_owner(namespace, direct, self._parents, pod)
        # Stopped at a ReplicaSet or Job: one not cached yet is read once (a cached one has
        # no controller of its own, and reading it costs nothing).
        parents = self._by_kind.get(kind)
        if parents is not None and await parents.get_or_read((namespace, name)) is not None:
            kind, name = top_owner(namespace, direct, self._parents, pod)
        return WorkloadRef(
            cluster=self.cluster, namespace=namespace, owner_kind=kind, owner_name=name
        )


def make_owners(
    kind: str, cluster: str, kubeconfig: str | None = None, *, nodes: bool = False
) -> OwnerResolver:
    """``FRACPILOT_OWNERS``: ``pod-name`` (conventions) or ``kubernetes`` (informers; with
    ``nodes``, HAMi's node register too)."""
    if kind == "kubernetes":
        return KubernetesOwners(make_api_client(kubeconfig), cluster, nodes=nodes)
    if kind == "pod-name":
        return PodNameOwners(cluster)
    raise ValueError(f"unknown owners resolver {kind!r}")
