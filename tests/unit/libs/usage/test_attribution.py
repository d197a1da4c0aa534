"""Attribution: from the raw points of one instant to per-pod observations, or rejections."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.usage.attribution import (
    GpuInventory,
    MetricPoint,
    Observation,
    PodKey,
    Rejection,
    observe_points,
)
from fracpilot_libs.usage.mappings import MappingTable

MIB = 1024**2
GIB = 1024**3
T = 1_772_409_600.0  # 2026-03-02T00:00:00Z
TABLE = MappingTable.of()

GPU_A = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
GPU_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
DCGM_INSTANCE = "10.0.3.17:9400"
EXPORTER = {"pod": "dcgm-exporter-78z52", "namespace": "monitoring", "container": "exporter"}
CHAT = PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")
CODE = PodKey("inference", "code-5d4f8c7b9b-q7w9z", "vllm")


def point(metric: str, value: float, **labels: str) -> MetricPoint:
    return MetricPoint(metric, labels, value, T)


def pod_labels(
    pod: PodKey | None, style: str = "plain", exporter_pod: str = EXPORTER["pod"]
) -> dict[str, str]:
    """The pod labels a series carries: as the exporter wrote them (``plain``), or after
    Prometheus renamed them under ``honor_labels: false`` (``renamed``)."""
    if style == "plain":
        if pod is None:
            return {}
        return {"pod": pod.pod, "namespace": pod.namespace, "container": pod.container}
    labels = {**EXPORTER, "pod": exporter_pod}
    if pod is not None:
        labels |= {
            "exported_pod": pod.pod,
            "exported_namespace": pod.namespace,
            "exported_container": pod.container,
        }
    return labels


def dcgm(
    uuid: str,
    pod: PodKey | None = None,
    *,
    gr: float | None = None,
    util: float | None = None,
    used_mib: float | None = None,
    free_mib: float | None = None,
    style: str = "plain",
    host_label: str = "Hostname",
    ts: float = T,
    exporter_pod: str = EXPORTER["pod"],
    **extra: str,
) -> list[MetricPoint]:
    """dcgm-exporter's device series for one GPU (one copy, labelled for ``pod`` if given)."""
    labels = {
        "gpu": "0",
        "UUID": uuid,
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        host_label: "node-a",
        "instance": DCGM_INSTANCE,
        **pod_labels(pod, style, exporter_pod),
        **extra,
    }
    values = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr,
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_FB_USED": used_mib,
        "DCGM_FI_DEV_FB_FREE": free_mib,
    }
    return [MetricPoint(m, labels, v, ts) for m, v in values.items() if v is not None]


def process(
    uuid: str, pod: PodKey, *, util: float, used_mib: float, style: str = "plain", **extra: str
) -> list[MetricPoint]:
    """dcgm-exporter's per-process series (summed per pod, labelled with ``pod_uid``)."""
    labels = {
        "gpu": "0",
        "UUID": uuid,
        "Hostname": "node-a",
        "instance": DCGM_INSTANCE,
        "pod_uid": f"uid-{pod.pod}",
        **pod_labels(pod, style),
        **extra,
    }
    return [
        point("DCGM_FI_DEV_GPU_UTIL", util, **labels),
        point("DCGM_FI_DEV_FB_USED", used_mib, **labels),
    ]


def observe(
    points: list[MetricPoint], inventory: GpuInventory | None = None
) -> tuple[dict[PodKey, Observation], list[Rejection]]:
    observations, rejections = observe_points(points, TABLE, inventory or GpuInventory())
    by_pod = {o.pod: o for o in observations}
    assert len(by_pod) == len(observations), "one observation per pod and GPU here"
    return by_pod, rejections


def reasons(rejections: list[Rejection]) -> list[str]:
    return sorted(r.reason for r in rejections)


# --- one pod, device metrics ------------------------------------------------------------------


@pytest.mark.parametrize("style", ["plain", "renamed"])
@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_lone_pod_gets_the_device_numbers_exactly(style: str, host_label: str) -> None:
    points = dcgm(
        GPU_A,
        CHAT,
        gr=0.42,
        util=90,
        used_mib=10_240,
        free_mib=71_680,
        style=style,
        host_label=host_label,
    )
    obs, rejections = observe(points)
    assert rejections == []
    assert list(obs) == [CHAT]  # the exporter's own pod label never names the user
    o = obs[CHAT]
    assert o.gpu_uuid == GPU_A
    assert o.node == "node-a"
    assert o.timestamp == T
    assert o.compute == pytest.approx(0.42)  # GR_ENGINE_ACTIVE preferred over GPU_UTIL
    assert o.memory_used_bytes == 10 * GIB  # MiB -> bytes
    assert o.memory_total_bytes == 80 * GIB  # FB_USED + FB_FREE
    assert o.exact
    assert o.kv_cache_usage is None
    assert o.waiting_requests is None


