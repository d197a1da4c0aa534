"""Declarative tables from real exporters' metric names to what a ``UsageSample`` needs.

Each row says: this metric (with these labels present or absent) measures this quantity, in
this unit, at this level (a whole device, one container, one process), and which labels name
the pod and the GPU. Users extend or replace the tables in configuration (JSON, same shape).
Facts behind the defaults: ``shared/reference/gpu-sharing-facts.md`` (dcgm-exporter, HAMi
vGPUmonitor in the v2.9+ and legacy names, vLLM).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Quantity(StrEnum):
    COMPUTE = "compute"  # share of the GPU's compute, 0..1 after scaling
    MEMORY_USED = "memory_used"  # bytes after scaling
    MEMORY_FREE = "memory_free"  # bytes after scaling (device total = used + free + reserved)
    MEMORY_RESERVED = "memory_reserved"  # bytes after scaling (the driver's, never a pod's)
    MEMORY_TOTAL = "memory_total"  # bytes after scaling
    KV_CACHE = "kv_cache"  # application signal, 0..1
    KV_USED_TOKENS = "kv_used_tokens"  # tokens held in the KV pool (usage = used / capacity)
    KV_CAPACITY_TOKENS = "kv_capacity_tokens"  # tokens the KV pool holds
    KV_POOL_BYTES = "kv_pool_bytes"  # the KV pool's size, bytes
    # The longest sequence the server serves, tokens (vLLM max_model_len): the pool never
    # shrinks below one of it (sizing/kv_memory.py). No built-in row: map your own.
    KV_MAX_SEQUENCE_TOKENS = "kv_max_sequence_tokens"
    WAITING = "waiting"  # application signal, requests
    PREEMPTIONS = "preemptions"  # application counter: a rise is a contention event


class Level(StrEnum):
    DEVICE = "device"  # the whole GPU, whoever uses it
    CONTAINER = "container"  # one container's own use (HAMi-core's accounting)
    PROCESS = "process"  # one process's own use, mapped to its pod (dcgm per-process)
    APP = "app"  # an application's own metrics (vLLM), no GPU label needed


class LabelRoles(BaseModel):
    """Label names that carry each role, tried in order (first non-empty wins).

    Labels only an exporter writes come first: ``exported_*`` (with ``honor_labels: false``
    Prometheus renames an exporter's ``pod``/``namespace``/``container`` to these when the
    scrape target has its own), then the older spellings that Prometheus never renames
    (dcgm's ``pod_name``, HAMi legacy's ``podname``). The plain ``pod``/``namespace`` come
    last: they may be the scrape target's, that is, the exporter's own pod.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: tuple[str, ...] = (
        "exported_namespace",
        "pod_namespace",
        "podnamespace",
        "namespace",
    )
    pod: tuple[str, ...] = ("exported_pod", "pod_name", "podname", "pod")
    container: tuple[str, ...] = ("exported_container", "container_name", "ctrname", "container")
    gpu_uuid: tuple[str, ...] = ("UUID", "device_uuid", "deviceuuid")
    node: tuple[str, ...] = ("Hostname", "hostname", "node", "nodeid")
    model: tuple[str, ...] = ("modelName", "device_type", "devicetype")
    # Pods of the exporters themselves: a series naming one of these names no GPU user (an
    # idle GPU behind a renamed target whose own ``pod`` label is all that is left).
    exporter_pod_prefixes: tuple[str, ...] = (
        "dcgm-exporter",
        "nvidia-dcgm-exporter",
        "hami-device-plugin",
        "hami-vgpu-monitor",
        "hami-scheduler",
    )


def gpu_model_name(label: str) -> str:
    """The GPU's model as dcgm-exporter names it (``modelName="NVIDIA A100-SXM4-80GB"``).

    HAMi's ``device_type`` puts its vendor in front of the same name
    (``NVIDIA-NVIDIA A100-SXM4-80GB``, ``NVIDIA-Tesla T4``); that prefix is dropped so that
    both exporters name a card alike.
    """
    name = label.strip()
    if name.startswith("NVIDIA-"):
        name = name.removeprefix("NVIDIA-").strip()
    return name[:128]  # UsageSample.gpu_model's bound


