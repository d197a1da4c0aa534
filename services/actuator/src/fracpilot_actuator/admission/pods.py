"""Reading a pod as the API server sends it: labels, annotations, opt-out, its workload. Pure.

Which workload a pod belongs to comes from its controller owner reference: a ReplicaSet named
``<deployment>-<pod-template-hash>`` (the pod's ``pod-template-hash`` label) stands for its
Deployment; StatefulSets, DaemonSets and Jobs are used directly (a Job whose name ends in a
CronJob's scheduled-time suffix is also looked up as that CronJob, as ingest names it); a
pod without an owner has no workload.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fracpilot_libs.contracts import WorkloadRef

OPT_OUT = "fracpilot.io/opt-out"  # label or annotation "true" on a pod (label on a namespace)
TARGET_ANNOTATION = "fracpilot.io/target"  # the decision id of the target a pod was given
POD_TEMPLATE_HASH = "pod-template-hash"

# CronJob controller v2 names a Job ``<cronjob>-<scheduled time in minutes since the epoch>``.
_CRONJOB_JOB = re.compile(r"^(?P<cronjob>.+)-(?P<minutes>\d{8,})$")


def as_mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def annotations_of(pod: Mapping[str, Any]) -> dict[str, Any]:
    return as_mapping(as_mapping(pod.get("metadata")).get("annotations"))


def labels_of(pod: Mapping[str, Any]) -> dict[str, Any]:
    return as_mapping(as_mapping(pod.get("metadata")).get("labels"))


def _is_true(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "true"


def opted_out(pod: Mapping[str, Any]) -> bool:
    """``fracpilot.io/opt-out: "true"`` as a label or an annotation."""
    return _is_true(labels_of(pod).get(OPT_OUT)) or _is_true(annotations_of(pod).get(OPT_OUT))


def pod_name(pod: Mapping[str, Any]) -> str:
    """The pod's name, or its generateName prefix (a controller's pod has no name yet)."""
    meta = as_mapping(pod.get("metadata"))
    return str(meta.get("name") or meta.get("generateName") or "")


def _controller_ref(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    owners = as_list(as_mapping(pod.get("metadata")).get("ownerReferences"))
    refs: list[dict[str, Any]] = [r for r in owners if isinstance(r, dict)]
    controllers = [r for r in refs if r.get("controller") is True]
    if controllers:
        return controllers[0]
    return refs[0] if len(refs) == 1 else None


def workload_candidates(
    pod: Mapping[str, Any], namespace: str, cluster: str
) -> tuple[WorkloadRef, ...]:
    """The workloads a pod may belong to, most specific first; empty for a pod without owner.

    A ReplicaSet named ``<deployment>-<pod-template-hash>`` stands for its Deployment (without
    the label or the suffix it is a bare ReplicaSet). A Job whose name ends in a CronJob's
    scheduled-time suffix may be a CronJob's: that CronJob is the second candidate.
    """
    ref = _controller_ref(pod)
    if ref is None:
        return ()
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    if not kind or not name:
        return ()

    def of(owner_kind: str, owner_name: str) -> WorkloadRef:
        return WorkloadRef(
            cluster=cluster, namespace=namespace, owner_kind=owner_kind, owner_name=owner_name
        )

    if kind == "ReplicaSet":
        template_hash = labels_of(pod).get(POD_TEMPLATE_HASH)
        suffix = f"-{template_hash}" if isinstance(template_hash, str) and template_hash else ""
        if suffix and name.endswith(suffix) and len(name) > len(suffix):
            return (of("Deployment", name[: -len(suffix)]),)
        return (of("ReplicaSet", name),)
    if kind == "Job" and (m := _CRONJOB_JOB.match(name)):
        return (of("Job", name), of("CronJob", m.group("cronjob")))
    return (of(kind, name),)