def test_gr_engine_active_wins_whatever_the_order_of_points() -> None:
    points = dcgm(GPU_A, CHAT, gr=0.3, util=80, used_mib=1024, free_mib=1024)
    obs, _ = observe(list(reversed(points)))
    assert obs[CHAT].compute == pytest.approx(0.3)


def test_gpu_util_percent_is_used_when_alone() -> None:
    obs, rejections = observe(dcgm(GPU_A, CHAT, util=37, used_mib=2048, free_mib=2048))
    assert rejections == []
    assert obs[CHAT].compute == pytest.approx(0.37)
    assert obs[CHAT].memory_total_bytes == 4 * GIB


def test_old_namespace_labels_name_the_pod() -> None:
    points = dcgm(
        GPU_A,
        gr=0.5,
        used_mib=1024,
        free_mib=1024,
        pod_name=CHAT.pod,
        pod_namespace=CHAT.namespace,
        container_name="vllm",
    )
    obs, _ = observe(points)
    assert list(obs) == [CHAT]


def test_old_namespace_labels_win_over_the_scrape_targets_pod_label() -> None:
    # --use-old-namespace labels do not collide with the target's, so Prometheus keeps both.
    points = dcgm(
        GPU_A,
        gr=0.5,
        used_mib=1024,
        free_mib=1024,
        style="renamed",
        pod_name=CHAT.pod,
        pod_namespace=CHAT.namespace,
        container_name="vllm",
    )
    assert points[0].labels["pod"] == EXPORTER["pod"]
    obs, _ = observe(points)
    assert list(obs) == [CHAT]


def test_exported_labels_win_over_the_exporters_own_pod_labels() -> None:
    points = dcgm(GPU_A, CHAT, gr=0.2, used_mib=1024, free_mib=3072, style="renamed")
    assert all(p.labels["pod"] == EXPORTER["pod"] for p in points)
    obs, _ = observe(points)
    assert list(obs) == [CHAT]
    assert PodKey("monitoring", EXPORTER["pod"], "exporter") not in obs


def test_idle_gpu_of_a_renamed_instance_yields_no_observation() -> None:
    busy = dcgm(GPU_A, CHAT, gr=0.6, used_mib=4096, free_mib=4096, style="renamed")
    idle = dcgm(GPU_B, None, gr=0.0, used_mib=0, free_mib=81_920, style="renamed")
    assert all("exported_pod" not in p.labels and p.labels["pod"] for p in idle)
    observations, rejections = observe_points(busy + idle, TABLE, GpuInventory())
    assert [(o.pod, o.gpu_uuid) for o in observations] == [(CHAT, GPU_A)]
    assert rejections == []


def test_renaming_is_detected_per_scrape_target() -> None:
    # Same instance address, another job (e.g. two exporters behind one hostNetwork address):
    # the renaming seen on the dcgm job says nothing about the vLLM job's own pod label.
    busy = dcgm(GPU_A, CHAT, gr=0.6, used_mib=4096, free_mib=4096, style="renamed", job="dcgm")
    labels = {"pod": CHAT.pod, "namespace": CHAT.namespace, "instance": DCGM_INSTANCE}
    signals = [point("vllm:num_requests_waiting", 7, job="vllm", **labels)]
    idle = dcgm(GPU_B, None, gr=0.0, used_mib=0, free_mib=81_920, style="renamed", job="dcgm")
    obs, rejections = observe(busy + idle + signals)
    assert rejections == []
    assert list(obs) == [CHAT]
    assert obs[CHAT].waiting_requests == 7


def test_idle_gpu_without_any_pod_label_yields_nothing_even_without_device_memory() -> None:
    observations, rejections = observe_points(
        dcgm(GPU_B, None, gr=0.0, used_mib=0), TABLE, GpuInventory()
    )
    assert observations == []
    assert rejections == []


@pytest.mark.parametrize("exporter_pod", ["dcgm-exporter-78z52", "nvidia-dcgm-exporter-q4lz9"])
def test_all_idle_renamed_instance_names_no_pod(exporter_pod: str) -> None:
    # No series of the target carries exported_pod, so the renaming itself is invisible: only
    # the exporter's own pod name tells the idle GPUs apart from a user's pod.
    idle = [
        p
        for uuid in (GPU_A, GPU_B)
        for p in dcgm(
            uuid,
            None,
            gr=0.0,
            used_mib=0,
            free_mib=81_920,
            style="renamed",
            exporter_pod=exporter_pod,
        )
    ]
    assert all(p.labels["pod"] == exporter_pod for p in idle)
    observations, rejections = observe_points(idle, TABLE, GpuInventory())
    assert observations == []
    assert rejections == []


