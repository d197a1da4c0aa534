"""One GPU's gathered numbers to its pods' observations: a pod's own numbers are exact; the
device's numbers go whole to a lone pod (exact) or are split between several by their
allocated fractions (equal shares when unknown) and marked estimated. A MIG instance's memory
total is put on its card's scale here (:mod:`fracpilot_libs.usage.mig`)."""

from __future__ import annotations

import math

from fracpilot_libs.mig.profiles import instance_model
from fracpilot_libs.usage.attribution_types import (
    GatheredGpu,
    GpuInventory,
    Observation,
    PodKey,
    Rejection,
)
from fracpilot_libs.usage.mappings import Quantity
from fracpilot_libs.usage.mig import card_memory_bytes, profile_memory_bytes


def _device_total(uuid: str, gpu: GatheredGpu, inventory: GpuInventory) -> tuple[int | None, bool]:
    """The device's memory and whether it is measured (False: a MIG profile's nominal size).

    dcgm-exporter: FB_TOTAL when exported, else used + free + reserved (the driver's reserve
    is part of the card; without FB_RESERVED, older exporters, used + free)."""
    used = gpu.device.get(Quantity.MEMORY_USED)
    free = gpu.device.get(Quantity.MEMORY_FREE)
    total = gpu.device.get(Quantity.MEMORY_TOTAL)
    if total is not None:
        return int(total[1]), True
    if used is not None and free is not None:
        reserved = gpu.device.get(Quantity.MEMORY_RESERVED)
        summed = used[1] + free[1] + (reserved[1] if reserved is not None else 0.0)
        return (int(summed) if math.isfinite(summed) else None), True  # huge numbers: none
    if gpu.profile and (nominal := profile_memory_bytes(gpu.profile)) is not None:
        return nominal, False
    known = inventory.device_memory_bytes.get(uuid) or inventory.default_device_memory_bytes
    return known, True


def _pod_order(pod: PodKey) -> tuple[str, str, str]:
    return (pod.namespace, pod.pod, pod.container)


_NO_FRACTIONS: dict[PodKey, float | None] = {}  # a GPU no allocation names (never written)


def split_gpu(
    uuid: str,
    gpu: GatheredGpu,
    inventory: GpuInventory,
    timestamp: float,
    rejections: list[Rejection],
) -> list[Observation]:
    if gpu.unknown_profile:
        return []
    total, measured = _device_total(uuid, gpu, inventory)
    if total is not None and gpu.profile:
        total = card_memory_bytes(total, gpu.memory_share)  # the card's scale (usage.mig)
    allocated = inventory.fractions.get(uuid) or _NO_FRACTIONS  # read only
    # Pods seen in the series, plus pods the inventory places on this GPU that no series
    # names (dcgm without virtual GPUs labels one sharing pod or none).
    if allocated:
        seen = {(p.namespace, p.pod) for p in gpu.seen_pods}
        pods = sorted(
            gpu.seen_pods | {p for p in allocated if (p.namespace, p.pod) not in seen},
            key=_pod_order,
        )
    else:  # most GPUs: nothing to add, often one pod to sort
        pods = sorted(gpu.seen_pods, key=_pod_order) if len(gpu.seen_pods) > 1 else [*gpu.seen_pods]
    if not pods:
        return []
    # A rejected point of this device is counted already; a missing total or number that
    # follows from it is not counted again.
    follow_ups: list[Rejection] = [] if gpu.rejected else rejections
    if total is None:
        follow_ups.append(
            Rejection(
                "unknown_device_memory",
                f"GPU {uuid}: device memory unknown (no FB_FREE, no inventory, no default)",
            )
        )
        return []
    model = (instance_model(gpu.model, gpu.profile) if gpu.profile else gpu.model)[:128]
    if len(pods) == 1 and not gpu.pods:
        # The common case (one pod, device numbers only), as _per_pod would split it and the
        # loop below make it: the lone pod has the device's numbers, exact.
        pod = pods[0]
        device_compute = gpu.device.get(Quantity.COMPUTE)
        device_memory = gpu.device.get(Quantity.MEMORY_USED)
        if device_compute is None or device_memory is None:
            follow_ups.append(_incomplete(uuid, pod, device_compute is None, timestamp))
            return []
        return [
            Observation(
                pod,
                uuid,
                gpu.node,
                timestamp,
                min(max(0.0, device_compute[1]), 1.0),
                int(max(0.0, device_memory[1])),
                total,
                measured,
                gpu_model=model,
            )
        ]
    values: dict[Quantity, dict[PodKey, tuple[float, bool]]] = {}
    for quantity in (Quantity.COMPUTE, Quantity.MEMORY_USED):
        values[quantity] = _per_pod(quantity, pods, gpu, allocated)
    out = []
    for pod in pods:
        compute = values[Quantity.COMPUTE].get(pod)
        memory = values[Quantity.MEMORY_USED].get(pod)
        if compute is None or memory is None:
            follow_ups.append(_incomplete(uuid, pod, compute is None, timestamp))
            continue
        out.append(
            Observation(
                pod=pod,
                gpu_uuid=uuid,
                node=gpu.node,
                timestamp=timestamp,
                compute=min(compute[0], 1.0),
                memory_used_bytes=int(memory[0]),
                memory_total_bytes=total,
                exact=compute[1] and memory[1] and measured,
                # the card's model and the profile; prices look up the card's (pricing)
                gpu_model=model,
            )
        )
    return out


def _incomplete(uuid: str, pod: PodKey, no_compute: bool, timestamp: float) -> Rejection:
    """A pod of a GPU whose compute (else memory) number is missing at this instant."""
    missing = "compute" if no_compute else "memory"
    return Rejection(
        "incomplete",
        f"GPU {uuid} pod {pod.namespace}/{pod.pod}: no {missing} number at {timestamp:.0f}",
    )


def _per_pod(
    quantity: Quantity, pods: list[PodKey], gpu: GatheredGpu, allocated: dict[PodKey, float | None]
) -> dict[PodKey, tuple[float, bool]]:
    """Each pod's value and whether it is exact: its own number when it has one; otherwise
    its share (by allocated fraction, equal when unknown) of what the device number leaves
    after the pods with their own numbers. A device number for a lone pod is exact."""
    result: dict[PodKey, tuple[float, bool]] = {}
    rest = []
    for pod in pods:
        own = gpu.pods.get(pod, {}).get(quantity)
        if own is not None:
            result[pod] = (own, True)
        else:
            rest.append(pod)
    device = gpu.device.get(quantity)
    if not rest or device is None:
        return result
    remainder = max(0.0, device[1] - sum(v for v, _ in result.values()))
    weights = [_fraction_of(p, allocated) for p in rest] if len(rest) > 1 else []
    if len(rest) == 1:  # the whole remainder, whatever its weight (the common case)
        shares = [1.0]
    elif all(w is not None for w in weights) and sum(w or 0.0 for w in weights) > 0:
        norm = sum(w or 0.0 for w in weights)
        shares = [(w or 0.0) / norm for w in weights]
    else:
        shares = [1.0 / len(rest)] * len(rest)
    lone = len(pods) == 1
    for pod, share in zip(rest, shares, strict=True):
        result[pod] = (remainder * share, lone)
    return result


def _fraction_of(pod: PodKey, allocated: dict[PodKey, float | None]) -> float | None:
    if pod in allocated:
        return allocated[pod]
    for key, fraction in allocated.items():  # inventory keys may lack the container
        if key.namespace == pod.namespace and key.pod == pod.pod:
            return fraction
    return None
