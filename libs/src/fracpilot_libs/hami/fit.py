"""HAMi's scheduler fit rules for one GPU, and the shares fracpilot asks HAMi for. Pure.

Written from Project-HAMi/HAMi at 4707fb02 (v2.10.0), ``pkg/device/nvidia/device.go``:

- :func:`device_request` is ``GenerateResourceRequests``: ``nvidia.com/gpumem`` is multiplied
  by ``memoryFactor``; ``nvidia.com/gpumem-percentage`` is clamped to 100 and 101 means unset;
  neither set means ``defaultMemory`` MiB, or 100 % when that is 0 (the chart's default);
  ``nvidia.com/gpucores`` defaults to ``defaultCores``. HAMi's webhook
  (``defaultExclusiveCoreIfNeeded``) adds ``gpucores: 100`` to a container that asks for
  ``nvidia.com/gpu`` with neither gpucores nor a memory size below the whole GPU.
- :func:`misfit` is the per-GPU part of ``Fit``, in its order: health; the slot count
  (``Count <= Used``: ``CardTimeSlicingExhausted``); cores clamped to 100; memory resolved
  (``Totalmem * percent / 100``, integer division, only without a gpumem); free memory; free
  cores; a 100-core request wants the GPU to itself; a 0-core request does not go on a GPU
  whose cores are all used. Not modelled: namespace ResourceQuota (``fitQuota``), card type /
  UUID / NUMA selection annotations, the mutex policy and MIG mode (fracpilot plans shares
  of hami-core GPUs only).
- :func:`add_usage` is ``AddResourceUsage``: a share takes a slot, its memory and its cores.

A fraction f becomes what fracpilot writes (:func:`share_limits`): ``gpucores`` and
``gpumem-percentage`` as whole percents rounded up (``percent``), ``gpumem`` as the MiB the
share needs divided by ``memoryFactor``, rounded up. Whole-percent rounding is why 0.375 and
0.625 (38 % + 63 % cores) do not fit one GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

GPU = "nvidia.com/gpu"
GPU_MEMORY = "nvidia.com/gpumem"
GPU_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
GPU_CORES = "nvidia.com/gpucores"
UNSET_PERCENT = 101  # HAMi's "no gpumem-percentage" sentinel


@dataclass(frozen=True)
class DeviceUsage:
    """The fields of HAMi's ``device.DeviceUsage`` that ``Fit`` reads, for one GPU."""

    count: int  # slots: deviceSplitCount
    total_memory_mib: int
    total_cores: int = 100
    used: int = 0  # shares on it
    used_memory_mib: int = 0
    used_cores: int = 0
    health: bool = True


@dataclass(frozen=True)
class DeviceRequest:
    """HAMi's ``ContainerDeviceRequest`` for one device (``Nums`` = 1)."""

    memory_mib: int = 0  # Memreq: gpumem times memoryFactor; 0: unset
    memory_percent: int = UNSET_PERCENT  # MemPercentagereq
    cores: int = 0  # Coresreq


def percent(fraction: float) -> int:
    """A fraction as HAMi's whole percent (gpucores, gpumem-percentage): rounded up, 1..100."""
    if not 0.0 < fraction <= 1.0 or not math.isfinite(fraction):
        raise ValueError(f"a fraction must be in (0, 1], not {fraction!r}")
    return max(1, min(100, math.ceil(round(fraction * 100, 9))))


def device_request(
    *,
    gpumem: int | None = None,
    gpumem_percentage: int | None = None,
    gpucores: int | None = None,
    memory_factor: int = 1,
    default_memory_mib: int = 0,
    default_cores: int = 0,
) -> DeviceRequest:
    """``GenerateResourceRequests`` for a container's HAMi limits (None: not set)."""
    memory = 0
    if gpumem is not None:
        if gpumem < 0:
            raise ValueError(f"{GPU_MEMORY} {gpumem} is negative")
        memory = gpumem * max(memory_factor, 1)
    mem_percent = UNSET_PERCENT
    if gpumem_percentage is not None and gpumem_percentage > 0:
        mem_percent = min(gpumem_percentage, 100)
    if mem_percent == UNSET_PERCENT and memory == 0:
        if default_memory_mib:
            memory = default_memory_mib
        else:
            mem_percent = 100
    cores = default_cores if gpucores is None else gpucores
    return DeviceRequest(memory_mib=memory, memory_percent=mem_percent, cores=cores)