def test_all_idle_renamed_instance_of_a_release_prefixed_exporter_names_no_pod() -> None:
    exporter_pod = "gpu-monitoring-dcgm-exporter-78z52"
    idle = dcgm(
        GPU_A, None, gr=0.0, used_mib=0, free_mib=81_920, style="renamed", exporter_pod=exporter_pod
    )
    assert idle[0].labels["pod"] == exporter_pod
    observations, _ = observe_points(idle, TABLE, GpuInventory())
    assert [o.pod.pod for o in observations] == []


# --- sharing: device numbers only -------------------------------------------------------------


def shared_copies(gr: float, used_mib: float, free_mib: float) -> list[MetricPoint]:
    """Time-slicing with virtual GPUs: every sharing pod gets a copy of the device series."""
    return [
        p
        for pod, vgpu in ((CHAT, "0"), (CODE, "1"))
        for p in dcgm(GPU_A, pod, gr=gr, used_mib=used_mib, free_mib=free_mib, vgpu=vgpu)
    ]


def test_shared_gpu_is_split_by_allocated_fractions() -> None:
    inventory = GpuInventory(fractions={GPU_A: {CHAT: 0.25, CODE: 0.5}})
    obs, rejections = observe(shared_copies(gr=0.9, used_mib=30_720, free_mib=51_200), inventory)
    assert rejections == []
    assert set(obs) == {CHAT, CODE}
    assert obs[CHAT].compute == pytest.approx(0.3)
    assert obs[CODE].compute == pytest.approx(0.6)
    assert obs[CHAT].memory_used_bytes == 10 * GIB
    assert obs[CODE].memory_used_bytes == 20 * GIB
    assert all(not o.exact for o in obs.values())
    assert all(o.memory_total_bytes == 80 * GIB for o in obs.values())


def test_inventory_keys_without_container_still_give_the_fraction() -> None:
    inventory = GpuInventory(
        fractions={
            GPU_A: {PodKey(CHAT.namespace, CHAT.pod): 0.25, PodKey(CODE.namespace, CODE.pod): 0.5}
        }
    )
    obs, _ = observe(shared_copies(gr=0.9, used_mib=30_720, free_mib=51_200), inventory)
    assert obs[CHAT].compute == pytest.approx(0.3)
    assert obs[CODE].compute == pytest.approx(0.6)
    assert set(obs) == {CHAT, CODE}  # no duplicate pod from the container-less inventory key


@pytest.mark.parametrize(
    "fractions",
    [{}, {CHAT: 0.25}],  # unknown, or known for only one of the two
    ids=["unknown", "partly-known"],
)
def test_shared_gpu_is_split_equally_when_fractions_are_not_all_known(
    fractions: dict[PodKey, float],
) -> None:
    inventory = GpuInventory(fractions={GPU_A: fractions})
    obs, _ = observe(shared_copies(gr=0.5, used_mib=8192, free_mib=8192), inventory)
    assert obs[CHAT].compute == pytest.approx(0.25) == obs[CODE].compute
    assert obs[CHAT].memory_used_bytes == 4 * GIB == obs[CODE].memory_used_bytes
    assert not obs[CHAT].exact
    assert not obs[CODE].exact


@settings(max_examples=60, deadline=None)
@given(
    fractions=st.lists(st.one_of(st.none(), st.floats(0.05, 1.0)), min_size=1, max_size=5),
    compute=st.floats(0.0, 1.0),
    used_mib=st.integers(0, 81_920),
)
def test_split_shares_add_up_to_the_device_numbers(
    fractions: list[float | None], compute: float, used_mib: int
) -> None:
    pods = [PodKey("ns", f"pod-{i}", "c") for i in range(len(fractions))]
    points: list[MetricPoint] = []
    for i, pod in enumerate(pods):
        points += dcgm(
            GPU_A, pod, gr=compute, used_mib=used_mib, free_mib=81_920 - used_mib, vgpu=str(i)
        )
    known = {p: f for p, f in zip(pods, fractions, strict=True) if f is not None}
    obs, rejections = observe(points, GpuInventory(fractions={GPU_A: known}))
    assert rejections == []
    assert set(obs) == set(pods)
    assert math.fsum(o.compute for o in obs.values()) == pytest.approx(compute, abs=1e-9)
    memory = sum(o.memory_used_bytes for o in obs.values())
    assert used_mib * MIB - len(pods) <= memory <= used_mib * MIB  # each share floors to bytes
    assert all(o.exact == (len(pods) == 1) for o in obs.values())
    if len(known) == len(pods):  # all known: shares follow the fractions
        total = sum(known.values())
        for pod, o in obs.items():
            assert o.compute == pytest.approx(compute * known[pod] / total, abs=1e-9)
    else:
        assert len({round(o.compute, 12) for o in obs.values()}) == 1


