"""HAMi in the cluster view: a node's real GPUs and a pod's share, from HAMi's own objects. Pure.

- A node's GPUs come from ``hami.io/node-nvidia-register`` (:mod:`fracpilot_libs.hami.register`):
  real UUIDs, each with its memory (``devmem``), cores, type, health and slot count
  (``deviceSplitCount``). The node's ``nvidia.com/gpu`` is that slot count summed (10 per GPU by
  default), so it is never read as GPUs on such a node.
- A pod's share: once HAMi scheduled it, ``hami.io/vgpu-devices-allocated`` (``UUID,type,
  memMiB,cores`` per device, ``:`` per device, ``;`` per container; ``DecodeContainerDevices``
  in ``pkg/device/devices.go`` at 4707fb02 reads four fields or more) names the GPU and the MiB
  and cores HAMi counts against it; before, the container limits say how much
  (``GenerateResourceRequests``: ``nvidia.com/gpumem`` times ``memoryFactor``).
  The fraction is the share's MiB over the GPU's registered memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fracpilot_actuator.kube.object_values import (
    HAMI_ALLOCATED,
    HAMI_CORES,
    HAMI_MEMORY,
    HAMI_MEMORY_PERCENT,
    parse_hami_devices,
    parse_mib,
    parse_quantity_int,
)
from fracpilot_libs.contracts import MIB, GpuSharing
from fracpilot_libs.hami.placement import hami_fit
from fracpilot_libs.hami.register import HAMI_REGISTER, Register, RegisteredGpu, parse_register
from fracpilot_libs.placement.planner import FitRule, Gpu, share_fits


@dataclass(frozen=True)
class HamiShare:
    """What a HAMi pod holds of one GPU; ``cores`` None: HAMi has not said yet."""

    gpu_uuid: str  # real UUID, or ``<node>/unknown`` before HAMi scheduled the pod
    fraction: float
    memory_mib: int
    cores: int | None


def node_register(annotations: Mapping[str, str]) -> Register | None:
    """The node's register annotation, read; None when the node has none (not a HAMi node).
    Raises ValueError when the annotation is neither of HAMi's encodings."""
    text = annotations.get(HAMI_REGISTER)
    return None if text is None else parse_register(text)


def registered_gpus(node: str, gpus: tuple[RegisteredGpu, ...]) -> list[Gpu]:
    """The planner's GPUs of a HAMi node: one per physical GPU, with HAMi's limits on sharing."""
    return [
        Gpu(
            uuid=g.uuid,
            node=node,
            memory_bytes=g.memory_mib * MIB,
            slots=g.count,
            cores=g.cores,
            healthy=g.health,
            type=g.type,
        )
        for g in gpus
    ]


def hami_share(
    annotations: Mapping[str, str],
    limits: Mapping[str, str],
    *,
    node: str,
    gpus: Mapping[str, RegisteredGpu],
    default_memory_mib: int,
    memory_factor: int = 1,
) -> HamiShare:
    """The pod's share; ``gpus`` are the node's registered GPUs (empty on a node without the
    annotation: then every GPU has ``default_memory_mib``). Raises ValueError on bad values."""
    if HAMI_ALLOCATED in annotations:
        devices = [d for c in parse_hami_devices(annotations[HAMI_ALLOCATED]) for d in c]
        if len(devices) != 1:
            raise ValueError(
                f"{HAMI_ALLOCATED} lists {len(devices)} devices; a share of one GPU is resized"
            )
        device = devices[0]
        registered = gpus.get(device.uuid)
        if gpus and registered is None:
            raise ValueError(f"{HAMI_ALLOCATED} names {device.uuid}, which {node} did not register")
        total = registered.memory_mib if registered else default_memory_mib
        if not 0 < device.memory_mib <= total:
            raise ValueError(f"{HAMI_ALLOCATED} holds {device.memory_mib} MiB of a {total} MiB GPU")
        return HamiShare(device.uuid, device.memory_mib / total, device.memory_mib, device.cores)
    # Not scheduled by HAMi yet (or the annotation was removed): the limits say how much.
    total = min((g.memory_mib for g in gpus.values()), default=default_memory_mib)
    if HAMI_MEMORY in limits:
        memory = parse_mib(limits[HAMI_MEMORY], HAMI_MEMORY) * max(memory_factor, 1)
        if memory > total:
            raise ValueError(f"{HAMI_MEMORY} {memory} MiB is more than the GPU's memory")
        fraction = memory / total
    elif HAMI_MEMORY_PERCENT in limits:
        percent = parse_quantity_int(limits[HAMI_MEMORY_PERCENT])
        if not 0 < percent <= 100:
            raise ValueError(f"{HAMI_MEMORY_PERCENT} {percent} is not 1..100")
        fraction, memory = percent / 100, total * percent // 100
    else:
        raise ValueError(f"{HAMI_CORES} without {HAMI_MEMORY}: no memory share to resize")
    return HamiShare(f"{node}/unknown", fraction, memory, None)


def fit_rule(backend: GpuSharing | None, memory_factor: int = 1) -> FitRule:
    """The planner's fit rule for pods of ``backend``: HAMi's own for HAMi pods (on GPUs HAMi
    registered; elsewhere the free share), the free share otherwise."""
    return hami_fit(memory_factor) if backend is GpuSharing.HAMI else share_fits
