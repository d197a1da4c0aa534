"""What a consolidation round reads of the cluster, read: the :class:`ConsolidationView`.

Nodes and pods (from the inventory cache when it is current), KAI's BindRequests and PodGroups,
the PodDisruptionBudgets and the labels of the pods' namespaces, assembled as
:mod:`.consolidation_view` describes them. Called by :class:`.consolidation.Consolidator` at
every round and to verify a move in flight.
"""

from __future__ import annotations

from typing import Any

from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.consolidation_view import ConsolidationView, disruption_budgets
from fracpilot_actuator.kube.inventory import build_inventory
from fracpilot_actuator.kube.namespaces import NamespaceLabels
from fracpilot_actuator.kube.reader import ClusterReader
from fracpilot_actuator.kube.settings import KubeBackendSettings


async def read_consolidation_view(
    api: KubeApi,
    reader: ClusterReader,
    settings: KubeBackendSettings,
    namespaces: NamespaceLabels | None,
) -> ConsolidationView:
    """The cluster as a round reads it (without ``namespaces``: no namespace labels)."""
    nodes, pods = await reader.nodes_and_pods()
    kai = await reader.kai.read()
    inventory = build_inventory(
        nodes,
        pods,
        cluster=settings.cluster,
        default_gpu_memory_mib=settings.default_gpu_memory_mib,
        kai=settings.kai,
        bound=kai.bound,
        hami_memory_factor=settings.hami_memory_factor,
    )
    pdbs = await api.list_disruption_budgets()
    names = sorted({p.namespace for p in inventory.pods.values()})
    labels: dict[str, dict[str, Any]] = {}
    if namespaces is not None:
        for namespace in names:
            labels[namespace] = await namespaces.labels_of(namespace)
    return ConsolidationView(
        inventory=inventory,
        nodes={str((n.get("metadata") or {}).get("name", "")): n for n in nodes},
        budgets=disruption_budgets(pdbs, inventory.pods.values()),
        pod_groups=kai.pod_groups,
        namespace_labels=labels,
    )
