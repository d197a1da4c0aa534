"""``observe_points`` reads its rows at hand and has ``pod_of`` inline (a third of its time
per GPU): it must say exactly what the loop before it said, for any points."""

from __future__ import annotations

import math

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
from fracpilot_libs.usage.mappings import Level, MappingTable, MetricMapping, Quantity
from support.attribution_reference import reference_observe_points

# The built-in rows, and a user's rows where one that requires a label comes first.
CUSTOM = (
    MetricMapping(
        metric="custom_util",
        quantity=Quantity.COMPUTE,
        level=Level.CONTAINER,
        requires_labels=("pod_uid", "job"),
        family="custom",
    ),
    MetricMapping(metric="custom_util", quantity=Quantity.COMPUTE, level=Level.DEVICE, family="c"),
)
TABLES = (MappingTable.of(), MappingTable.of(extra=CUSTOM))
T = 1_772_409_600.0
METRICS = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "hami_host_gpu_memory_used_bytes",
    "hami_container_device_utilization_ratio",
    "hami_vgpu_memory_used_bytes",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "custom_util",
    "not_mapped",
)
PODS = ("chat-7c9d5f8b6d-x2k4p", "code-5d4f8c7b9b-q7w9z", "dcgm-exporter-78z52", "")
# Each label a series may carry, with the values it may take ("" as Prometheus never sends,
# but a user's mapping or a source could).
LABELS = {
    "UUID": ("GPU-a", "GPU-b", ""),
    "deviceuuid": ("GPU-a", "GPU-c"),
    "GPU_I_ID": ("1", ""),
    "GPU_I_PROFILE": ("1g.10gb", "9g.99gb"),
    "exported_pod": PODS,
    "pod_name": PODS,
    "pod": PODS,
    "podname": PODS,
    "exported_namespace": ("inference", ""),
    "namespace": ("monitoring", "inference"),
    "exported_container": ("vllm", ""),
    "container": ("exporter", "main"),
    "pod_uid": ("0b5e", ""),
    "job": ("dcgm", "hami"),
    "instance": ("10.0.3.17:9400", "10.0.3.18:9400"),
    "Hostname": ("node-1", ""),
    "modelName": ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA-Tesla T4"),
}
VALUES = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 1.5, 40.0, 2_048.0, -1.0, math.nan, math.inf]),
    st.floats(min_value=0, max_value=100_000, allow_nan=False),
)


@st.composite
def points(draw: st.DrawFn) -> MetricPoint:
    chosen = draw(st.lists(st.sampled_from(sorted(LABELS)), unique=True, max_size=len(LABELS)))
    labels = {name: draw(st.sampled_from(LABELS[name])) for name in chosen}
    at = T - draw(st.sampled_from([0.0, 15.0]))
    return MetricPoint(draw(st.sampled_from(METRICS)), labels, draw(VALUES), at)


@st.composite
def inventories(draw: st.DrawFn) -> GpuInventory:
    fractions: dict[str, dict[PodKey, float | None]] = {}
    for uuid in draw(st.lists(st.sampled_from(["GPU-a", "GPU-b"]), unique=True)):
        pods = draw(st.lists(st.sampled_from(PODS[:2]), unique=True, min_size=1))
        fractions[uuid] = {
            PodKey("inference", pod, draw(st.sampled_from(["", "vllm"]))): draw(
                st.sampled_from([None, 0.25, 0.5])
            )
            for pod in pods
        }
    memory = draw(st.dictionaries(st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]), st.just(80 << 30)))
    default = draw(st.sampled_from([None, 16 << 30]))
    return GpuInventory(memory, fractions, default)


@settings(max_examples=1000, deadline=None)
@given(st.lists(points(), max_size=12), inventories(), st.sampled_from(TABLES))
def test_observe_points_says_what_the_loop_before_said(
    instant: list[MetricPoint], inventory: GpuInventory, table: MappingTable
) -> None:
    observations, rejections = observe_points(instant, table, inventory)
    before, rejected_before = reference_observe_points(instant, table, inventory)
    # The loop before gave GPUs in UUID order, this one in the order they first came
    # (test_attribution's order test): the same observations, each GPU's pods in the same
    # order, and the same rejections.
    assert sorted(observations, key=_gpu) == before
    assert sorted(rejections, key=_text) == sorted(rejected_before, key=_text)


def _gpu(obs: Observation) -> str:
    return obs.gpu_uuid


def _text(rejection: Rejection) -> tuple[str, str]:
    return rejection.reason, rejection.detail
