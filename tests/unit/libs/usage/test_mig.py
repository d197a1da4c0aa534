"""MIG GPU instances and device memory from dcgm's FB figures (reserved, total)."""

from __future__ import annotations

import pytest

from fracpilot_libs.usage.attribution import GpuInventory, MetricPoint, PodKey, observe_points
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.mig import (
    MigInstance,
    card_slices,
    compute_share,
    mig_instance,
    profile_memory_bytes,
)

MIB = 1024**2
GIB = 1024**3
T = 1_772_409_600.0
TABLE = MappingTable.of()
UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
CHAT = PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")
CODE = PodKey("inference", "code-5d4f8c7b9b-q7w9z", "vllm")


def series(metric: str, value: float, pod: PodKey | None = None, **extra: str) -> MetricPoint:
    labels = {
        "gpu": "0",
        "UUID": UUID,
        "modelName": extra.pop("model", "NVIDIA A100-SXM4-80GB"),
        "Hostname": "node-a",
        **extra,
    }
    if pod is not None:
        labels |= {"pod": pod.pod, "namespace": pod.namespace, "container": pod.container}
    return MetricPoint(metric, labels, value, T)


def instance(
    gi: str,
    profile: str,
    pod: PodKey,
    gr: float,
    fb: tuple[int, int] | None = None,
    model: str = "NVIDIA A100-SXM4-80GB",
) -> list[MetricPoint]:
    mig = {"GPU_I_ID": gi, "GPU_I_PROFILE": profile, "model": model}
    points = [series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr, pod, **mig)]
    if fb is not None:
        points.append(series("DCGM_FI_DEV_FB_USED", fb[0], pod, **mig))
        points.append(series("DCGM_FI_DEV_FB_FREE", fb[1], pod, **mig))
    return points