# --- sharing: per-process and mixed -----------------------------------------------------------


def test_per_process_series_give_each_pod_its_own_numbers() -> None:
    points = (
        dcgm(GPU_A, CHAT, gr=0.8, free_mib=40_960, vgpu="0")
        + dcgm(GPU_A, CODE, gr=0.8, free_mib=40_960, vgpu="1")
        + dcgm(GPU_A, None, util=75, used_mib=40_960)  # the device-level rows, no pod labels
        + process(GPU_A, CHAT, util=50, used_mib=30_720)
        + process(GPU_A, CODE, util=25, used_mib=10_240)
    )
    inventory = GpuInventory(fractions={GPU_A: {CHAT: 0.5, CODE: 0.5}})
    obs, rejections = observe(points, inventory)
    assert rejections == []
    assert set(obs) == {CHAT, CODE}
    assert obs[CHAT].compute == pytest.approx(0.5)
    assert obs[CODE].compute == pytest.approx(0.25)
    assert obs[CHAT].memory_used_bytes == 30 * GIB
    assert obs[CODE].memory_used_bytes == 10 * GIB
    assert obs[CHAT].memory_total_bytes == 80 * GIB
    assert obs[CHAT].exact
    assert obs[CODE].exact


def test_several_process_series_of_one_pod_add_up_and_compute_is_capped() -> None:
    points = (
        dcgm(GPU_A, CHAT, gr=1.0, used_mib=20_480, free_mib=61_440)
        + process(GPU_A, CHAT, util=70, used_mib=8192, pid="101")
        + process(GPU_A, CHAT, util=60, used_mib=4096, pid="102")
    )
    obs, _ = observe(points)
    assert obs[CHAT].memory_used_bytes == 12 * GIB
    assert obs[CHAT].compute == 1.0  # 1.3 summed, capped at one whole GPU
    assert obs[CHAT].exact


def test_mixed_one_pod_with_own_numbers_the_other_gets_the_remainder() -> None:
    points = (
        dcgm(GPU_A, CHAT, gr=0.7, used_mib=30_720, free_mib=51_200, vgpu="0")
        + dcgm(GPU_A, CODE, gr=0.7, used_mib=30_720, free_mib=51_200, vgpu="1")
        + process(GPU_A, CHAT, util=40, used_mib=20_480)
    )
    obs, rejections = observe(points, GpuInventory(fractions={GPU_A: {CHAT: 0.25, CODE: 0.5}}))
    assert rejections == []
    assert obs[CHAT].compute == pytest.approx(0.4)
    assert obs[CHAT].memory_used_bytes == 20 * GIB
    assert obs[CHAT].exact
    assert obs[CODE].compute == pytest.approx(0.3)  # 0.7 - 0.4
    assert obs[CODE].memory_used_bytes == 10 * GIB  # 30 - 20 GiB
    assert not obs[CODE].exact


def test_remainder_never_goes_negative() -> None:
    points = (
        dcgm(GPU_A, CHAT, gr=0.2, used_mib=1024, free_mib=1024, vgpu="0")
        + dcgm(GPU_A, CODE, gr=0.2, used_mib=1024, free_mib=1024, vgpu="1")
        + process(GPU_A, CHAT, util=50, used_mib=1500)
    )
    obs, _ = observe(points)
    assert obs[CODE].compute == 0.0
    assert obs[CODE].memory_used_bytes == 0


@pytest.mark.parametrize("style", ["plain", "renamed"])
def test_time_sliced_per_process_series_with_vgpu_are_exact(style: str) -> None:
    # dcgm-exporter puts the pod's ``vgpu`` on its per-process series too (time-slicing IDs
    # ``<UUID>::<n>``); the device-level GPU_UTIL/FB_USED stay without pod labels.
    points = (
        dcgm(GPU_A, CHAT, gr=0.8, free_mib=40_960, vgpu="0", style=style)
        + dcgm(GPU_A, CODE, gr=0.8, free_mib=40_960, vgpu="1", style=style)
        + dcgm(GPU_A, None, util=75, used_mib=40_960, style=style)
        + process(GPU_A, CHAT, util=50, used_mib=30_720, vgpu="0", style=style)
        + process(GPU_A, CODE, util=25, used_mib=10_240, vgpu="1", style=style)
    )
    obs, rejections = observe(points)
    assert rejections == []
    assert set(obs) == {CHAT, CODE}
    assert obs[CHAT].exact
    assert obs[CODE].exact
    assert obs[CHAT].memory_used_bytes == 30 * GIB
    assert obs[CODE].memory_used_bytes == 10 * GIB
    assert obs[CHAT].compute == pytest.approx(0.5)
    assert obs[CODE].compute == pytest.approx(0.25)
    assert obs[CHAT].memory_total_bytes == 80 * GIB


