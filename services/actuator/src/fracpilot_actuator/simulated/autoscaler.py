"""A simulated cluster-autoscaler for the demo's node group. Pure: a simulator, not a model
of every rule of the real one.

The simulated cluster's nodes form one node group. It grows when a scale-up plan adds a node
(:func:`next_node` names it) and shrinks as cluster-autoscaler's scale-down does for an empty
node: a node holding no GPU pod for ``unneeded_s`` is removed, not within ``delay_after_add_s``
of the group's last growth, and never below ``min_nodes``. The two times default to
cluster-autoscaler's flags ``--scale-down-unneeded-time`` and ``--scale-down-delay-after-add``
(both ``10*time.Minute``, ``cluster-autoscaler/main.go`` in kubernetes/autoscaler at
c312688777e0700ba063128936878bf0c8624b01). The clock is the simulation's (the decisions'
``decided_at``, the samples' time): a simulated day takes minutes of wall time.

What the real one does besides (utilisation thresholds for nodes that are not empty, pods it
cannot move, PDBs, scale-down-disabled annotations) does not arise here: only empty nodes go,
and consolidation (:mod:`.consolidation`) is what empties them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from fracpilot_libs.placement.planner import ClusterState

UNNEEDED_S = 600.0  # --scale-down-unneeded-time
DELAY_AFTER_ADD_S = 600.0  # --scale-down-delay-after-add
NODE_PREFIX = "sim-node-"
_INDEX = re.compile(rf"^{NODE_PREFIX}(\d+)$")


@dataclass(frozen=True)
class NodeGroup:
    """The simulated node group's memory, kept with the cluster's state."""

    min_nodes: int = 1
    unneeded_s: float = UNNEEDED_S
    delay_after_add_s: float = DELAY_AFTER_ADD_S
    empty_since: Mapping[str, datetime] = field(default_factory=dict)  # nodes with no GPU pod
    last_added: datetime | None = None
    added: tuple[str, ...] = ()  # by scale-ups, in order
    removed: tuple[str, ...] = ()  # by scale-down, in order

    def as_json(self) -> dict[str, Any]:
        return {
            "min_nodes": self.min_nodes,
            "unneeded_s": self.unneeded_s,
            "delay_after_add_s": self.delay_after_add_s,
            "empty_since": {n: t.isoformat() for n, t in self.empty_since.items()},
            "last_added": self.last_added.isoformat() if self.last_added else None,
            "added": list(self.added),
            "removed": list(self.removed),
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> NodeGroup:
        last = body.get("last_added")
        return cls(
            min_nodes=int(body.get("min_nodes", 1)),
            unneeded_s=float(body.get("unneeded_s", UNNEEDED_S)),
            delay_after_add_s=float(body.get("delay_after_add_s", DELAY_AFTER_ADD_S)),
            empty_since={
                str(n): datetime.fromisoformat(t) for n, t in body.get("empty_since", {}).items()
            },
            last_added=datetime.fromisoformat(last) if last else None,
            added=tuple(body.get("added", ())),
            removed=tuple(body.get("removed", ())),
        )


def nodes_of(state: ClusterState) -> list[str]:
    """The cluster's nodes, in the order of their GPUs."""
    return list(dict.fromkeys(g.node for g in state.gpus))


def next_node(state: ClusterState, group: NodeGroup) -> str:
    """A new node's name: ``sim-node-<n>`` past every node the group has had (a removed node's
    name is not given again)."""
    seen = [*nodes_of(state), *group.removed]
    numbers = [int(m.group(1)) for n in seen if (m := _INDEX.match(n))]
    return f"{NODE_PREFIX}{max(numbers, default=-1) + 1}"


def grown(group: NodeGroup, node: str, now: datetime | None) -> NodeGroup:
    """The group after a scale-up added ``node`` at ``now`` (None: the time is unknown, the
    delay after it does not hold)."""
    return replace(group, added=(*group.added, node), last_added=now or group.last_added)


@dataclass(frozen=True)
class ScaleDown:
    state: ClusterState
    group: NodeGroup
    removed: tuple[str, ...]  # this time


def scale_down(state: ClusterState, group: NodeGroup, now: datetime) -> ScaleDown:
    """Remove the nodes empty of GPU pods for ``unneeded_s`` (the longest empty first), keeping
    ``min_nodes``; nothing within ``delay_after_add_s`` of the last scale-up."""
    nodes = nodes_of(state)
    gpu_node = {g.uuid: g.node for g in state.gpus}
    held = {gpu_node.get(p.gpu_uuid, "") for p in state.placements}
    empty = {n: group.empty_since.get(n, now) for n in nodes if n not in held}
    group = replace(group, empty_since=empty)
    after_add = group.last_added is not None and now - group.last_added < timedelta(
        seconds=group.delay_after_add_s
    )
    if after_add:
        return ScaleDown(state, group, ())
    due = sorted(
        (n for n, since in empty.items() if now - since >= timedelta(seconds=group.unneeded_s)),
        key=lambda n: (empty[n], n),
    )
    removed = tuple(due[: max(len(nodes) - group.min_nodes, 0)])
    if not removed:
        return ScaleDown(state, group, ())
    gone = set(removed)
    state = state.model_copy(update={"gpus": tuple(g for g in state.gpus if g.node not in gone)})
    group = replace(
        group,
        empty_since={n: t for n, t in empty.items() if n not in gone},
        removed=(*group.removed, *removed),
    )
    return ScaleDown(state, group, removed)
