"""The mark of a node being emptied, as merge patches of its Node object (pure).

The mark (:mod:`.consolidation_round`: the NoSchedule taint :data:`MARK_TAINT` and the
annotation :data:`MARK_REASON`) is put on and taken off by :class:`.consolidation.Consolidator`
with these merge patches; each carries the node's ``resourceVersion`` as read, so a node
changed since is refused (409) rather than overwritten: a merge patch replaces the list of
taints whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fracpilot_actuator.kube.consolidation_round import MARK_REASON, MARK_TAINT


def mark_patch(raw: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """The patch that marks the node ``raw`` (its taints, plus the mark's) for ``reason``."""
    meta = raw.get("metadata") or {}
    taints = list((raw.get("spec") or {}).get("taints") or [])
    taints.append({"key": MARK_TAINT, "value": "true", "effect": "NoSchedule"})
    return {
        "metadata": {
            "annotations": {MARK_REASON: reason},
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {"taints": taints},
    }


def unmark_patch(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The patch that takes the mark off the node ``raw`` (its other taints kept)."""
    meta = raw.get("metadata") or {}
    taints = [t for t in (raw.get("spec") or {}).get("taints") or () if t.get("key") != MARK_TAINT]
    return {
        "metadata": {
            "annotations": {MARK_REASON: None},
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {"taints": taints},
    }