def resolved_memory_mib(request: DeviceRequest, total_memory_mib: int) -> int:
    """The MiB ``Fit`` takes from the GPU for the request."""
    if request.memory_mib > 0:
        return request.memory_mib
    if request.memory_percent != UNSET_PERCENT:
        return total_memory_mib * request.memory_percent // 100
    return 0


def misfit(device: DeviceUsage, request: DeviceRequest) -> str | None:
    """Why ``Fit`` passes over this GPU for the request (upstream's reason names), or None."""
    if not device.health:
        return "CardNotHealth"
    if device.count <= device.used:
        return "CardTimeSlicingExhausted"
    cores = min(request.cores, 100)
    memory = resolved_memory_mib(request, device.total_memory_mib)
    if device.total_memory_mib - device.used_memory_mib < memory:
        return "CardInsufficientMemory"
    if device.total_cores - device.used_cores < cores:
        return "CardInsufficientCore"
    if device.total_cores == 100 and cores == 100 and device.used > 0:
        return "ExclusiveDeviceAllocateConflict"
    if device.total_cores != 0 and device.used_cores == device.total_cores and cores == 0:
        return "CardComputeUnitsExhausted"
    return None


def add_usage(device: DeviceUsage, request: DeviceRequest) -> DeviceUsage:
    """``AddResourceUsage``: the GPU with the share on it."""
    return replace(
        device,
        used=device.used + 1,
        used_memory_mib=device.used_memory_mib
        + resolved_memory_mib(request, device.total_memory_mib),
        used_cores=device.used_cores + min(request.cores, 100),
    )


def share_limits(fraction: float, device_memory_mib: int, memory_factor: int = 1) -> dict[str, int]:
    """What fracpilot writes for a share ``fraction`` of a GPU with ``device_memory_mib``
    (registered ``devmem``): gpucores and gpumem-percentage in whole percents, gpumem in
    HAMi's units (MiB / memoryFactor, rounded up so HAMi reserves at least the share)."""
    factor = max(memory_factor, 1)
    mib = math.ceil(round(fraction * device_memory_mib, 6))
    return {
        GPU_CORES: percent(fraction),
        GPU_MEMORY_PERCENT: percent(fraction),
        GPU_MEMORY: max(1, math.ceil(mib / factor)),
    }


def share_request(fraction: float, device_memory_mib: int, memory_factor: int = 1) -> DeviceRequest:
    """The request HAMi makes of a share fracpilot writes, as :func:`share_limits` says it.

    A pod may carry gpumem or only gpumem-percentage (fracpilot updates the forms the pod
    already uses), so the memory is the larger of the two readings: a plan that fits with it
    fits in either form."""
    limits = share_limits(fraction, device_memory_mib, memory_factor)
    by_memory = limits[GPU_MEMORY] * max(memory_factor, 1)
    by_percent = device_memory_mib * limits[GPU_MEMORY_PERCENT] // 100
    return DeviceRequest(memory_mib=max(by_memory, by_percent), cores=limits[GPU_CORES])


WHOLE_GPU_LIMITS = {GPU: 1, GPU_MEMORY_PERCENT: 100, GPU_CORES: 100}
"""A request HAMi fits only on a GPU nobody uses: all its memory (``gpumem-percentage: 100``)
and ``gpucores: 100`` (``ExclusiveDeviceAllocateConflict`` when ``Used > 0``), whatever
``defaultMemory`` / ``defaultCores`` say."""