# --- HAMi ---------------------------------------------------------------------------------------


def hami_v29(
    uuid: str, pod: PodKey, *, host_util: float, host_used: int, util: float, used: int
) -> list[MetricPoint]:
    """HAMi vGPUmonitor v2.9+: host series per GPU, container series per pod's vGPU."""
    host = {
        "node": "node-h",
        "device_index": "0",
        "device_uuid": uuid,
        "device_type": "NVIDIA-A100",
        "instance": "10.0.3.18:9394",
    }
    ctr = {
        "namespace": pod.namespace,
        "pod": pod.pod,
        "container": pod.container,
        "vdevice_index": "0",
        "device_uuid": uuid,
        "instance": "10.0.3.18:9394",
    }
    return [
        point("hami_host_gpu_utilization_ratio", host_util, **host),
        point("hami_host_gpu_memory_used_bytes", host_used, **host),
        point("hami_host_gpu_memory_controller_utilization_ratio", 12, **host),  # not mapped
        point("hami_container_device_utilization_ratio", util, **ctr),
        point("hami_vgpu_memory_used_bytes", used, **ctr),
        point("hami_vgpu_memory_limit_bytes", 40 * GIB, **ctr),  # not mapped
    ]


def hami_legacy(
    uuid: str, pod: PodKey, *, host_util: float, host_used: int, util: float, used: int
) -> list[MetricPoint]:
    """The same series under HAMi's names up to v2.8 (``--legacy-metrics``)."""
    host = {
        "nodeid": "node-h",
        "deviceidx": "0",
        "deviceuuid": uuid,
        "devicetype": "NVIDIA-A100",
        "instance": "10.0.3.18:9394",
    }
    ctr = {
        "podnamespace": pod.namespace,
        "podname": pod.pod,
        "ctrname": pod.container,
        "vdeviceid": "0",
        "deviceuuid": uuid,
        "instance": "10.0.3.18:9394",
    }
    return [
        point("HostCoreUtilization", host_util, **host),
        point("HostGPUMemoryUsage", host_used, **host),
        point("Device_utilization_desc_of_container", util, **ctr),
        point("vGPU_device_memory_usage_in_bytes", used, **ctr),
        point("vGPU_device_memory_limit_in_bytes", 40 * GIB, **ctr),  # not mapped
    ]


@pytest.mark.parametrize("names", [hami_v29, hami_legacy], ids=["v2.9+", "legacy"])
def test_hami_container_numbers_are_exact_and_the_host_remainder_is_shared(
    names: Callable[..., list[MetricPoint]],
) -> None:
    points = names(GPU_A, CHAT, host_util=60, host_used=30 * GIB, util=40, used=20 * GIB)
    # CODE holds a fraction of the same GPU but has no container series (yet).
    inventory = GpuInventory(
        device_memory_bytes={GPU_A: 80 * GIB}, fractions={GPU_A: {CHAT: 0.5, CODE: 0.25}}
    )
    obs, rejections = observe(points, inventory)
    assert rejections == []
    assert obs[CHAT].compute == pytest.approx(0.4)
    assert obs[CHAT].memory_used_bytes == 20 * GIB
    assert obs[CHAT].exact
    assert obs[CODE].compute == pytest.approx(0.2)  # host 60% minus the container's 40%
    assert obs[CODE].memory_used_bytes == 10 * GIB
    assert not obs[CODE].exact
    assert obs[CHAT].node == "node-h"
    assert obs[CHAT].memory_total_bytes == 80 * GIB


def test_hami_new_and_legacy_names_give_identical_observations() -> None:
    values: dict[str, Any] = {
        "host_util": 72.5,
        "host_used": 33 * GIB,
        "util": 41.0,
        "used": 17 * GIB,
    }
    inventory = GpuInventory(
        device_memory_bytes={GPU_A: 80 * GIB}, fractions={GPU_A: {CHAT: 0.5, CODE: 0.25}}
    )
    new = observe_points(hami_v29(GPU_A, CHAT, **values), TABLE, inventory)
    old = observe_points(hami_legacy(GPU_A, CHAT, **values), TABLE, inventory)
    assert new == old
    assert len(new[0]) == 2