@pytest.mark.parametrize(
    ("profile", "model", "share", "memory"),
    [
        ("3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7, 40 * GIB),
        ("1g.10gb", "NVIDIA H100 80GB HBM3", 1 / 7, 10 * GIB),
        ("1g.10gb+me", "NVIDIA H100 80GB HBM3", 1 / 7, 10 * GIB),
        ("7g.80gb", "NVIDIA A100-SXM4-80GB", 1.0, 80 * GIB),
        ("1c.3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7, 40 * GIB),
        ("2g.12gb", "NVIDIA A30", 2 / 4, 12 * GIB),
        ("4g.24gb", "NVIDIA A30", 1.0, 24 * GIB),
        ("3g.71gb", "NVIDIA H200", 3 / 7, 71 * GIB),
        ("7g.180gb", "NVIDIA B200", 1.0, 180 * GIB),
        # the RTX PRO 6000's 4 compute slices (its table), not the 7 of the fallback
        ("1g.24gb", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 1 / 4, 24 * GIB),
        ("2g.48gb", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 2 / 4, 48 * GIB),
        ("4g.96gb+gfx", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 1.0, 96 * GIB),
        ("1g.23gb", "NVIDIA GB200", 1 / 7, 23 * GIB),
    ],
)
def test_profile_names_give_compute_share_and_nominal_memory(
    profile: str, model: str, share: float, memory: int
) -> None:
    assert compute_share(profile, model) == pytest.approx(share)
    assert profile_memory_bytes(profile) == memory


def test_unparsable_profile_says_nothing() -> None:
    assert compute_share("weird", "NVIDIA A100-SXM4-80GB") is None
    assert profile_memory_bytes("") is None
    assert card_slices("NVIDIA A30") == 4
    assert card_slices("NVIDIA A100-PCIE-40GB") == 7
    assert card_slices("NVIDIA B200") == 7
    assert card_slices("NVIDIA GB200") == 7  # its table's
    assert card_slices("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 4
    assert card_slices("NVIDIA RTX PRO 5000 Blackwell") == 7  # no table: the usual 7


def test_instance_identity_is_parent_uuid_and_instance_id() -> None:
    found = mig_instance(UUID, {"GPU_I_ID": "2", "GPU_I_PROFILE": "3g.40gb"})
    assert found == MigInstance(UUID, "2", "3g.40gb")
    assert found.device_id == f"{UUID}/GI2"
    assert mig_instance(UUID, {"gpu": "0"}) is None


def test_two_instances_of_one_card_are_two_exact_devices() -> None:
    points = instance("1", "3g.40gb", CHAT, 0.7, (20_000, 20_192)) + instance(
        "2", "3g.40gb", CODE, 0.14, (8_000, 32_192)
    )
    observations, rejections = observe_points(points, TABLE, GpuInventory())
    assert rejections == []
    by_pod = {o.pod: o for o in observations}
    assert by_pod[CHAT].gpu_uuid == f"{UUID}/GI1"
    assert by_pod[CODE].gpu_uuid == f"{UUID}/GI2"
    assert by_pod[CHAT].compute == pytest.approx(0.3)
    assert by_pod[CODE].compute == pytest.approx(0.06)
    assert by_pod[CHAT].memory_used_bytes == 20_000 * MIB
    # the card's scale: a 3g.40gb holds 4 of the card's 8 memory slices
    assert by_pod[CHAT].memory_total_bytes == 2 * 40_192 * MIB
    assert by_pod[CHAT].exact
    assert by_pod[CODE].exact
    assert by_pod[CHAT].gpu_model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"


@pytest.mark.parametrize(
    ("model", "profile", "card_scale_total", "compute"),
    [
        ("NVIDIA H100 80GB HBM3", "1g.10gb", 8 * 10 * GIB, 0.7 / 7),  # 1 of 8 memory slices
        ("NVIDIA B200", "1g.45gb", 4 * 45 * GIB, 0.7 / 7),  # 2 of 8
        ("NVIDIA H200", "3g.71gb", 2 * 71 * GIB, 0.7 * 3 / 7),  # 4 of 8
        ("NVIDIA A30", "1g.6gb", 4 * 6 * GIB, 0.7 / 4),  # 1 of the A30's 4
    ],
)
def test_instance_without_fb_figures_takes_the_profiles_memory_marked_estimated(
    model: str, profile: str, card_scale_total: int, compute: float
) -> None:
    mig = {"GPU_I_ID": "3", "GPU_I_PROFILE": profile, "model": model}
    points = [
        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.7, CHAT, **mig),
        # dcgm-exporter's per-process memory of the pod (the instance has no FB figures)
        series("DCGM_FI_DEV_FB_USED", 4_096, CHAT, pod_uid="uid-chat", **mig),
    ]
    observations, rejections = observe_points(points, TABLE, GpuInventory())
    assert rejections == []
    (obs,) = observations
    assert obs.memory_total_bytes == card_scale_total
    assert obs.memory_used_bytes == 4_096 * MIB
    assert obs.compute == pytest.approx(compute)
    assert not obs.exact


def test_unknown_profile_is_rejected_once() -> None:
    points = instance("1", "mystery", CHAT, 0.5, (1_000, 1_000))
    observations, rejections = observe_points(points, TABLE, GpuInventory())
    assert observations == []
    assert [r.reason for r in rejections] == ["unknown_mig_profile"]


# --- device memory from dcgm's FB figures ------------------------------------------------------


def _t4(pod: PodKey, **fb: float) -> list[MetricPoint]:
    points = [series("DCGM_FI_DEV_GPU_UTIL", 30, pod, model="Tesla T4")]
    points += [
        series(f"DCGM_FI_DEV_FB_{k.upper()}", v, pod, model="Tesla T4") for k, v in fb.items()
    ]
    return points


def test_device_total_counts_the_reserved_memory() -> None:
    observations, _ = observe_points(
        _t4(CHAT, used=5_120, free=9_791, reserved=447), TABLE, GpuInventory()
    )
    assert observations[0].memory_total_bytes == (5_120 + 9_791 + 447) * MIB


def test_fb_total_wins_when_exported() -> None:
    observations, _ = observe_points(
        _t4(CHAT, used=5_120, free=9_791, reserved=447, total=15_360), TABLE, GpuInventory()
    )
    assert observations[0].memory_total_bytes == 15_360 * MIB


def test_without_reserved_the_total_is_used_plus_free() -> None:
    observations, _ = observe_points(_t4(CHAT, used=5_120, free=9_791), TABLE, GpuInventory())
    assert observations[0].memory_total_bytes == (5_120 + 9_791) * MIB
