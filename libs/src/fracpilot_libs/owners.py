"""Which controller a pod's workload is: the owner walk ingest and the actuator share.

Pure: callers pass what they read from the Kubernetes API (the pod's controller and the
controllers of ReplicaSets and Jobs), as the API's JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fracpilot_libs.contracts import WorkloadRef

OwnerKey = tuple[str, str, str]  # namespace, kind, name
Controller = tuple[str, str]  # kind, name

# <deployment>-<pod-template-hash>-<5 random>; the hash uses the "safe" alphabet
_DEPLOYMENT_POD = re.compile(
    r"^(?P<name>.+)-(?P<hash>[bcdfghjklmnpqrstvwxz2456789]{6,10})-"
    r"(?P<suffix>[bcdfghjklmnpqrstvwxz2456789]{5})$"
)
_STATEFUL_POD = re.compile(r"^(?P<name>.+)-(?P<ordinal>\d+)$")

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


def owner_from_pod_name(cluster: str, namespace: str, pod: str) -> WorkloadRef:
    """The workload a pod's name says it belongs to, by the controllers' naming conventions
    (``Pod`` when they do not say): for ingest without API access and for
    ``fracpilot recommend``, which reads only Prometheus."""
    if m := _DEPLOYMENT_POD.match(pod):
        kind, name = "Deployment", m.group("name")
    elif m := _STATEFUL_POD.match(pod):
        kind, name = "StatefulSet", m.group("name")
    else:
        kind, name = "Pod", pod
    return WorkloadRef(cluster=cluster, namespace=namespace, owner_kind=kind, owner_name=name)