class MetricMapping(BaseModel):
    """One metric name, what it measures, and how to read it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = Field(min_length=1)
    quantity: Quantity
    level: Level
    scale: float = Field(default=1.0, gt=0, description="multiply the value by this")
    requires_labels: tuple[str, ...] = Field(
        default=(), description="the series must carry these labels (non-empty)"
    )
    excludes_labels: tuple[str, ...] = Field(
        default=(), description="the series must not carry these labels"
    )
    family: str = Field(description="which exporter this row belongs to, for counters")
    value_labels: tuple[str, ...] = Field(
        default=(),
        description=(
            "an info metric (a gauge set to 1): the value is the product of these labels' "
            "numbers; a label that is not a number (vLLM writes 'None' before it knows) gives "
            "no value"
        ),
    )
    roles: LabelRoles = LabelRoles()

    def selects(self, labels: Mapping[str, str]) -> bool:
        # Loops, not all()/any() over generators: this runs once per point.
        for name in self.requires_labels:
            if not labels.get(name):
                return False
        for name in self.excludes_labels:  # noqa: SIM110 (the loop is the point)
            if labels.get(name):
                return False
        return True

    def value_of(self, value: float, labels: Mapping[str, str]) -> float | None:
        """The point's value before scaling: its own, or the product of ``value_labels``
        (None when one of them is absent or not a number)."""
        if not self.value_labels:
            return value
        product = 1.0
        for name in self.value_labels:
            try:
                product *= float(labels.get(name, ""))
            except ValueError:
                return None
        return product


MIB = 1024 * 1024
PERCENT = 0.01


def _rows_of(family: str, **common: Any) -> Callable[..., MetricMapping]:
    """The row builder of one family: a row is its metric, its quantity and what it sets beyond
    what all the family's rows share (``common``)."""

    def row(metric: str, quantity: Quantity, **own: Any) -> MetricMapping:
        return MetricMapping(metric=metric, quantity=quantity, family=family, **common, **own)

    return row


# dcgm-exporter: device series (copied to every sharing pod with a ``vgpu`` label under
# time-slicing), and since 4.5.3 per-process series for GPU_UTIL and FB_USED with ``pod_uid``.
_dcgm = _rows_of("dcgm", level=Level.DEVICE, excludes_labels=("pod_uid",))
DCGM = (
    _dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", Quantity.COMPUTE),
    _dcgm("DCGM_FI_DEV_GPU_UTIL", Quantity.COMPUTE, scale=PERCENT),
    _dcgm("DCGM_FI_DEV_FB_USED", Quantity.MEMORY_USED, scale=MIB),
    _dcgm("DCGM_FI_DEV_FB_FREE", Quantity.MEMORY_FREE, scale=MIB),
    # Exported by default since 4.3.1-4.4.0: without it used + free is short by the driver's reserve
    # (447 MiB of a T4's 15360). FB_TOTAL is not in the default counters but is used when a
    # counters file adds it.
    _dcgm("DCGM_FI_DEV_FB_RESERVED", Quantity.MEMORY_RESERVED, scale=MIB),
    _dcgm("DCGM_FI_DEV_FB_TOTAL", Quantity.MEMORY_TOTAL, scale=MIB),
)
_dcgm_process = _rows_of("dcgm-process", level=Level.PROCESS, requires_labels=("pod_uid",))
DCGM_PROCESS = (
    _dcgm_process("DCGM_FI_DEV_GPU_UTIL", Quantity.COMPUTE, scale=PERCENT),
    _dcgm_process("DCGM_FI_DEV_FB_USED", Quantity.MEMORY_USED, scale=MIB),
)
# HAMi vGPUmonitor, v2.9+ names: host (device) and per-container series.
_hami = _rows_of("hami")
HAMI = (
    _hami("hami_host_gpu_utilization_ratio", Quantity.COMPUTE, level=Level.DEVICE, scale=PERCENT),
    _hami("hami_host_gpu_memory_used_bytes", Quantity.MEMORY_USED, level=Level.DEVICE),
    _hami(
        "hami_container_device_utilization_ratio",
        Quantity.COMPUTE,
        level=Level.CONTAINER,
        scale=PERCENT,
    ),
    _hami("hami_vgpu_memory_used_bytes", Quantity.MEMORY_USED, level=Level.CONTAINER),
    # HAMi's scheduler (``:9395``, scraped by HAMi's chart's ServiceMonitor like vGPUmonitor):
    # each GPU's registered memory in bytes, the only device total HAMi exports (NVML memory
    # times ``deviceMemoryScaling``: above the card when HAMi oversubscribes).
    _hami("hami_gpu_memory_limit_bytes", Quantity.MEMORY_TOTAL, level=Level.DEVICE),
)
# HAMi up to v2.8 (and v2.9+ with --legacy-metrics): the same series under older names.
_hami_legacy = _rows_of("hami-legacy")
HAMI_LEGACY = (
    _hami_legacy("HostCoreUtilization", Quantity.COMPUTE, level=Level.DEVICE, scale=PERCENT),
    _hami_legacy("HostGPUMemoryUsage", Quantity.MEMORY_USED, level=Level.DEVICE),
    _hami_legacy(
        "Device_utilization_desc_of_container",
        Quantity.COMPUTE,
        level=Level.CONTAINER,
        scale=PERCENT,
    ),
    _hami_legacy("vGPU_device_memory_usage_in_bytes", Quantity.MEMORY_USED, level=Level.CONTAINER),
    _hami_legacy("GPUDeviceMemoryLimit", Quantity.MEMORY_TOTAL, level=Level.DEVICE),
)
# vLLM's own metrics: application signals, per pod.
_vllm = _rows_of("vllm", level=Level.APP)
VLLM = (
    _vllm("vllm:kv_cache_usage_perc", Quantity.KV_CACHE),
    _vllm("vllm:gpu_cache_usage_perc", Quantity.KV_CACHE),
    _vllm("vllm:num_requests_waiting", Quantity.WAITING),
    # A counter (``model_name``, V1 ``engine``): requests preempted for want of KV-cache room.
    _vllm("vllm:num_preemptions_total", Quantity.PREEMPTIONS),
)

