"""Which controller a pod's workload is: the owner walk ingest and the actuator share.

Pure: callers pass what they read from the Kubernetes API (the pod's controller and the
controllers of ReplicaSets and Jobs), as the API's JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OwnerKey = tuple[str, str, str]  # namespace, kind, name
Controller = tuple[str, str]  # kind, name

# Controllers whose own controller is the workload users think of.
INTERMEDIATE_KINDS = frozenset({"ReplicaSet", "Job"})


def top_owner(
    namespace: str, direct: Controller | None, parents: Mapping[OwnerKey, Controller], pod: str
) -> Controller:
    """ReplicaSet -> Deployment, Job -> CronJob; a pod without a controller is its own."""
    if direct is None:
        return ("Pod", pod)
    kind, name = direct
    for _ in range(4):  # bounded: owner references can form a loop in a broken cluster
        if kind not in INTERMEDIATE_KINDS:
            break
        parent = parents.get((namespace, kind, name))
        if parent is None:
            break
        kind, name = parent
    return kind, name


def controller_of(obj: Mapping[str, Any]) -> Controller | None:
    """The controller owner reference of an object (the API's JSON), if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None
