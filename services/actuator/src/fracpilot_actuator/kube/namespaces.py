"""Namespace labels, for the opt-in rule: a watch-fed cache of every namespace's labels.

The opt-in rule (:mod:`fracpilot_actuator.opt_in`) reads the label ``fracpilot.io/mode`` of a
workload's namespace; labelling a namespace later (or removing the label) takes effect with the
watch, for the next decision. An :class:`~fracpilot_libs.kube.informer.Informer` lists and
watches namespaces (the ClusterRole may get, list and watch them) keeping only their names and
labels; a namespace not in the cache yet is read once from the API. A namespace whose labels
cannot be had (not there, or the API did not answer) has none: its workloads get the default
mode, recommend unless configured, so not knowing never applies anything.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from fracpilot_libs.kube.informer import Informer
from fracpilot_libs.kube.store import Obj


def _labels_only(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "resourceVersion": meta.get("resourceVersion"),
        }
    }


class NamespaceLabels:
    """Every namespace's labels, kept current by a watch. Start and read on the event loop."""

    def __init__(self, api: client.ApiClient, timeout_s: float = 30.0) -> None:
        core = client.CoreV1Api(api)
        self.informer = Informer(
            "namespaces",
            core.list_namespace,
            reader=core.read_namespace,
            project=_labels_only,
            timeout_s=timeout_s,
            miss_ttl_s=5.0,
            log_as="namespaces",
        )

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    def join(self, timeout_s: float) -> None:
        self.informer.join(timeout_s)

    async def wait_synced(self, timeout_s: float) -> bool:
        return await self.informer.wait_synced(timeout_s)

    def cached(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's labels from the cache; None when it is not (yet) there."""
        obj = self.informer.get(("", namespace))
        return None if obj is None else dict(obj["metadata"]["labels"])

    async def labels_of(self, namespace: str) -> dict[str, Any]:
        """The namespace's labels, read from the API when not cached; {} when unknown."""
        obj = await self.informer.get_or_read(("", namespace))
        return {} if obj is None else dict((obj.get("metadata") or {}).get("labels") or {})
