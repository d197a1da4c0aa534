"""The cluster as a consolidation round reads it (:class:`ConsolidationView`), and the
PodDisruptionBudgets and KAI PodGroups in the planner's terms (:func:`disruption_budgets`,
:func:`gangs_of`). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fracpilot_actuator.kube.gangs import PodGroup, group_of
from fracpilot_actuator.kube.inventory import Inventory, PodInfo
from fracpilot_libs.placement.consolidation_limits import DisruptionBudget, Gang
from fracpilot_libs.placement.scheduling_facts import LabelSelector, Requirement


@dataclass(frozen=True)
class ConsolidationView:
    """The cluster as a round reads it."""

    inventory: Inventory
    nodes: Mapping[str, Mapping[str, Any]]  # raw Node objects by name
    budgets: tuple[DisruptionBudget, ...] = ()
    pod_groups: Mapping[str, PodGroup] | None = None
    namespace_labels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _selector(raw: Mapping[str, Any] | None) -> LabelSelector | None:
    """A PDB's ``spec.selector`` (None: it selects no pod, as policy/v1 says of a null one)."""
    if raw is None:
        return None
    return LabelSelector(
        match_labels=tuple(
            sorted((str(k), str(v)) for k, v in (raw.get("matchLabels") or {}).items())
        ),
        expressions=tuple(
            Requirement(
                key=str(r.get("key", "")),
                operator=str(r.get("operator", "")),
                values=tuple(str(v) for v in r.get("values") or ()),
            )
            for r in raw.get("matchExpressions") or ()
        ),
    )


def disruption_budgets(
    pdbs: Iterable[Mapping[str, Any]], pods: Iterable[PodInfo]
) -> tuple[DisruptionBudget, ...]:
    """PodDisruptionBudgets as the planner takes them: ``status.disruptionsAllowed`` (0 when
    the disruption controller has not written it: nothing may go) and the pods selected in the
    budget's namespace (an empty selector selects them all)."""
    pods = list(pods)
    found = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        selector = _selector((pdb.get("spec") or {}).get("selector"))
        allowed = (pdb.get("status") or {}).get("disruptionsAllowed")
        selected = frozenset(
            p.key
            for p in pods
            if p.namespace == namespace and selector is not None and selector.matches(p.labels)
        )
        found.append(
            DisruptionBudget(
                name=f"{namespace}/{meta.get('name', '')}",
                allowed=int(allowed) if isinstance(allowed, int) else 0,
                pods=selected,
            )
        )
    return tuple(found)


def gangs_of(pods: Iterable[PodInfo], groups: Mapping[str, PodGroup] | None) -> tuple[Gang, ...]:
    """KAI PodGroups with their running members (the gang rule of :mod:`.gangs`)."""
    if groups is None:
        return ()
    members: dict[str, list[PodInfo]] = {}
    for pod in pods:
        group = group_of(pod.namespace, pod.annotations, groups)
        if group is not None and pod.node and not pod.terminating:
            members.setdefault(group.key, []).append(pod)
    return tuple(
        Gang(
            name=key,
            min_member=groups[key].min_member,
            running=len(found),
            pods=frozenset(p.key for p in found),
        )
        for key, found in sorted(members.items())
    )