# vLLM's KV pool (vllm/v1/metrics/loggers.py ``log_metrics_info``, at commit 005a810b): an info
# gauge set to 1 whose labels are ``CacheConfig.metrics_info()``, every field of CacheConfig as
# ``str(value)`` (vllm/config/cache.py at 002f10e0), plus ``engine``: ``num_gpu_blocks`` and
# ``block_size`` (tokens per block) give the pool in tokens; ``kv_cache_memory_bytes`` is the
# pool in bytes when ``--kv-cache-memory-bytes`` set it ("None" otherwise: vLLM exports no
# pool size in bytes of its own, the bytes per token being the model's).
VLLM_KV_POOL = (
    _vllm(
        "vllm:cache_config_info",
        Quantity.KV_CAPACITY_TOKENS,
        value_labels=("num_gpu_blocks", "block_size"),
    ),
    _vllm(
        "vllm:cache_config_info", Quantity.KV_POOL_BYTES, value_labels=("kv_cache_memory_bytes",)
    ),
)
# SGLang (python/sglang/srt/metrics/collector.py ``SchedulerMetricsCollector`` at 00ae9c15;
# labels ``model_name`` and, in newer versions, ``engine_type``, ``tp_rank``, ``pp_rank``):
# ``sglang:token_usage`` is the KV pool's share in use, 0..1; ``sglang:num_used_tokens`` and
# ``sglang:max_total_num_tokens`` ("Maximum total number of tokens in the KV cache pool") the
# same in tokens. No pool size in bytes is exported.
_sglang = _rows_of("sglang", level=Level.APP)
SGLANG = (
    _sglang("sglang:token_usage", Quantity.KV_CACHE),
    _sglang("sglang:num_used_tokens", Quantity.KV_USED_TOKENS),
    _sglang("sglang:max_total_num_tokens", Quantity.KV_CAPACITY_TOKENS),
)
# TGI (backends/v3/src/lib.rs and backend.rs at db931fcf, no labels): no KV usage gauge.
# ``tgi_batch_max_total_tokens`` is the token capacity warmup found room for (set once, v3 only)
# and ``tgi_batch_current_max_tokens`` the tokens the running batch may reach (0 when idle), so
# their ratio is the share of the pool the batch reserves: at or above what it uses.
_tgi = _rows_of("tgi", level=Level.APP)
TGI = (
    _tgi("tgi_batch_current_max_tokens", Quantity.KV_USED_TOKENS),
    _tgi("tgi_batch_max_total_tokens", Quantity.KV_CAPACITY_TOKENS),
)

BUILT_IN: dict[str, tuple[MetricMapping, ...]] = {
    "dcgm": DCGM,
    "dcgm-process": DCGM_PROCESS,
    "hami": HAMI,
    "hami-legacy": HAMI_LEGACY,
    "vllm": VLLM + VLLM_KV_POOL,
    "sglang": SGLANG,
    "tgi": TGI,
}
# The application families that name an LLM server that preallocates (llm_servers.LlmServer).
LLM_SERVER_FAMILIES = frozenset({"vllm", "sglang", "tgi"})


@dataclass(frozen=True)
class MappingTable:
    """Mappings indexed by metric name (one name may have rows for several levels)."""

    rows: tuple[MetricMapping, ...]

    @classmethod
    def of(
        cls, families: tuple[str, ...] = tuple(BUILT_IN), extra: tuple[MetricMapping, ...] = ()
    ) -> MappingTable:
        unknown = [f for f in families if f not in BUILT_IN]
        if unknown:
            raise ValueError(f"unknown mapping families {unknown}; known: {sorted(BUILT_IN)}")
        rows = tuple(r for f in families for r in BUILT_IN[f]) + extra
        return cls(rows)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.metric for r in self.rows))

    @property
    def rows_by_metric(self) -> Mapping[str, tuple[MetricMapping, ...]]:
        """The rows of each metric name, in table order; :meth:`match` tries them in turn."""
        return self._by_metric

    def match(self, metric: str, labels: Mapping[str, str]) -> MetricMapping | None:
        for row in self._by_metric.get(metric, ()):
            if row.selects(labels):
                return row
        return None

    def app_rows(self, metric: str, labels: Mapping[str, str]) -> tuple[MetricMapping, ...]:
        """Every application row that reads this series (an info metric feeds several)."""
        return tuple(
            row
            for row in self._by_metric.get(metric, ())
            if row.level is Level.APP and row.selects(labels)
        )

    @functools.cached_property
    def _by_metric(self) -> dict[str, tuple[MetricMapping, ...]]:
        """The rows of each metric name, in table order (``match`` runs once per point)."""
        by_metric: dict[str, list[MetricMapping]] = {}
        for row in self.rows:
            by_metric.setdefault(row.metric, []).append(row)
        return {metric: tuple(rows) for metric, rows in by_metric.items()}
