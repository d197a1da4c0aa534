"""The Kubernetes backend on a recording API (no server): the API keeps its pods, a patch
changes them (and honours the precondition it carries), an eviction removes the pod; the
stores are the fakes of :mod:`fracpilot_actuator.stores.memory`. Used by
tests/unit/actuator/kube/test_backend.py and test_verified_results.py."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any, cast

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.errors import PermanentKubeError, TransientKubeError
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.memory import (
    MemoryAllocationStore,
    MemoryDisruptionHistory,
    MemoryPendingRecreates,
    MemoryTargetStore,
)
from fracpilot_libs.contracts import FractionDecision
from support.kube_objects import T0

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
NOW = T0 + timedelta(minutes=6)
AUTO = OptInSettings(default_mode="auto")  # this cluster opts every namespace in


class RecordingApi:
    """The calls the backend makes, answered from ``pods`` and ``nodes``; writes recorded.

    A patch changes the stored pod (and its resourceVersion) and honours the precondition it
    carries (409 when the pod changed); an eviction removes the pod."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.writes: list[tuple[str, str]] = []
        self.refuse_evictions = False
        self.refusal: PermanentKubeError | TransientKubeError = PermanentKubeError(
            "(403)", status=403, message="forbidden"
        )
        self.preconditions: list[tuple[str, str]] = []  # (resourceVersion, uid) of each patch
        self.changed_behind_our_back = 0  # patches answered 409 (someone wrote first)
        self.refuse_patches: PermanentKubeError | None = None

    def _pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (
                p
                for p in self.pods
                if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace
            ),
            None,
        )

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.nodes

    async def list_pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [] if label_selector else copy.deepcopy(self.pods)

    async def list_owners(self, namespace: str) -> tuple[list[Any], list[Any]]:
        return [], []

    async def read_owner(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "namespace": namespace}}

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self._pod(namespace, name)
        return copy.deepcopy(found) if found is not None else None

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: dict[str, str],
        *,
        resource_version: str = "",
        uid: str = "",
    ) -> int:
        self.writes.append(("patch", name))
        self.preconditions.append((resource_version, uid))
        if self.refuse_patches is not None:
            raise self.refuse_patches
        stored = self._pod(namespace, name)
        assert stored is not None
        meta = stored["metadata"]
        if self.changed_behind_our_back:
            self.changed_behind_our_back -= 1
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if resource_version and resource_version != meta["resourceVersion"]:
            raise PermanentKubeError("(409)", status=409, message="the object has been modified")
        meta["annotations"].update(annotations)
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return int(meta["resourceVersion"])

    async def evict(self, namespace: str, name: str) -> None:
        self.writes.append(("evict", name))
        if self.refuse_evictions:
            raise self.refusal
        self.pods = [
            p
            for p in self.pods
            if not (p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace)
        ]

    async def pod_is_going(self, namespace: str, name: str, uid: str) -> bool:
        return self._pod(namespace, name) is None

    async def read_pod_version(self, namespace: str, name: str) -> int | None:
        found = self._pod(namespace, name)
        return int(found["metadata"]["resourceVersion"]) if found else None

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.writes.append(("delete", name))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.writes.append(("event:" + str(body["reason"]), str(body["involvedObject"]["name"])))


def backend_for(
    api: RecordingApi,
    *,
    pending_recreates: MemoryPendingRecreates | None = None,
    history: MemoryDisruptionHistory | None = None,
    **settings: Any,
) -> tuple[KubernetesBackend, MemoryTargetStore, MemoryAllocationStore, MemoryDisruptionHistory]:
    """``pending_recreates`` and ``history``: a previous backend's, to play a restart."""
    targets, allocations = MemoryTargetStore(), MemoryAllocationStore()
    history = history if history is not None else MemoryDisruptionHistory()

    async def report(_decision: FractionDecision, _actuation: Actuation) -> None:
        return None

    backend = KubernetesBackend(
        cast(KubeApi, api),
        targets,
        KubeBackendSettings(cluster="test", inventory_cache=False, opt_in=AUTO, **settings),
        report,
        instance="unit",
        allocations=allocations,
        history=history,
        pending_recreates=pending_recreates,
    )
    return backend, targets, allocations, history


def grow(current: float, new: float) -> FractionDecision:
    return decision(current, new, name="chat", decided_at=T0 + timedelta(minutes=5))