def test_hami_without_inventory_device_memory_is_rejected() -> None:
    points = hami_v29(GPU_A, CHAT, host_util=10, host_used=GIB, util=10, used=GIB)
    observations, rejections = observe_points(points, TABLE, GpuInventory())
    assert observations == []
    assert reasons(rejections) == ["unknown_device_memory"]
    assert GPU_A in rejections[0].detail


def test_hami_v29_through_prometheus_uses_the_exported_labels() -> None:
    target = {"pod": "hami-device-plugin-x8z2k", "namespace": "kube-system", "container": "vgpu"}
    points = []
    for p in hami_v29(GPU_A, CHAT, host_util=50, host_used=GIB, util=40, used=GIB):
        labels = dict(p.labels)
        for role in ("pod", "namespace", "container"):  # honor_labels: false renames them
            if role in labels:
                labels[f"exported_{role}"] = labels.pop(role)
        points.append(MetricPoint(p.metric, {**labels, **target}, p.value, p.timestamp))
    obs, rejections = observe(points, GpuInventory(device_memory_bytes={GPU_A: 80 * GIB}))
    assert rejections == []
    assert list(obs) == [CHAT]
    assert obs[CHAT].exact


def test_hami_legacy_through_prometheus_names_the_workload_pod() -> None:
    target = {"pod": "hami-device-plugin-x8z2k", "namespace": "kube-system", "container": "vgpu"}
    points = [
        MetricPoint(p.metric, {**p.labels, **target}, p.value, p.timestamp)
        for p in hami_legacy(GPU_A, CHAT, host_util=50, host_used=GIB, util=40, used=GIB)
    ]
    # Legacy labels are not renamed by Prometheus: ``podname`` must win over the target's
    # ``pod``, and the host series (only the target's ``pod``) must name nobody.
    obs, rejections = observe(points, GpuInventory(device_memory_bytes={GPU_A: 80 * GIB}))
    assert rejections == []
    assert list(obs) == [CHAT]
    assert obs[CHAT].exact
    assert obs[CHAT].compute == pytest.approx(0.4)


# --- application signals ------------------------------------------------------------------------


def vllm(pod: PodKey, kv: float, waiting: float) -> list[MetricPoint]:
    labels = {
        "namespace": pod.namespace,
        "pod": pod.pod,
        "container": pod.container,
        "model_name": "meta-llama/Llama-3.1-8B-Instruct",
        "instance": "10.1.7.4:8000",
    }
    return [
        point("vllm:kv_cache_usage_perc", kv, **labels),
        point("vllm:num_requests_waiting", waiting, **labels),
    ]


@pytest.mark.parametrize("style", ["plain", "renamed"])
def test_vllm_signals_are_attached_to_the_pods_observation(style: str) -> None:
    points = (
        dcgm(GPU_A, CHAT, gr=0.5, used_mib=8192, free_mib=8192, vgpu="0", style=style)
        + dcgm(GPU_A, CODE, gr=0.5, used_mib=8192, free_mib=8192, vgpu="1", style=style)
        + vllm(CHAT, kv=0.73, waiting=4.0)
    )
    obs, rejections = observe(points)
    assert rejections == []
    assert obs[CHAT].kv_cache_usage == pytest.approx(0.73)
    assert obs[CHAT].waiting_requests == 4
    assert isinstance(obs[CHAT].waiting_requests, int)
    assert obs[CODE].kv_cache_usage is None
    assert obs[CODE].waiting_requests is None


def test_the_older_vllm_cache_name_is_read_too() -> None:
    labels = {"namespace": CHAT.namespace, "pod": CHAT.pod, "instance": "10.1.7.4:8000"}
    points = [
        *dcgm(GPU_A, CHAT, gr=0.5, used_mib=1024, free_mib=1024),
        point("vllm:gpu_cache_usage_perc", 0.25, **labels),
    ]
    obs, _ = observe(points)
    assert obs[CHAT].kv_cache_usage == pytest.approx(0.25)
    assert obs[CHAT].waiting_requests is None


def test_signals_of_a_pod_without_gpu_numbers_make_no_observation() -> None:
    observations, rejections = observe_points(vllm(CHAT, 0.5, 1), TABLE, GpuInventory())
    assert observations == []
    assert rejections == []


