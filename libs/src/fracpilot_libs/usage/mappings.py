"""Declarative tables from real exporters' metric names to what a ``UsageSample`` needs.

Each row says: this metric (with these labels present or absent) measures this quantity, in
this unit, at this level (a whole device, one container, one process), and which labels name
the pod and the GPU. Users extend or replace the tables in configuration (JSON, same shape).
Facts behind the defaults: ``shared/reference/gpu-sharing-facts.md`` (dcgm-exporter, HAMi
vGPUmonitor in the v2.9+ and legacy names, vLLM).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

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

# dcgm-exporter: device series (copied to every sharing pod with a ``vgpu`` label under
# time-slicing), and since 4.5.3 per-process series for GPU_UTIL and FB_USED with ``pod_uid``.
DCGM = (
    MetricMapping(
        metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        quantity=Quantity.COMPUTE,
        level=Level.DEVICE,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
    MetricMapping(
        metric="DCGM_FI_DEV_GPU_UTIL",
        quantity=Quantity.COMPUTE,
        level=Level.DEVICE,
        scale=PERCENT,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
    MetricMapping(
        metric="DCGM_FI_DEV_FB_USED",
        quantity=Quantity.MEMORY_USED,
        level=Level.DEVICE,
        scale=MIB,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
    MetricMapping(
        metric="DCGM_FI_DEV_FB_FREE",
        quantity=Quantity.MEMORY_FREE,
        level=Level.DEVICE,
        scale=MIB,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
    # Exported by default since 4.3.1-4.4.0: without it used + free is short by the driver's reserve
    # (447 MiB of a T4's 15360). FB_TOTAL is not in the default counters but is used when a
    # counters file adds it.
    MetricMapping(
        metric="DCGM_FI_DEV_FB_RESERVED",
        quantity=Quantity.MEMORY_RESERVED,
        level=Level.DEVICE,
        scale=MIB,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
    MetricMapping(
        metric="DCGM_FI_DEV_FB_TOTAL",
        quantity=Quantity.MEMORY_TOTAL,
        level=Level.DEVICE,
        scale=MIB,
        family="dcgm",
        excludes_labels=("pod_uid",),
    ),
)
DCGM_PROCESS = (
    MetricMapping(
        metric="DCGM_FI_DEV_GPU_UTIL",
        quantity=Quantity.COMPUTE,
        level=Level.PROCESS,
        scale=PERCENT,
        family="dcgm-process",
        requires_labels=("pod_uid",),
    ),
    MetricMapping(
        metric="DCGM_FI_DEV_FB_USED",
        quantity=Quantity.MEMORY_USED,
        level=Level.PROCESS,
        scale=MIB,
        family="dcgm-process",
        requires_labels=("pod_uid",),
    ),
)
# HAMi vGPUmonitor, v2.9+ names: host (device) and per-container series.
HAMI = (
    MetricMapping(
        metric="hami_host_gpu_utilization_ratio",
        quantity=Quantity.COMPUTE,
        level=Level.DEVICE,
        scale=PERCENT,
        family="hami",
    ),
    MetricMapping(
        metric="hami_host_gpu_memory_used_bytes",
        quantity=Quantity.MEMORY_USED,
        level=Level.DEVICE,
        family="hami",
    ),
    MetricMapping(
        metric="hami_container_device_utilization_ratio",
        quantity=Quantity.COMPUTE,
        level=Level.CONTAINER,
        scale=PERCENT,
        family="hami",
    ),
    MetricMapping(
        metric="hami_vgpu_memory_used_bytes",
        quantity=Quantity.MEMORY_USED,
        level=Level.CONTAINER,
        family="hami",
    ),
    # HAMi's scheduler (``:9395``, scraped by HAMi's chart's ServiceMonitor like vGPUmonitor):
    # each GPU's registered memory in bytes, the only device total HAMi exports (NVML memory
    # times ``deviceMemoryScaling``: above the card when HAMi oversubscribes).
    MetricMapping(
        metric="hami_gpu_memory_limit_bytes",
        quantity=Quantity.MEMORY_TOTAL,
        level=Level.DEVICE,
        family="hami",
    ),
)
# HAMi up to v2.8 (and v2.9+ with --legacy-metrics): the same series under older names.
HAMI_LEGACY = (
    MetricMapping(
        metric="HostCoreUtilization",
        quantity=Quantity.COMPUTE,
        level=Level.DEVICE,
        scale=PERCENT,
        family="hami-legacy",
    ),
    MetricMapping(
        metric="HostGPUMemoryUsage",
        quantity=Quantity.MEMORY_USED,
        level=Level.DEVICE,
        family="hami-legacy",
    ),
    MetricMapping(
        metric="Device_utilization_desc_of_container",
        quantity=Quantity.COMPUTE,
        level=Level.CONTAINER,
        scale=PERCENT,
        family="hami-legacy",
    ),
    MetricMapping(
        metric="vGPU_device_memory_usage_in_bytes",
        quantity=Quantity.MEMORY_USED,
        level=Level.CONTAINER,
        family="hami-legacy",
    ),
    MetricMapping(
        metric="GPUDeviceMemoryLimit",
        quantity=Quantity.MEMORY_TOTAL,
        level=Level.DEVICE,
        family="hami-legacy",
    ),
)
# vLLM's own metrics: application signals, per pod.
VLLM = (
    MetricMapping(
        metric="vllm:kv_cache_usage_perc",
        quantity=Quantity.KV_CACHE,
        level=Level.APP,
        family="vllm",
    ),
    MetricMapping(
        metric="vllm:gpu_cache_usage_perc",
        quantity=Quantity.KV_CACHE,
        level=Level.APP,
        family="vllm",
    ),
    MetricMapping(
        metric="vllm:num_requests_waiting",
        quantity=Quantity.WAITING,
        level=Level.APP,
        family="vllm",
    ),
    # A counter (``model_name``, V1 ``engine``): requests preempted for want of KV-cache room.
    MetricMapping(
        metric="vllm:num_preemptions_total",
        quantity=Quantity.PREEMPTIONS,
        level=Level.APP,
        family="vllm",
    ),
)

# vLLM's KV pool (vllm/v1/metrics/loggers.py ``log_metrics_info``, at commit 005a810b): an info
# gauge set to 1 whose labels are ``CacheConfig.metrics_info()``, every field of CacheConfig as
# ``str(value)`` (vllm/config/cache.py at 002f10e0), plus ``engine``: ``num_gpu_blocks`` and
# ``block_size`` (tokens per block) give the pool in tokens; ``kv_cache_memory_bytes`` is the
# pool in bytes when ``--kv-cache-memory-bytes`` set it ("None" otherwise: vLLM exports no
# pool size in bytes of its own, the bytes per token being the model's).
VLLM_KV_POOL = (
    MetricMapping(
        metric="vllm:cache_config_info",
        quantity=Quantity.KV_CAPACITY_TOKENS,
        level=Level.APP,
        family="vllm",
        value_labels=("num_gpu_blocks", "block_size"),
    ),
    MetricMapping(
        metric="vllm:cache_config_info",
        quantity=Quantity.KV_POOL_BYTES,
        level=Level.APP,
        family="vllm",
        value_labels=("kv_cache_memory_bytes",),
    ),
)
# SGLang (python/sglang/srt/metrics/collector.py ``SchedulerMetricsCollector`` at 00ae9c15;
# labels ``model_name`` and, in newer versions, ``engine_type``, ``tp_rank``, ``pp_rank``):
# ``sglang:token_usage`` is the KV pool's share in use, 0..1; ``sglang:num_used_tokens`` and
# ``sglang:max_total_num_tokens`` ("Maximum total number of tokens in the KV cache pool") the
# same in tokens. No pool size in bytes is exported.
SGLANG = (
    MetricMapping(
        metric="sglang:token_usage",
        quantity=Quantity.KV_CACHE,
        level=Level.APP,
        family="sglang",
    ),
    MetricMapping(
        metric="sglang:num_used_tokens",
        quantity=Quantity.KV_USED_TOKENS,
        level=Level.APP,
        family="sglang",
    ),
    MetricMapping(
        metric="sglang:max_total_num_tokens",
        quantity=Quantity.KV_CAPACITY_TOKENS,
        level=Level.APP,
        family="sglang",
    ),
)
# TGI (backends/v3/src/lib.rs and backend.rs at db931fcf, no labels): no KV usage gauge.
# ``tgi_batch_max_total_tokens`` is the token capacity warmup found room for (set once, v3 only)
# and ``tgi_batch_current_max_tokens`` the tokens the running batch may reach (0 when idle), so
# their ratio is the share of the pool the batch reserves: at or above what it uses.
TGI = (
    MetricMapping(
        metric="tgi_batch_current_max_tokens",
        quantity=Quantity.KV_USED_TOKENS,
        level=Level.APP,
        family="tgi",
    ),
    MetricMapping(
        metric="tgi_batch_max_total_tokens",
        quantity=Quantity.KV_CAPACITY_TOKENS,
        level=Level.APP,
        family="tgi",
    ),
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
