"""Kubernetes API objects as the API's JSON dicts, for tests of the pure code that reads them
(the actuator's inventory and judge): GPU nodes, pods, KAI's and HAMi's GPU shares.

(tests/support/kube.py writes the same kinds of objects into a real kube-apiserver.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MEM_MIB = 81920
T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)


def node(name: str, gpus: int = 2, memory_mib: int | None = MEM_MIB) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.memory": str(memory_mib)} if memory_mib else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def pod(
    name: str,
    node_name: str | None = "n1",
    namespace: str = "inference",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    phase: str = "Running",
    created: datetime = T0,
    terminating: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "annotations": annotations or {},
        "labels": labels or {},
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if terminating:
        meta["deletionTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits or {}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def kai(name: str, fraction: str, group: str | None = None, **kw: Any) -> dict[str, Any]:
    labels = {"runai-gpu-group": group} if group else {}
    return pod(name, annotations={"gpu-fraction": fraction}, labels=labels, **kw)


def reservation(group: str, uuid: str | None, node_name: str = "n1") -> dict[str, Any]:
    return pod(
        f"gpu-reservation-{group}",
        node_name=node_name,
        namespace="kai-resource-reservation",
        labels={"runai-gpu-group": group, "app": "kai-resource-reservation"},
        annotations={"run.ai/reserve_for_gpu_index": uuid} if uuid else {},
        limits={"nvidia.com/gpu": "1"},
    )


def hami(name: str, devices: str | None, limits: dict[str, str] | None = None, **kw: Any) -> Any:
    annotations = {"hami.io/vgpu-devices-allocated": devices} if devices else {}
    return pod(
        name,
        annotations=annotations,
        limits=limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
        **kw,
    )
