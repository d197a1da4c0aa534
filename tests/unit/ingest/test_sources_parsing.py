"""The sources' pure parts: the PromQL selector, the step grid, and parsing what comes back."""

from __future__ import annotations

import copy
import itertools
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.usage.attribution import GpuInventory, PodKey, observe_points
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.range_queries import (
    MAX_POINTS_PER_QUERY,
    aligned,
    chunks,
    points_by_instant,
    selector,
)

T = 1_772_409_600.0  # 2026-03-02T00:00:00Z
GPU_A = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
GPU_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"

# --- selector ---------------------------------------------------------------------------------

# Escapes a PromQL double-quoted string accepts (Go's, as in promql/parser/lex.go); any other
# backslash sequence, such as ``\.``, is a parse error ("unknown escape sequence").
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


def promql_unquote(body: str) -> str:
    """The value of a PromQL double-quoted string literal with this body (no octal/hex)."""
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == '"':
            raise ValueError(f"unescaped quote at {i} in {body!r}")
        if c == "\\":
            nxt = body[i + 1 : i + 2]
            if nxt not in _SIMPLE_ESCAPES:
                raise ValueError(f"unknown escape sequence \\{nxt} in {body!r}")
            out.append(_SIMPLE_ESCAPES[nxt])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def selector_regex(names: list[str]) -> re.Pattern[str]:
    """What Prometheus matches ``__name__`` against for ``selector(names)``."""
    text = selector(names)
    m = re.fullmatch(r'\{__name__=~"(.*)"\}', text)
    assert m, text
    return re.compile(promql_unquote(m.group(1)))


def test_selector_of_the_default_table() -> None:
    names = list(MappingTable.of().metric_names)
    text = selector(names)
    assert text.startswith('{__name__=~"')
    assert text.endswith('"}')
    assert "\\" not in text  # classic metric names need no escaping at all
    pattern = selector_regex(names)
    for name in names:
        assert pattern.fullmatch(name), name
    assert not pattern.fullmatch("DCGM_FI_DEV_POWER_USAGE")
    assert not pattern.fullmatch("DCGM_FI_DEV_GPU_UTIL_extra")
    assert not pattern.fullmatch("hami_vgpu_memory_limit_bytes")


def test_selector_keeps_colons_of_vllm_names_literal() -> None:
    pattern = selector_regex(["vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"])
    assert pattern.fullmatch("vllm:kv_cache_usage_perc")
    assert pattern.fullmatch("vllm:num_requests_waiting")
    assert not pattern.fullmatch("vllm:kv_cache_usage_percent")
    assert not pattern.fullmatch("vllm_kv_cache_usage_perc")


@pytest.mark.parametrize(
    ("name", "near_misses"),
    [
        ("gpu.utilization", ["gpuXutilization", "gpu.utilizationX"]),  # Prometheus 3 UTF-8 name
        ("a+b", ["aab", "aaab"]),
        ("job|other", ["job", "other"]),
        ("x(1)", ["x1"]),
        ("c*", ["", "ccc"]),
        ('say"hi', ["sayhi"]),
        ("back\\slash", ["backslash", "back\\\\slash"]),
    ],
)
def test_selector_escapes_regex_metacharacters_into_a_valid_promql_string(
    name: str, near_misses: list[str]
) -> None:
    # Classic names never need it, but extra mappings may name Prometheus 3 UTF-8 metrics;
    # a single bad escape would fail the one query that fetches every metric.
    pattern = selector_regex([name, "vllm:kv_cache_usage_perc"])
    assert pattern.fullmatch(name)
    assert pattern.fullmatch("vllm:kv_cache_usage_perc")
    for other in near_misses:
        assert not pattern.fullmatch(other), other


def test_selector_appends_extra_label_matchers() -> None:
    names = ["DCGM_FI_DEV_GPU_UTIL", "vllm:num_requests_waiting"]
    plain = selector(names)
    assert selector(names, "") == plain
    assert selector(names, "   ") == plain
    assert selector(names, ' job=~"dcgm.*|vllm" ') == (
        '{__name__=~"DCGM_FI_DEV_GPU_UTIL|vllm:num_requests_waiting", job=~"dcgm.*|vllm"}'
    )


