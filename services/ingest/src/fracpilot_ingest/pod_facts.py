"""What ingest reads from cached pods besides their owners: pure functions over pod objects.

- **KAI GPU groups** (facts: ``shared/reference/kai-hami-semantics.md``): KAI's binder makes a
  reservation pod per shared GPU (label ``runai-gpu-group=<group>``, annotation
  ``run.ai/reserve_for_gpu_index=<GPU UUID>``) in its ``--resource-reservation-namespace``,
  labelled ``app=<--resource-reservation-app-label>`` (both ``kai-resource-reservation`` by
  default: NVIDIA/KAI-scheduler v0.12.0 ``cmd/binder/app/options.go``,
  ``pkg/common/constants/constants.go`` ``DefaultResourceReservationName``, ``AppLabelName``;
  :class:`~fracpilot_libs.kai.KaiReservation`, from the ``FRACPILOT_KAI_*`` settings the
  actuator reads too). Each fraction pod of that GPU carries the same group label and its
  ``gpu-fraction`` (or ``gpu-memory``, MiB) annotation. So the pods of a group share that GPU,
  whether or not an exporter names them (dcgm labels one pod per GPU). Multi-device fraction
  pods (``runai-gpu-group/<g>`` labels only) are not read.
- **Out-of-memory exits**: a container whose last termination says ``OOMKilled`` (the kernel's
  cgroup OOM killer), or whose termination message names a GPU out-of-memory error. With
  ``terminationMessagePolicy: FallbackToLogsOnError`` the kubelet puts the log tail of a failed
  container there, so a CUDA OOM crash is in the pod status like a kill (:data:`CUDA_OOM`).

The pods informer keeps only what these read (:func:`pod_projection`), besides the owners.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fracpilot_libs.kai import KAI_APP_LABEL, KaiReservation
from fracpilot_libs.kube.store import metadata_only
from fracpilot_libs.usage.signals import OomKill

KAI_GROUP = "runai-gpu-group"
KAI_RESERVED_GPU = "run.ai/reserve_for_gpu_index"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
_LABELS = (KAI_GROUP,)
_ANNOTATIONS = (KAI_RESERVED_GPU, KAI_FRACTION, KAI_MEMORY)
_DONE = ("Succeeded", "Failed")
# What GPU out-of-memory failures print, as their sources spell it: PyTorch's caching allocator
# ("CUDA out of memory. Tried to allocate ...", raised as torch.OutOfMemoryError, formerly
# torch.cuda.OutOfMemoryError; c10/cuda/CUDACachingAllocator.cpp), the CUDA driver API's error
# name (cuGetErrorName) and the runtime's (cudaGetErrorName), and vLLM when the memory it was
# given leaves no room for its KV cache (its engine's KV cache size check). Bare
# "OutOfMemoryError" is not one: the JVM's heap error is spelt so too.
CUDA_OOM = (
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "No available memory for the cache blocks",
)

KAI_DEFAULTS = KaiReservation()  # the binder's flags left unset

PodRef = tuple[str, str]  # (namespace, pod)
Obj = dict[str, Any]


def pod_projection(obj: Obj) -> Obj:
    """Owners' fields plus the KAI labels and annotations, the phase and each container's
    last termination (reason, exit code, time, and its message only when it names a GPU
    out-of-memory error: the cache does not hold log tails)."""
    kept = metadata_only(obj)
    meta = obj.get("metadata") or {}
    notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k in _ANNOTATIONS}
    # A reservation pod's app label tells it from a pod merely carrying the annotation.
    kept_labels = (*_LABELS, KAI_APP_LABEL) if KAI_RESERVED_GPU in notes else _LABELS
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in kept_labels}
    if labels:
        kept["metadata"]["labels"] = labels
    if notes:
        kept["metadata"]["annotations"] = notes
    status = obj.get("status") or {}
    ended = []
    for c in status.get("containerStatuses") or ():
        last = ((c or {}).get("lastState") or {}).get("terminated")
        if last:
            terminated = {k: last.get(k) for k in ("reason", "exitCode", "finishedAt")}
            if names_cuda_oom(last.get("message")):
                terminated["message"] = last["message"]
            ended.append(
                {
                    "name": c.get("name", ""),
                    "restartCount": c.get("restartCount", 0),
                    "lastState": {"terminated": terminated},
                }
            )
    kept["status"] = {"phase": status.get("phase", "")}
    if ended:
        kept["status"]["containerStatuses"] = ended
    return kept


def names_cuda_oom(message: object) -> bool:
    """Whether a termination message names a GPU out-of-memory error."""
    return isinstance(message, str) and any(marker in message for marker in CUDA_OOM)


def _meta(pod: Mapping[str, Any], part: str) -> Mapping[str, str]:
    value = (pod.get("metadata") or {}).get(part) or {}
    return value if isinstance(value, Mapping) else {}


def _ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _fraction(notes: Mapping[str, str], device_memory: int | None) -> float | None:
    try:
        if KAI_FRACTION in notes:
            value = float(notes[KAI_FRACTION])
            return value if 0 < value <= 1 else None
        if KAI_MEMORY in notes and device_memory:
            value = float(notes[KAI_MEMORY]) * 1024 * 1024 / device_memory
            return value if 0 < value <= 1 else None
    except ValueError:
        return None
    return None


def kai_shared_gpus(
    pods: Iterable[Mapping[str, Any]],
    device_memory: Mapping[str, int] | None = None,
    reservation: KaiReservation = KAI_DEFAULTS,
) -> dict[str, dict[PodRef, float | None]]:
    """GPU UUID -> the KAI fraction pods placed on it and their fractions (None: unknown).
    Only ``reservation``'s pods name a group's GPU."""
    group_gpu: dict[str, str] = {}
    members: dict[str, dict[PodRef, Mapping[str, str]]] = {}
    for pod in pods:
        if str((pod.get("status") or {}).get("phase") or "") in _DONE:
            continue
        group = _meta(pod, "labels").get(KAI_GROUP)
        if not group:
            continue
        notes = _meta(pod, "annotations")
        if KAI_RESERVED_GPU in notes:  # a reservation pod: of the binder we are set up for?
            if reservation.holds(pod):
                group_gpu[group] = notes[KAI_RESERVED_GPU]
        else:
            members.setdefault(group, {})[_ref(pod)] = notes
    shared: dict[str, dict[PodRef, float | None]] = {}
    for group, pods_of_group in members.items():
        uuid = group_gpu.get(group)
        if uuid is None:  # reservation pod not there (yet): the GPU is not known
            continue
        memory = (device_memory or {}).get(uuid)
        on_gpu = shared.setdefault(uuid, {})
        for ref, notes in pods_of_group.items():
            on_gpu[ref] = _fraction(notes, memory)
    return shared


def oom_kills(pods: Iterable[Mapping[str, Any]]) -> list[OomKill]:
    """Containers whose last termination was an out-of-memory kill or a GPU out-of-memory
    exit."""
    found = []
    for pod in pods:
        namespace, name = _ref(pod)
        for c in (pod.get("status") or {}).get("containerStatuses") or ():
            last = ((c or {}).get("lastState") or {}).get("terminated") or {}
            if last.get("reason") == "OOMKilled" or names_cuda_oom(last.get("message")):
                found.append(
                    OomKill(namespace, name, str(c.get("name", "")), str(last.get("finishedAt")))
                )
    return found