# --- bad points -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (point("DCGM_FI_DEV_GPU_UTIL", math.nan, UUID=GPU_B, instance=DCGM_INSTANCE), "nan"),
        (point("DCGM_FI_DEV_GPU_UTIL", math.inf, UUID=GPU_B, instance=DCGM_INSTANCE), "nan"),
        (point("DCGM_FI_DEV_FB_USED", -1, UUID=GPU_B, instance=DCGM_INSTANCE), "negative"),
        (
            point("DCGM_FI_DEV_GPU_UTIL", 100.5, UUID=GPU_B, instance=DCGM_INSTANCE),
            "above_100_percent",
        ),
        (
            point("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.2, UUID=GPU_B, instance=DCGM_INSTANCE),
            "above_100_percent",
        ),
        (
            point("vllm:kv_cache_usage_perc", 1.5, pod=CHAT.pod, namespace=CHAT.namespace),
            "above_100_percent",
        ),
        (point("DCGM_FI_DEV_GPU_UTIL", 50, gpu="1", instance=DCGM_INSTANCE), "no_gpu"),
        (point("DCGM_FI_DEV_GPU_UTIL", 50, UUID="", instance=DCGM_INSTANCE), "no_gpu"),
    ],
)
def test_a_bad_point_is_rejected_and_the_other_series_still_observed(
    bad: MetricPoint, reason: str
) -> None:
    good = dcgm(GPU_A, CHAT, gr=0.5, used_mib=1024, free_mib=1024)
    observations, rejections = observe_points([*good[:2], bad, *good[2:]], TABLE, GpuInventory())
    assert [o.pod for o in observations] == [CHAT]
    assert reasons(rejections) == [reason]
    assert bad.metric in rejections[0].detail


def test_exactly_100_percent_is_accepted() -> None:
    obs, rejections = observe(dcgm(GPU_A, CHAT, util=100, used_mib=1024, free_mib=1024))
    assert rejections == []
    assert obs[CHAT].compute == 1.0


def test_a_pod_missing_a_quantity_is_rejected_as_incomplete() -> None:
    points = dcgm(GPU_A, CHAT, gr=0.5, free_mib=1024)
    inventory = GpuInventory(device_memory_bytes={GPU_A: 80 * GIB})
    observations, rejections = observe_points(points, TABLE, inventory)
    assert observations == []
    assert reasons(rejections) == ["incomplete"]
    assert "memory" in rejections[0].detail
    assert CHAT.pod in rejections[0].detail


@pytest.mark.parametrize(
    ("used", "free", "reason"),
    [(math.nan, 1024, "nan"), (-1, 1024, "negative"), (1024, -1, "negative")],
)
def test_a_bad_fb_point_is_counted_once_not_again_as_what_it_leaves_missing(
    used: float, free: float, reason: str
) -> None:
    observations, rejections = observe_points(
        dcgm(GPU_A, CHAT, gr=0.5, used_mib=used, free_mib=free), TABLE, GpuInventory()
    )
    assert observations == []
    assert reasons(rejections) == [reason]


@pytest.mark.parametrize(
    "series",
    [
        process(GPU_A, CHAT, util=20, used_mib=1024)[0],
        point("hami_vgpu_memory_used_bytes", 1024, device_uuid=GPU_A, container="x"),
        point("vllm:num_requests_waiting", 3, model_name="m"),
    ],
    ids=["dcgm-process", "hami-container", "vllm"],
)
def test_a_per_pod_series_without_its_pod_label_is_counted(series: MetricPoint) -> None:
    labels = {k: v for k, v in series.labels.items() if k not in ("pod", "namespace")}
    bare = MetricPoint(series.metric, labels, series.value, series.timestamp)
    observations, rejections = observe_points([bare], TABLE, GpuInventory())
    assert observations == []
    assert reasons(rejections) == ["no_pod"]


def test_unknown_device_memory_is_rejected() -> None:
    observations, rejections = observe_points(
        dcgm(GPU_A, CHAT, gr=0.5, used_mib=1024), TABLE, GpuInventory()
    )
    assert observations == []
    assert reasons(rejections) == ["unknown_device_memory"]


@pytest.mark.parametrize(
    ("inventory", "total"),
    [
        (GpuInventory(device_memory_bytes={GPU_A: 40 * GIB}), 40 * GIB),
        (GpuInventory(default_device_memory_bytes=24 * GIB), 24 * GIB),
        (
            GpuInventory(
                device_memory_bytes={GPU_A: 40 * GIB}, default_device_memory_bytes=24 * GIB
            ),
            40 * GIB,
        ),
        (
            GpuInventory(
                device_memory_bytes={GPU_B: 40 * GIB}, default_device_memory_bytes=24 * GIB
            ),
            24 * GIB,
        ),
    ],
    ids=["per-gpu", "default", "per-gpu-over-default", "other-gpu-then-default"],
)
def test_device_memory_from_the_inventory_or_the_default(
    inventory: GpuInventory, total: int
) -> None:
    obs, rejections = observe(dcgm(GPU_A, CHAT, gr=0.5, used_mib=1024), inventory)
    assert rejections == []
    assert obs[CHAT].memory_total_bytes == total