# --- step grid --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ts", "step", "expected"),
    [(T + 14.9, 15.0, T), (T + 15.0, 15.0, T + 15), (T, 15.0, T), (T + 59.0, 60.0, T)],
)
def test_aligned_floors_to_the_step(ts: float, step: float, expected: float) -> None:
    assert aligned(ts, step) == expected


@given(ts=st.floats(1e9, 2e9), step=st.sampled_from([1.0, 5.0, 15.0, 30.0, 60.0, 300.0]))
def test_aligned_is_on_the_grid_not_after_and_idempotent(ts: float, step: float) -> None:
    a = aligned(ts, step)
    assert a <= ts < a + step
    assert a % step == 0
    assert aligned(a, step) == a


def test_chunks_of_a_short_range_is_one_query() -> None:
    assert chunks(T, T + 3600, 15.0) == [(T, T + 3600)]
    assert chunks(T, T, 15.0) == [(T, T)]
    assert chunks(T + 15, T, 15.0) == []


def test_chunks_of_a_long_range_stay_under_the_point_limit() -> None:
    step = 15.0
    end = T + 2.5 * MAX_POINTS_PER_QUERY * step
    pieces = chunks(T, end, step)
    assert pieces == [
        (T, T + (MAX_POINTS_PER_QUERY - 1) * step),
        (T + MAX_POINTS_PER_QUERY * step, T + (2 * MAX_POINTS_PER_QUERY - 1) * step),
        (T + 2 * MAX_POINTS_PER_QUERY * step, end),
    ]
    assert MAX_POINTS_PER_QUERY <= 11_000  # Prometheus refuses more points per series


@settings(max_examples=200)
@given(
    start_steps=st.integers(0, 10**6),
    n_steps=st.integers(-3, 3 * MAX_POINTS_PER_QUERY + 7),
    step=st.sampled_from([0.5, 1.0, 15.0, 30.0, 60.0]),
)
def test_chunks_cover_the_grid_without_gap_or_overlap(
    start_steps: int, n_steps: int, step: float
) -> None:
    start = T + start_steps * step
    end = start + n_steps * step
    pieces = chunks(start, end, step)
    if n_steps < 0:
        assert pieces == []
        return
    assert pieces[0][0] == start
    assert pieces[-1][1] == end
    for lo, hi in pieces:
        assert lo <= hi
        assert round((hi - lo) / step) + 1 <= MAX_POINTS_PER_QUERY
    for (_, hi), (lo, _) in itertools.pairwise(pieces):
        assert lo == hi + step  # the next piece starts at the next instant
    instants = sum(round((hi - lo) / step) + 1 for lo, hi in pieces)
    assert instants == n_steps + 1
    assert len(pieces) == math.ceil((n_steps + 1) / MAX_POINTS_PER_QUERY)


# --- range query results ----------------------------------------------------------------------


RANGE_RESULT = [
    {
        "metric": {
            "__name__": "DCGM_FI_DEV_GPU_UTIL",
            "UUID": GPU_A,
            "exported_pod": "chat-7c9d5f8b6d-x2k4p",
            "exported_namespace": "inference",
            "instance": "10.0.3.17:9400",
            "job": "dcgm-exporter",
        },
        "values": [[T, "42"], [T + 15, "NaN"], [T + 30, "not-a-number"]],
    },
    {
        "metric": {
            "__name__": "DCGM_FI_DEV_FB_USED",
            "UUID": GPU_A,
            "exported_pod": "chat-7c9d5f8b6d-x2k4p",
            "exported_namespace": "inference",
            "instance": "10.0.3.17:9400",
            "job": "dcgm-exporter",
        },
        "values": [[T, "1024"], [T + 15, "2048"], [T + 30, "+Inf"]],
    },
    {
        "metric": {"__name__": "vllm:num_requests_waiting", "pod": "chat-0", "namespace": "x"},
        "values": [[T + 15, "3"]],
    },
]


