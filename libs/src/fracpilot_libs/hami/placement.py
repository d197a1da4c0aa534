"""HAMi's fit rules over the planner's cluster: :func:`hami_fit` is a
:data:`~fracpilot_libs.placement.planner.FitRule`, :func:`accepts` checks a whole cluster. Pure.

A HAMi GPU (``Gpu.slots`` set, from the register annotation) holds its shares as HAMi counts
them (``pkg/device/nvidia/device.go`` at 4707fb02, see :mod:`fracpilot_libs.hami.fit`): one
slot each, the memory and cores HAMi recorded in ``hami.io/vgpu-devices-allocated`` (a
placement's ``memory_mib``/``cores``), or, for a share fracpilot plans, what it will write
(:func:`~fracpilot_libs.hami.fit.share_request`). Other GPUs keep the planner's default rule.
"""

from __future__ import annotations

from fracpilot_libs.hami.fit import (
    DeviceRequest,
    DeviceUsage,
    add_usage,
    misfit,
    share_request,
)
from fracpilot_libs.placement.planner import ClusterState, FitRule, Gpu, Placement, share_fits

MIB = 2**20


def held(placement: Placement, gpu: Gpu, memory_factor: int = 1) -> DeviceRequest:
    """What a placement takes from a HAMi GPU: what HAMi recorded, else what fracpilot writes."""
    planned = share_request(placement.fraction, gpu.memory_bytes // MIB, memory_factor)
    return DeviceRequest(
        memory_mib=planned.memory_mib if placement.memory_mib is None else placement.memory_mib,
        cores=planned.cores if placement.cores is None else placement.cores,
    )


def usage(
    state: ClusterState, gpu: Gpu, excluding_pod: str = "", memory_factor: int = 1
) -> DeviceUsage:
    """The GPU as HAMi's ``Fit`` sees it, with every share on it but ``excluding_pod``."""
    device = DeviceUsage(
        count=gpu.slots or 0,
        total_memory_mib=gpu.memory_bytes // MIB,
        total_cores=gpu.cores,
        health=gpu.healthy,
    )
    for p in state.placements:
        if p.gpu_uuid == gpu.uuid and p.pod_key != excluding_pod:
            device = add_usage(device, held(p, gpu, memory_factor))
    return device


def hami_fit(memory_factor: int = 1) -> FitRule:
    """HAMi's fit rule for the planner (``memoryFactor`` of HAMi's scheduler config)."""

    def fit(state: ClusterState, gpu_uuid: str, fraction: float, pod_key: str) -> bool:
        gpu = state.gpu(gpu_uuid)
        if gpu is None or gpu.slots is None:
            return share_fits(state, gpu_uuid, fraction, pod_key)
        device = usage(state, gpu, pod_key, memory_factor)
        wanted = share_request(fraction, gpu.memory_bytes // MIB, memory_factor)
        return misfit(device, wanted) is None

    return fit


def accepts(state: ClusterState, memory_factor: int = 1) -> tuple[str, ...]:
    """Whether HAMi would accept every share where the cluster puts it: the shares are added
    to each HAMi GPU one by one, as HAMi's scheduler would bind them; the refusals, as
    ``"<pod>: <reason> on <uuid>"`` (empty: all fit)."""
    refused: list[str] = []
    for gpu in state.gpus:
        if gpu.slots is None:
            continue
        device = DeviceUsage(
            count=gpu.slots,
            total_memory_mib=gpu.memory_bytes // MIB,
            total_cores=gpu.cores,
            health=gpu.healthy,
        )
        for p in sorted(state.placements, key=lambda p: p.pod_key):
            if p.gpu_uuid != gpu.uuid:
                continue
            request = held(p, gpu, memory_factor)
            reason = misfit(device, request)
            if reason is not None:
                refused.append(f"{p.pod_key}: {reason} on {gpu.uuid}")
            device = add_usage(device, request)
    return tuple(refused)
