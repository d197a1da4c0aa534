"""HAMi's per-GPU fit rules, as ``Fit`` / ``GenerateResourceRequests`` / ``AddResourceUsage`` in
``pkg/device/nvidia/device.go`` (Project-HAMi/HAMi 4707fb02) decide them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_libs.hami.fit import (
    GPU_CORES,
    GPU_MEMORY,
    GPU_MEMORY_PERCENT,
    UNSET_PERCENT,
    DeviceRequest,
    DeviceUsage,
    add_usage,
    device_request,
    misfit,
    percent,
    resolved_memory_mib,
    share_limits,
    share_request,
)

T4 = DeviceUsage(count=10, total_memory_mib=15360)


def test_requests_as_hami_generates_them() -> None:
    # gpumem is multiplied by memoryFactor.
    assert device_request(gpumem=3000, memory_factor=4) == DeviceRequest(12000, UNSET_PERCENT, 0)
    # Neither memory form and defaultMemory 0: the whole memory (100 %).
    assert device_request() == DeviceRequest(0, 100, 0)
    assert device_request(default_memory_mib=2000) == DeviceRequest(2000, UNSET_PERCENT, 0)
    # gpumem-percentage above 100 is clamped; 0 is ignored.
    assert device_request(gpumem_percentage=150).memory_percent == 100
    assert device_request(gpumem_percentage=0).memory_percent == 100
    assert device_request(gpucores=30, default_cores=10).cores == 30
    assert device_request(default_cores=10).cores == 10


def test_memory_resolution_prefers_gpumem_and_truncates_percent() -> None:
    assert resolved_memory_mib(DeviceRequest(3000, 50, 0), 15360) == 3000
    assert resolved_memory_mib(DeviceRequest(0, 38, 0), 15361) == 15361 * 38 // 100


def test_each_rule_in_turn() -> None:
    assert misfit(T4, DeviceRequest(15360, cores=100)) is None
    assert misfit(DeviceUsage(10, 15360, health=False), DeviceRequest(1)) == "CardNotHealth"
    full = DeviceUsage(count=2, total_memory_mib=15360, used=2, used_memory_mib=2)
    assert misfit(full, DeviceRequest(1)) == "CardTimeSlicingExhausted"
    half = add_usage(T4, DeviceRequest(8000, cores=50))
    assert misfit(half, DeviceRequest(7361)) == "CardInsufficientMemory"
    assert misfit(half, DeviceRequest(7360, cores=51)) == "CardInsufficientCore"
    assert misfit(half, DeviceRequest(7360, cores=50)) is None
    used = add_usage(T4, DeviceRequest(10))
    assert misfit(used, DeviceRequest(10, cores=100)) == "ExclusiveDeviceAllocateConflict"
    all_cores = add_usage(T4, DeviceRequest(10, cores=100))
    assert misfit(all_cores, DeviceRequest(10, cores=0)) == "CardComputeUnitsExhausted"
    # Cores above 100 are clamped to 100, not refused.
    assert misfit(T4, DeviceRequest(10, cores=250)) is None


def test_whole_percent_rounding_refuses_what_fractions_would_allow() -> None:
    """0.375 + 0.625 is one GPU, but HAMi counts 38 % + 63 % cores."""
    assert (percent(0.375), percent(0.625)) == (38, 63)
    by_memory = add_usage(T4, DeviceRequest(5760, cores=38))  # pods sized by gpumem
    assert misfit(by_memory, DeviceRequest(9600, cores=63)) == "CardInsufficientCore"
    # With gpumem-percentage the memory rounds up too (38 % + 63 % of 15360 MiB).
    first = add_usage(T4, share_request(0.375, 15360))
    assert misfit(first, share_request(0.625, 15360)) == "CardInsufficientMemory"
    assert misfit(first, share_request(0.62, 15360)) is None


def test_share_limits_in_hamis_units() -> None:
    assert share_limits(0.375, 81920) == {GPU_CORES: 38, GPU_MEMORY_PERCENT: 38, GPU_MEMORY: 30720}
    # memoryFactor 1024 (gpumem in GiB): rounded up so HAMi reserves at least the share.
    assert share_limits(0.375, 81920, memory_factor=1024)[GPU_MEMORY] == 30
    assert share_limits(0.3, 15360, memory_factor=1000)[GPU_MEMORY] == 5  # 4608 MiB -> 5000
    # The planned request covers either form the pod may carry.
    assert share_request(0.375, 81920) == DeviceRequest(81920 * 38 // 100, cores=38)
    with pytest.raises(ValueError, match="a fraction must be in"):
        percent(0.0)


@given(
    st.lists(st.integers(min_value=1, max_value=100), max_size=14),
    st.integers(min_value=1, max_value=10),
)
def test_accepted_shares_never_overcommit(percents: list[int], slots: int) -> None:
    """Whatever HAMi's rules accept, one after the other, stays within the GPU."""
    device = DeviceUsage(count=slots, total_memory_mib=15360)
    for p in percents:
        request = share_request(p / 100, 15360)
        if misfit(device, request) is None:
            device = add_usage(device, request)
    assert device.used <= slots
    assert device.used_memory_mib <= 15360
    assert device.used_cores <= 100