def test_points_by_instant_groups_by_timestamp() -> None:
    instants = points_by_instant(RANGE_RESULT)
    assert sorted(instants) == [T, T + 15, T + 30]
    assert [p.metric for p in instants[T]] == ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"]
    assert [p.metric for p in instants[T + 15]] == [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "vllm:num_requests_waiting",
    ]
    assert all(p.timestamp == ts for ts, points in instants.items() for p in points)
    first = instants[T][0]
    assert first.value == 42.0
    assert "__name__" not in first.labels
    assert first.labels["UUID"] == GPU_A
    assert first.labels["job"] == "dcgm-exporter"
    assert instants[T][1].value == 1024.0


def test_points_by_instant_turns_unreadable_values_into_nan() -> None:
    instants = points_by_instant(RANGE_RESULT)
    util_15, util_30 = instants[T + 15][0], instants[T + 30][0]
    assert math.isnan(util_15.value)
    assert math.isnan(util_30.value)  # "not-a-number" -> NaN, rejected later with a reason
    assert math.isinf(instants[T + 30][1].value)
    assert math.isnan(
        points_by_instant([{"metric": {"__name__": "m"}, "values": [[T, None]]}])[T][0].value
    )


def test_a_response_handed_over_gives_the_same_points_and_a_copy_is_left_alone() -> None:
    copied = points_by_instant(RANGE_RESULT)
    assert all("__name__" in series["metric"] for series in RANGE_RESULT)  # not changed
    handed_over = copy.deepcopy(RANGE_RESULT)
    owned = points_by_instant(handed_over, owned=True)
    assert repr(owned) == repr(copied)  # (repr: NaN is not equal to itself)
    # Its label dicts became the points' labels, without the name.
    assert owned[T][0].labels is handed_over[0]["metric"]
    assert "__name__" not in handed_over[0]["metric"]


def test_points_by_instant_of_nothing() -> None:
    assert points_by_instant([]) == {}
    assert points_by_instant([{"metric": {"__name__": "m"}, "values": []}]) == {}


def test_unreadable_values_end_as_rejections_not_crashes() -> None:
    instants = points_by_instant(RANGE_RESULT)
    _, rejections = observe_points(instants[T + 30], MappingTable.of(), GpuInventory())
    assert sorted(r.reason for r in rejections) == ["nan", "nan"]


# --- exposition text --------------------------------------------------------------------------

