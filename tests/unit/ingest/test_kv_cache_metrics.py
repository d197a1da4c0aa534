"""KV-cache metrics of vLLM, SGLang and TGI, in each server's own exposition format, through
ingest's parsing and attribution (the Prometheus source and the direct scrape share
``observe_points``) to the sample the engine reads.

The exposition text is written the way each server writes it, from its source:

- vLLM (``vllm/v1/metrics/loggers.py`` at 005a810b): prometheus_client gauges
  ``vllm:kv_cache_usage_perc`` and the deprecated ``vllm:gpu_cache_usage_perc`` with labels
  ``model_name``, ``engine``; ``vllm:cache_config_info`` a gauge set to 1 whose labels are
  ``CacheConfig.metrics_info()`` (every field as ``str(value)``, ``vllm/config/cache.py`` at
  002f10e0) plus ``engine``.
- SGLang (``python/sglang/srt/metrics/collector.py`` at 00ae9c15): prometheus_client gauges
  ``sglang:token_usage``, ``sglang:num_used_tokens``, ``sglang:max_total_num_tokens`` with the
  scheduler's labels (``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``).
- TGI (``backends/v3/src/lib.rs``, ``backend.rs`` at db931fcf): metrics-exporter-prometheus
  gauges without labels, ``tgi_batch_max_total_tokens`` and ``tgi_batch_current_max_tokens``.

Prometheus adds the pod's ``namespace`` and ``pod`` from its Kubernetes service discovery; the
direct scrape source adds only ``instance``, so the pod labels are added here as Prometheus's
relabelling would.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.contracts import AppSignals, UsageSample, WorkloadRef
from fracpilot_libs.usage.attribution import GpuInventory, MetricPoint, Observation, observe_points
from fracpilot_libs.usage.mappings import Level, MappingTable, MetricMapping, Quantity
from fracpilot_libs.usage.samples import PublishedSeries, to_sample

GIB = 1024**3
T = 1_772_409_600.0
GPU = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
POD = {"namespace": "inference", "pod": "chat-7c9d5f8b6d-x2k4p"}
TABLE = MappingTable.of()
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# CacheConfig.metrics_info() of a default vLLM after profiling (vllm/config/cache.py: fields and
# defaults; num_gpu_blocks set after profiling; unset options are str(None)).
CACHE_CONFIG = {
    "block_size": "16",
    "user_specified_block_size": "False",
    "gpu_memory_utilization": "0.92",
    "cache_dtype": "auto",
    "is_attention_free": "False",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "enable_prefix_caching": "True",
    "prefix_caching_hash_algo": "sha256",
    "mamba_page_size_padded": "None",
    "num_gpu_blocks": "27264",
    "num_cpu_blocks": "None",
    "kv_sharing_fast_prefill": "False",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_size": "None",
}


def vllm_text(usage: float, cache_config: dict[str, str], *, old_name: bool = False) -> str:
    """vLLM's /metrics as PrometheusStatLogger writes it (one engine)."""
    registry = CollectorRegistry()
    labels = {"model_name": MODEL, "engine": "0"}
    if old_name:  # before 0.9 only the older name
        g = Gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.",
            list(labels),
            registry=registry,
        )
    else:
        g = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            list(labels),
            registry=registry,
        )
    g.labels(**labels).set(usage)
    info = {**cache_config, "engine": "0"}
    Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        list(info),
        registry=registry,
    ).labels(**info).set(1)
    return generate_latest(registry).decode()


def sglang_text(ranks: dict[int, tuple[float, int]], capacity: int) -> str:
    """SGLang's /metrics: one series per TP rank, (token usage, used tokens)."""
    registry = CollectorRegistry()
    names = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    usage = Gauge("sglang:token_usage", "The token usage.", names, registry=registry)
    used = Gauge("sglang:num_used_tokens", "The number of used tokens.", names, registry=registry)
    total = Gauge(
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        names,
        registry=registry,
    )
    for rank, (ratio, tokens) in ranks.items():
        labels = {"model_name": MODEL, "engine_type": "unified", "tp_rank": str(rank)}
        labels["pp_rank"] = "0"
        usage.labels(**labels).set(ratio)
        used.labels(**labels).set(tokens)
        total.labels(**labels).set(capacity)
    return generate_latest(registry).decode()


