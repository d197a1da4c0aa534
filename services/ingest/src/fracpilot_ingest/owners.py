"""Which workload a pod belongs to: decisions are per workload, not per pod.

The Kubernetes resolver follows owner references (Pod -> ReplicaSet -> Deployment, Pod ->
StatefulSet, Pod -> Job -> CronJob) from a cache kept current by watches. Without API access,
the pod-name resolver reads the controllers' naming conventions and says so in the
workload's kind when it has to guess (``Pod``).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Protocol

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.owners import INTERMEDIATE_KINDS, Controller, OwnerKey, top_owner

log = logging.getLogger(__name__)

# <deployment>-<pod-template-hash>-<5 random>; the hash uses the "safe" alphabet
_DEPLOYMENT_POD = re.compile(
    r"^(?P<name>.+)-(?P<hash>[bcdfghjklmnpqrstvwxz2456789]{6,10})-"
    r"(?P<suffix>[bcdfghjklmnpqrstvwxz2456789]{5})$"
)
_STATEFUL_POD = re.compile(r"^(?P<name>.+)-(?P<ordinal>\d+)$")


class OwnerResolver(Protocol):
    def resolve(self, namespace: str, pod: str) -> WorkloadRef: ...


class PodNameOwners:
    """Guesses the owner from the pod's name; used when the Kubernetes API is not configured."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster

    def resolve(self, namespace: str, pod: str) -> WorkloadRef:
        return owner_from_pod_name(self.cluster, namespace, pod)


def owner_from_pod_name(cluster: str, namespace: str, pod: str) -> WorkloadRef:
    if m := _DEPLOYMENT_POD.match(pod):
        kind, name = "Deployment", m.group("name")
    elif m := _STATEFUL_POD.match(pod):
        kind, name = "StatefulSet", m.group("name")
    else:
        kind, name = "Pod", pod
    return WorkloadRef(cluster=cluster, namespace=namespace, owner_kind=kind, owner_name=name)


# --- the Kubernetes resolver ------------------------------------------------------------------


def controller_of(metadata: Any) -> Controller | None:
    """The controller owner reference of an object's metadata, if any."""
    for ref in metadata.owner_references or ():
        if ref.controller:
            return str(ref.kind), str(ref.name)
    return None


class KubernetesOwners:
    """Owners from the Kubernetes API, cached and kept current by watches.

    Three watches (pods, ReplicaSets, Jobs) run in daemon threads with the blocking client; a
    pod not in the cache yet (it appeared since the last event) is read once directly. Needs
    ``get``/``list``/``watch`` on pods, replicasets and jobs.
    """

    def __init__(self, api: Any, cluster: str, resync_s: int = 300) -> None:
        from kubernetes import client

        self.cluster = cluster
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._resync_s = resync_s
        self._pods: dict[tuple[str, str], Controller | None] = {}
        self._parents: dict[OwnerKey, Controller] = {}
        self._stop = threading.Event()
        self._synced = {name: threading.Event() for name in ("pods", "replicasets", "jobs")}
        self.misses = 0

    def start(self) -> None:
        for name, lister, on_event in (
            ("pods", self._core.list_pod_for_all_namespaces, self._on_pod),
            ("replicasets", self._apps.list_replica_set_for_all_namespaces, self._on_parent),
            ("jobs", self._batch.list_job_for_all_namespaces, self._on_parent),
        ):
            threading.Thread(
                target=self._watch,
                args=(name, lister, on_event),
                name=f"owners-{name}",
                daemon=True,
            ).start()

    def wait_synced(self, timeout_s: float = 30.0) -> bool:
        return all(event.wait(timeout_s) for event in self._synced.values())

    def stop(self) -> None:
        self._stop.set()

    def resolve(self, namespace: str, pod: str) -> WorkloadRef:
        key = (namespace, pod)
        if key not in self._pods:
            self.misses += 1
            try:
                obj = self._core.read_namespaced_pod(pod, namespace)
                self._pods[key] = controller_of(obj.metadata)
            except Exception:  # not there (any more) or API trouble: name conventions
                return owner_from_pod_name(self.cluster, namespace, pod)
        kind, name = top_owner(namespace, self._pods[key], self._parents, pod)
        if kind in INTERMEDIATE_KINDS and (namespace, kind, name) not in self._parents:
            self._read_parent(namespace, kind, name)
            kind, name = top_owner(namespace, self._pods[key], self._parents, pod)
        return WorkloadRef(
            cluster=self.cluster, namespace=namespace, owner_kind=kind, owner_name=name
        )

    def _read_parent(self, namespace: str, kind: str, name: str) -> None:
        try:
            obj = (
                self._apps.read_namespaced_replica_set(name, namespace)
                if kind == "ReplicaSet"
                else self._batch.read_namespaced_job(name, namespace)
            )
        except Exception:
            return
        self._on_parent("ADDED", obj)

    def _on_pod(self, event: str, obj: Any) -> None:
        key = (obj.metadata.namespace, obj.metadata.name)
        if event == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = controller_of(obj.metadata)

    def _on_parent(self, event: str, obj: Any) -> None:
        key = (obj.metadata.namespace, str(obj.kind or _kind_of(obj)), obj.metadata.name)
        parent = controller_of(obj.metadata)
        if event == "DELETED" or parent is None:
            self._parents.pop(key, None)
        else:
            self._parents[key] = parent

    def _watch(self, name: str, lister: Any, on_event: Any) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                listing = lister()
                for item in listing.items:
                    on_event("ADDED", item)
                self._synced[name].set()
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    lister,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=self._resync_s,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    on_event(event["type"], event["object"])
            except Exception as exc:  # expired resourceVersion, API down: list again
                log.warning(
                    "owner watch restarting", extra={"watch": name, "error": str(exc)[:200]}
                )
                self._stop.wait(1.0)


def _kind_of(obj: Any) -> str:
    """Items of a list carry no ``kind``; the client's class name says it (V1ReplicaSet)."""
    return type(obj).__name__.removeprefix("V1")