def test_device_metrics_win_over_the_inventory_for_device_memory() -> None:
    inventory = GpuInventory(device_memory_bytes={GPU_A: 40 * GIB})
    obs, _ = observe(dcgm(GPU_A, CHAT, gr=0.5, used_mib=1024, free_mib=80 * 1024 - 1024), inventory)
    assert obs[CHAT].memory_total_bytes == 80 * GIB


# --- pods only the inventory knows ----------------------------------------------------------------


def test_pods_known_only_from_the_inventory_get_their_estimated_share() -> None:
    # dcgm without virtual GPUs: the series name one sharing pod (or none).
    points = dcgm(GPU_A, CHAT, gr=0.6, used_mib=24_576, free_mib=57_344)
    inventory = GpuInventory(fractions={GPU_A: {PodKey(CHAT.namespace, CHAT.pod): 0.5, CODE: 0.25}})
    obs, rejections = observe(points, inventory)
    assert rejections == []
    assert set(obs) == {CHAT, CODE}
    assert obs[CHAT].compute == pytest.approx(0.4)
    assert obs[CODE].compute == pytest.approx(0.2)
    assert obs[CHAT].memory_used_bytes == 16 * GIB
    assert obs[CODE].memory_used_bytes == 8 * GIB
    assert not obs[CHAT].exact
    assert not obs[CODE].exact


def test_unlabelled_gpu_is_split_between_the_inventorys_pods() -> None:
    points = dcgm(GPU_A, None, gr=0.9, used_mib=30_720, free_mib=51_200)
    obs, rejections = observe(points, GpuInventory(fractions={GPU_A: {CHAT: 0.25, CODE: 0.5}}))
    assert rejections == []
    assert obs[CHAT].compute == pytest.approx(0.3)
    assert obs[CODE].compute == pytest.approx(0.6)
    assert obs[CHAT].node == "node-a"


def test_inventory_pods_of_a_gpu_without_series_make_nothing() -> None:
    observations, rejections = observe_points(
        dcgm(GPU_A, CHAT, gr=0.6, used_mib=1024, free_mib=1024),
        TABLE,
        GpuInventory(fractions={GPU_B: {CODE: 0.5}}),
    )
    assert [(o.pod, o.gpu_uuid) for o in observations] == [(CHAT, GPU_A)]
    assert rejections == []


def test_gpus_are_attributed_independently_in_the_order_the_source_gave_them() -> None:
    # Not sorted by UUID (a scattered walk over 100,000 GPUs): the source's order, which is
    # deterministic for a given response; batches sort their samples by id in any case.
    a = dcgm(GPU_A, CHAT, gr=0.2, used_mib=2048, free_mib=2048)
    b = dcgm(GPU_B, CODE, gr=0.1, used_mib=1024, free_mib=1024)
    assert GPU_B < GPU_A
    observations, _ = observe_points(a + b, TABLE, GpuInventory())
    assert [(o.gpu_uuid, o.pod) for o in observations] == [(GPU_A, CHAT), (GPU_B, CODE)]
    assert [o.compute for o in observations] == pytest.approx([0.2, 0.1])
    assert all(o.exact for o in observations)
    # A GPU is placed where its first point is, its later points interleaved or not.
    mixed = [b[0], *a, *b[1:]]
    observations, _ = observe_points(mixed, TABLE, GpuInventory())
    assert [(o.gpu_uuid, o.pod) for o in observations] == [(GPU_B, CODE), (GPU_A, CHAT)]
    assert [o.compute for o in observations] == pytest.approx([0.1, 0.2])


def test_observation_time_is_the_instant_of_the_points() -> None:
    obs, _ = observe(dcgm(GPU_A, CHAT, gr=0.2, used_mib=1, free_mib=1, ts=T + 15))
    assert obs[CHAT].timestamp == T + 15


def test_no_points_no_observations() -> None:
    assert observe_points([], TABLE, GpuInventory()) == ([], [])


def test_unmapped_metrics_are_ignored_silently() -> None:
    points = [point("DCGM_FI_DEV_POWER_USAGE", math.nan, UUID=GPU_A, instance=DCGM_INSTANCE)]
    assert observe_points(points, TABLE, GpuInventory()) == ([], [])