def tgi_text(current: float, capacity: float) -> str:
    """TGI v3's router /metrics (metrics-exporter-prometheus: no labels, a TYPE line each)."""
    return (
        "# TYPE tgi_batch_current_max_tokens gauge\n"
        f"tgi_batch_current_max_tokens {current}\n"
        "# TYPE tgi_batch_max_total_tokens gauge\n"
        f"tgi_batch_max_total_tokens {capacity}\n"
        "# TYPE tgi_queue_size gauge\n"
        "tgi_queue_size 0\n"
    )


def dcgm(used_gib: float, free_gib: float) -> list[MetricPoint]:
    labels = {"UUID": GPU, "Hostname": "node-a", "modelName": "NVIDIA A100-SXM4-80GB", **POD}
    return [
        MetricPoint("DCGM_FI_DEV_GPU_UTIL", labels, 40.0, T),
        MetricPoint("DCGM_FI_DEV_FB_USED", labels, used_gib * 1024, T),
        MetricPoint("DCGM_FI_DEV_FB_FREE", labels, free_gib * 1024, T),
    ]


def scraped(text: str, table: MappingTable = TABLE) -> list[MetricPoint]:
    """The server's points as the scrape source reads them, with the pod's labels added."""
    points = parse_exposition(text, set(table.metric_names), "10.0.4.2:8000", T)
    return [MetricPoint(p.metric, {**p.labels, **POD}, p.value, p.timestamp) for p in points]


def observe(text: str, table: MappingTable = TABLE) -> tuple[Observation, list[str]]:
    points = dcgm(72, 8) + scraped(text, table)
    observations, rejections = observe_points(points, table, GpuInventory())
    (obs,) = observations
    return obs, [r.reason for r in rejections]


def sample_of(obs: Observation) -> UsageSample:
    ref = WorkloadRef(cluster="c", namespace="inference", owner_name="chat")
    sample = to_sample(obs, ref, "scrape", T + 1, 120.0, PublishedSeries())
    assert isinstance(sample, UsageSample)
    return sample


# --- vLLM --------------------------------------------------------------------------------------


def test_vllm_usage_and_server_are_read_and_the_pool_in_bytes_is_unknown_by_default() -> None:
    obs, rejections = observe(vllm_text(0.35, CACHE_CONFIG))
    assert rejections == []
    assert obs.kv_cache_usage == pytest.approx(0.35)
    assert obs.llm_server == "vllm"
    assert obs.kv_pool_bytes is None  # kv_cache_memory_bytes="None": vLLM does not say it
    assert obs.kv_pool_tokens == 27264 * 16  # num_gpu_blocks x block_size
    signals = sample_of(obs).signals
    assert signals == AppSignals(kv_cache_usage=0.35, llm_server="vllm", kv_pool_tokens=27264 * 16)


def test_vllm_pool_in_bytes_comes_from_kv_cache_memory_bytes_when_it_set_the_pool() -> None:
    config = {**CACHE_CONFIG, "kv_cache_memory_bytes": str(40 * GIB)}
    obs, rejections = observe(vllm_text(0.2, config))
    assert rejections == []
    assert obs.kv_pool_bytes == 40 * GIB
    sample = sample_of(obs)
    assert sample.signals is not None
    assert sample.signals.kv_pool_bytes == 40 * GIB
    assert sample.memory_used_bytes == 72 * GIB


def test_vllm_before_0_9_reports_its_usage_under_the_older_name() -> None:
    obs, _ = observe(vllm_text(0.6, CACHE_CONFIG, old_name=True))
    assert obs.kv_cache_usage == pytest.approx(0.6)
    assert obs.llm_server == "vllm"


def test_vllm_cache_config_before_profiling_gives_no_value_and_no_rejection() -> None:
    config = {**CACHE_CONFIG, "num_gpu_blocks": "None"}
    obs, rejections = observe(vllm_text(0.0, config))
    assert rejections == []
    assert obs.kv_cache_usage == 0.0
    assert obs.kv_pool_tokens is None


def test_cache_config_info_is_one_series_read_by_two_rows() -> None:
    rows = TABLE.app_rows("vllm:cache_config_info", {"engine": "0"})
    assert [r.quantity.value for r in rows] == ["kv_capacity_tokens", "kv_pool_bytes"]
    labels = {**CACHE_CONFIG}
    assert rows[0].value_of(1.0, labels) == 27264 * 16
    assert rows[1].value_of(1.0, labels) is None


# --- SGLang ------------------------------------------------------------------------------------


