"""Mapping tables: which exporter series measure what, at which level."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from fracpilot_libs.usage.mappings import (
    BUILT_IN,
    MIB,
    LabelRoles,
    Level,
    MappingTable,
    MetricMapping,
    Quantity,
)
from fracpilot_libs.validation import describe_validation_error

UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
ROWS = TypeAdapter(list[MetricMapping])

# dcgm-exporter with virtual GPUs: a device copy for a sharing pod, and a per-process series.
DEVICE_COPY = {"UUID": UUID, "pod": "chat-0", "namespace": "inference", "vgpu": "1"}
PROCESS_ROW = {"UUID": UUID, "pod": "chat-0", "namespace": "inference", "pod_uid": "a9c8-11"}


def test_all_families_by_default_in_declared_order() -> None:
    table = MappingTable.of()
    families = list(dict.fromkeys(r.family for r in table.rows))
    assert families == ["dcgm", "dcgm-process", "hami", "hami-legacy", "vllm", "sglang", "tgi"]
    assert len(table.rows) == sum(len(rows) for rows in BUILT_IN.values())


def test_selected_families_only() -> None:
    table = MappingTable.of(("hami",))
    assert {r.family for r in table.rows} == {"hami"}
    assert "DCGM_FI_DEV_GPU_UTIL" not in table.metric_names
    assert table.match("DCGM_FI_DEV_GPU_UTIL", {"UUID": UUID}) is None
    assert table.match("hami_vgpu_memory_used_bytes", {"device_uuid": UUID}) is not None


def test_unknown_family_is_an_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown mapping families") as info:
        MappingTable.of(("dcgm", "nvml-exporter"))
    message = str(info.value)
    assert "nvml-exporter" in message
    for known in BUILT_IN:
        assert known in message


def test_dcgm_device_series_and_process_series_of_one_name_map_to_different_levels() -> None:
    table = MappingTable.of()
    device = table.match("DCGM_FI_DEV_FB_USED", DEVICE_COPY)
    process = table.match("DCGM_FI_DEV_FB_USED", PROCESS_ROW)
    plain = table.match("DCGM_FI_DEV_FB_USED", {"UUID": UUID})
    assert device is not None
    assert device.level is Level.DEVICE
    assert device.family == "dcgm"
    assert process is not None
    assert process.level is Level.PROCESS
    assert process.family == "dcgm-process"
    assert plain is device
    assert device.quantity is process.quantity is Quantity.MEMORY_USED
    assert device.scale == process.scale == MIB


def test_required_label_must_be_non_empty() -> None:
    table = MappingTable.of(("dcgm-process",))
    assert table.match("DCGM_FI_DEV_GPU_UTIL", {**PROCESS_ROW, "pod_uid": ""}) is None
    assert table.match("DCGM_FI_DEV_GPU_UTIL", PROCESS_ROW) is not None


def test_excluded_label_with_an_empty_value_does_not_exclude() -> None:
    row = MetricMapping(
        metric="m",
        quantity=Quantity.COMPUTE,
        level=Level.DEVICE,
        family="x",
        excludes_labels=("a",),
    )
    assert row.selects({"a": ""})
    assert row.selects({})
    assert not row.selects({"a": "1"})


def test_a_pod_uid_series_is_a_process_row_with_or_without_vgpu() -> None:
    # Under time-slicing dcgm-exporter's per-process series carry ``vgpu`` as well as
    # ``pod_uid``; the device copies never carry ``pod_uid``.
    table = MappingTable.of(("dcgm", "dcgm-process"))
    for labels in (PROCESS_ROW, {**PROCESS_ROW, "vgpu": "2"}):
        for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
            row = table.match(metric, labels)
            assert row is not None, (metric, labels)
            assert row.level is Level.PROCESS, (metric, labels)
    # GR_ENGINE_ACTIVE and FB_FREE have no per-process rows: a pod_uid series is not read.
    assert table.match("DCGM_FI_PROF_GR_ENGINE_ACTIVE", PROCESS_ROW) is None
    assert table.match("DCGM_FI_DEV_FB_FREE", PROCESS_ROW) is None
    row = table.match("DCGM_FI_PROF_GR_ENGINE_ACTIVE", DEVICE_COPY)
    assert row is not None
    assert row.level is Level.DEVICE


def test_first_matching_row_wins_so_built_ins_precede_extras() -> None:
    extra = MetricMapping(
        metric="DCGM_FI_DEV_GPU_UTIL",
        quantity=Quantity.COMPUTE,
        level=Level.CONTAINER,
        family="custom",
    )
    table = MappingTable.of(("dcgm",), (extra,))
    found = table.match("DCGM_FI_DEV_GPU_UTIL", {"UUID": UUID})
    assert found is not None
    assert found.family == "dcgm"
    # ... but an extra row still serves the series the built-ins do not take.
    found = table.match("DCGM_FI_DEV_GPU_UTIL", {"UUID": UUID, "pod_uid": "u"})
    assert found is extra


def test_extra_rows_from_json_extend_the_table() -> None:
    raw = json.dumps(
        [
            {
                "metric": "nvidia_gpu_memory_used_bytes",
                "quantity": "memory_used",
                "level": "device",
                "family": "nvidia-smi",
                "roles": {"gpu_uuid": ["uuid"]},
            },
            {
                "metric": "sglang:token_usage",
                "quantity": "kv_cache",
                "level": "app",
                "family": "sglang",
                "scale": 0.01,
            },
        ]
    )
    extra = tuple(ROWS.validate_json(raw))
    table = MappingTable.of(("dcgm",), extra)
    assert table.metric_names[-2:] == ("nvidia_gpu_memory_used_bytes", "sglang:token_usage")
    row = table.match("nvidia_gpu_memory_used_bytes", {"uuid": UUID})
    assert row is not None
    assert row.roles.gpu_uuid == ("uuid",)
    assert row.roles.pod == LabelRoles().pod  # the roles not given keep their defaults
    assert row.roles.pod[0] == "exported_pod"
    sglang = table.match("sglang:token_usage", {})
    assert sglang is not None
    assert sglang.scale == pytest.approx(0.01)
    assert sglang.level is Level.APP
    assert sglang.quantity is Quantity.KV_CACHE


@pytest.mark.parametrize(
    ("row", "names"),
    [
        ({"metric": "m", "quantity": "compute", "level": "device"}, ["family", "Field required"]),
        (
            {"metric": "m", "quantity": "watts", "level": "device", "family": "f"},
            ["quantity", "compute", "memory_used"],
        ),
        (
            {"metric": "m", "quantity": "compute", "level": "node", "family": "f"},
            ["level", "device", "process"],
        ),
        (
            {"metric": "m", "quantity": "compute", "level": "device", "family": "f", "scale": 0},
            ["scale", "greater than 0"],
        ),
        (
            {"metric": "", "quantity": "compute", "level": "device", "family": "f"},
            ["metric", "at least 1"],
        ),
        (
            {"metric": "m", "quantity": "compute", "level": "device", "family": "f", "unit": "%"},
            ["unit", "Extra inputs are not permitted"],
        ),
        (
            {
                "metric": "m",
                "quantity": "compute",
                "level": "device",
                "family": "f",
                "roles": {"gpu": ["UUID"]},
            },
            ["roles.gpu", "Extra inputs are not permitted"],
        ),
    ],
)
def test_invalid_json_rows_fail_with_a_message_naming_the_field(
    row: dict[str, object], names: list[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        ROWS.validate_json(json.dumps([row]))
    message = describe_validation_error(info.value)
    for name in names:
        assert name in message, message
    assert message.startswith("0.")  # the row's index in the list comes first


def test_rows_are_immutable() -> None:
    row = MappingTable.of(("vllm",)).rows[0]
    with pytest.raises(ValidationError):
        row.scale = 2.0  # type: ignore[misc]


def test_metric_names_are_unique_and_keep_first_seen_order() -> None:
    table = MappingTable.of(("dcgm", "dcgm-process", "dcgm"))
    names = table.metric_names
    assert len(names) == len(set(names))
    assert names == (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_TOTAL",
    )
    assert len(table.rows) == 2 * 6 + 2


def test_every_built_in_name_is_selected_once_in_the_default_table() -> None:
    table = MappingTable.of()
    expected = {r.metric for rows in BUILT_IN.values() for r in rows}
    assert set(table.metric_names) == expected
    assert {"hami_host_gpu_utilization_ratio", "HostCoreUtilization"} <= expected
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"} <= expected


@pytest.mark.parametrize(
    ("metric", "scale"),
    [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),  # ratio 0-1
        ("DCGM_FI_DEV_GPU_UTIL", 0.01),  # percent
        ("DCGM_FI_DEV_FB_USED", MIB),  # MiB
        ("DCGM_FI_DEV_FB_FREE", MIB),
        ("hami_host_gpu_utilization_ratio", 0.01),  # 0-100
        ("hami_container_device_utilization_ratio", 0.01),
        ("hami_vgpu_memory_used_bytes", 1.0),  # bytes
        ("hami_host_gpu_memory_used_bytes", 1.0),
        ("HostCoreUtilization", 0.01),
        ("Device_utilization_desc_of_container", 0.01),
        ("vGPU_device_memory_usage_in_bytes", 1.0),
        ("HostGPUMemoryUsage", 1.0),
        ("vllm:kv_cache_usage_perc", 1.0),  # 0-1 despite the name
    ],
)
def test_units_of_the_built_in_rows(metric: str, scale: float) -> None:
    rows = [r for r in MappingTable.of().rows if r.metric == metric]
    assert rows
    assert all(r.scale == pytest.approx(scale) for r in rows)