# dcgm-exporter (-k, no virtual GPUs) on a node with one busy and one idle GPU, then HAMi's
# vGPUmonitor in both name sets, then vLLM: what each /metrics endpoint writes, concatenated.
_DCGM0 = (
    f'gpu="0",UUID="{GPU_A}",pci_bus_id="00000000:07:00.0",device="nvidia0",'
    'modelName="NVIDIA A100-SXM4-80GB",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15",'
    'container="vllm",namespace="inference",pod="chat-7c9d5f8b6d-x2k4p"'
)
_DCGM1 = (
    f'gpu="1",UUID="{GPU_B}",pci_bus_id="00000000:0F:00.0",device="nvidia1",'
    'modelName="NVIDIA A100-SXM4-80GB",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15",'
    'container="",namespace="",pod=""'
)
_HAMI_HOST = (
    f'device_index="0",device_type="NVIDIA-NVIDIA A100-SXM4-80GB",device_uuid="{GPU_A}",'
    'node="node-a"'
)
_HAMI_CTR = (
    f'container="vllm",device_uuid="{GPU_A}",namespace="inference",'
    'pod="chat-7c9d5f8b6d-x2k4p",vdevice_index="0"'
)
_HAMI_LEGACY_CTR = (
    f'ctrname="vllm",deviceuuid="{GPU_A}",podname="chat-7c9d5f8b6d-x2k4p",'
    'podnamespace="inference",vdeviceid="0"'
)
_VLLM = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
EXPOSITION = f"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{_DCGM0}}} 37
DCGM_FI_DEV_GPU_UTIL{{{_DCGM1}}} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{_DCGM0}}} 20480
DCGM_FI_DEV_FB_USED{{{_DCGM1}}} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{{_DCGM0}}} 61440
DCGM_FI_DEV_FB_FREE{{{_DCGM1}}} 81920
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{_DCGM0}}} 231.5
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_DCGM0}}} 0.412345
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_DCGM1}}} 0.000000
# HELP hami_host_gpu_memory_used_bytes GPU device memory usage
# TYPE hami_host_gpu_memory_used_bytes gauge
hami_host_gpu_memory_used_bytes{{{_HAMI_HOST}}} 2.147483648e+10
# HELP hami_vgpu_memory_used_bytes vGPU device memory usage
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{{{_HAMI_CTR}}} 1.6106127e+10
# HELP hami_vgpu_memory_limit_bytes vGPU device memory limit
# TYPE hami_vgpu_memory_limit_bytes gauge
hami_vgpu_memory_limit_bytes{{{_HAMI_CTR}}} 4.294967296e+10
# HELP vGPU_device_memory_usage_in_bytes vGPU device usage
# TYPE vGPU_device_memory_usage_in_bytes gauge
vGPU_device_memory_usage_in_bytes{{{_HAMI_LEGACY_CTR}}} 1.6106127e+10
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{_VLLM}}} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{_VLLM}}} 123456.0
"""


def test_every_sample_line_of_the_exposition_is_read() -> None:
    lines = [line for line in EXPOSITION.splitlines() if not line.startswith("#")]
    names = {line.split("{")[0] for line in lines}
    points = parse_exposition(EXPOSITION, names, "h:1", T)
    assert len(points) == len(lines) == 15


def test_parse_exposition_keeps_only_wanted_metrics() -> None:
    wanted = set(MappingTable.of().metric_names)
    points = parse_exposition(EXPOSITION, wanted, "10.0.3.17:9400", T)
    names = [p.metric for p in points]
    assert names == [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "hami_host_gpu_memory_used_bytes",
        "hami_vgpu_memory_used_bytes",
        "vGPU_device_memory_usage_in_bytes",
        "vllm:num_requests_waiting",
    ]
    assert all(p.timestamp == T for p in points)
    assert points[0].value == 37.0
    assert points[6].value == pytest.approx(0.412345)
    assert points[8].value == 2.147483648e10


def test_parse_exposition_drops_empty_labels_and_adds_instance() -> None:
    points = parse_exposition(EXPOSITION, {"DCGM_FI_DEV_GPU_UTIL"}, "10.0.3.17:9400", T)
    busy, idle = points
    assert busy.labels == {
        "gpu": "0",
        "UUID": GPU_A,
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "container": "vllm",
        "namespace": "inference",
        "pod": "chat-7c9d5f8b6d-x2k4p",
        "instance": "10.0.3.17:9400",
    }
    assert "pod" not in idle.labels
    assert "namespace" not in idle.labels
    assert "container" not in idle.labels
    assert idle.labels["instance"] == "10.0.3.17:9400"


def test_parse_exposition_keeps_an_exporters_own_instance_label() -> None:
    text = 'm{instance="gpu-host:9400",UUID="x"} 1\n'
    (p,) = parse_exposition(text, {"m"}, "10.0.3.17:9400", T)
    assert p.labels["instance"] == "gpu-host:9400"


def test_parse_exposition_reads_counters_by_their_sample_name() -> None:
    points = parse_exposition(EXPOSITION, {"vllm:prompt_tokens_total"}, "h:8000", T)
    assert [(p.metric, p.value) for p in points] == [("vllm:prompt_tokens_total", 123456.0)]
    assert parse_exposition(EXPOSITION, {"vllm:prompt_tokens"}, "h:8000", T) == []


def test_parse_exposition_of_nothing_wanted_or_empty_text() -> None:
    assert parse_exposition(EXPOSITION, set(), "h:1", T) == []
    assert parse_exposition("", {"DCGM_FI_DEV_GPU_UTIL"}, "h:1", T) == []


def test_scraped_dcgm_exposition_is_attributed_end_to_end() -> None:
    table = MappingTable.of(("dcgm",))
    points = parse_exposition(EXPOSITION, set(table.metric_names), "10.0.3.17:9400", T)
    observations, rejections = observe_points(points, table, GpuInventory())
    assert rejections == []
    assert len(observations) == 1  # the idle GPU names no pod
    (obs,) = observations
    assert obs.pod == PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")
    assert obs.gpu_uuid == GPU_A
    assert obs.node == "node-a"
    assert obs.compute == pytest.approx(0.412345)
    assert obs.memory_used_bytes == 20 * 1024**3
    assert obs.memory_total_bytes == 80 * 1024**3
    assert obs.exact