def test_sglang_token_usage_is_the_kv_usage_and_the_fullest_rank_speaks() -> None:
    obs, rejections = observe(sglang_text({0: (0.25, 1000), 1: (0.5, 2000)}, 4000))
    assert rejections == []
    assert obs.kv_cache_usage == pytest.approx(0.5)
    assert obs.llm_server == "sglang"
    assert obs.kv_pool_bytes is None  # SGLang exports its pool in tokens only
    assert obs.kv_pool_tokens == 4000


def test_sglang_without_token_usage_is_used_over_capacity_tokens() -> None:
    lines = sglang_text({0: (0.0, 3000)}, 4000).splitlines()
    text = "\n".join(line for line in lines if "token_usage" not in line)
    obs, _ = observe(text + "\n")
    assert obs.kv_cache_usage == pytest.approx(0.75)


# --- TGI ---------------------------------------------------------------------------------------


def test_tgi_has_no_usage_gauge_its_batch_reservation_over_capacity_stands_for_it() -> None:
    obs, rejections = observe(tgi_text(1536, 4096))
    assert rejections == []
    assert obs.kv_cache_usage == pytest.approx(0.375)
    assert obs.llm_server == "tgi"
    assert obs.kv_pool_tokens == 4096
    idle, _ = observe(tgi_text(0, 4096))
    assert idle.kv_cache_usage == 0.0


def test_a_pool_of_zero_tokens_is_no_pool_size() -> None:
    obs, rejections = observe(tgi_text(0, 0))  # a gauge at 0: before warmup set it
    assert rejections == []
    assert obs.kv_pool_tokens is None
    assert obs.kv_cache_usage is None


def test_a_longest_sequence_mapped_by_the_user_reaches_the_sample() -> None:
    # No server exports its max_model_len by default: a row of the user's own maps it.
    extra = MetricMapping(
        metric="vllm_max_model_len",  # e.g. a recording rule from the pod's --max-model-len
        quantity=Quantity.KV_MAX_SEQUENCE_TOKENS,
        level=Level.APP,
        family="vllm",
    )
    table = MappingTable.of(extra=(extra,))
    text = vllm_text(0.1, CACHE_CONFIG) + "vllm_max_model_len 8192\n"
    obs, rejections = observe(text, table)
    assert rejections == []
    assert obs.kv_max_sequence_tokens == 8192
    signals = sample_of(obs).signals
    assert signals is not None
    assert signals.kv_max_sequence_tokens == 8192


def test_tgi_v2_sets_no_capacity_so_there_is_no_kv_usage() -> None:
    text = "# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens 1536\n"
    obs, rejections = observe(text)
    assert rejections == []
    assert obs.kv_cache_usage is None
    assert obs.llm_server == "tgi"
    signals = sample_of(obs).signals
    assert signals is not None
    assert signals.kv_cache_usage is None


# --- bad input and the wire ----------------------------------------------------------------------


def test_usage_above_one_and_a_negative_pool_are_rejected_with_reasons() -> None:
    _, over = observe(vllm_text(1.5, CACHE_CONFIG))
    assert over == ["above_100_percent"]
    _, negative = observe(vllm_text(0.1, {**CACHE_CONFIG, "kv_cache_memory_bytes": "-5"}))
    assert negative == ["negative"]


def test_app_series_without_pod_labels_are_rejected_not_guessed() -> None:
    points = parse_exposition(vllm_text(0.3, CACHE_CONFIG), set(TABLE.metric_names), "h:8000", T)
    _, rejections = observe_points(dcgm(72, 8) + points, TABLE, GpuInventory())
    assert {r.reason for r in rejections} == {"no_pod"}


def test_a_sample_without_the_new_fields_still_parses_and_round_trips() -> None:
    old = {
        "sample_id": "s",
        "workload": {"cluster": "c", "namespace": "n", "owner_name": "w"},
        "pod": "p",
        "timestamp": datetime.fromtimestamp(T, UTC).isoformat(),
        "compute": 0.4,
        "memory_used_bytes": GIB,
        "memory_total_bytes": 80 * GIB,
        "source": "scrape",
        "signals": {"kv_cache_usage": 0.5},
    }
    sample = UsageSample.model_validate(old)
    assert sample.signals is not None
    assert sample.signals.kv_pool_bytes is None
    assert sample.signals.llm_server is None
    again = UsageSample.model_validate_json(
        sample.model_copy(
            update={"signals": AppSignals(kv_cache_usage=0.5, llm_server="vllm", kv_pool_bytes=7)}
        ).to_json()
    )
    assert again.signals == AppSignals(kv_cache_usage=0.5, llm_server="vllm", kv_pool_bytes=7)
