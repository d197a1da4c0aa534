"""The ingest service's settings: ``FRACPILOT_*`` environment variables, grouped.

Groups are nested models whose variables stay flat (``FRACPILOT_SIM_SPEED`` is
``sim.speed``, ``FRACPILOT_PROMETHEUS_URL`` is ``prometheus.url``); each group is passed whole
to the component that reads it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field, TypeAdapter, field_validator, model_validator

from fracpilot_ingest.shard_plan import SHARD_COUNTS
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.kai import KaiSettings
from fracpilot_libs.prometheus_access import PrometheusAccess
from fracpilot_libs.usage.mappings import MappingTable, MetricMapping


class PrometheusSettings(PrometheusAccess):
    """FRACPILOT_PROMETHEUS_*: the shared access settings, and how far behind now to stay."""

    delay_s: float = Field(
        default=0.0, ge=0, description="query only up to now minus this (ingestion delay)"
    )


class SimulatorSettings(BaseModel):
    """FRACPILOT_SIM_*: the demo's workload simulator."""

    start: datetime = Field(
        default=datetime(2026, 3, 2, tzinfo=UTC), description="simulated time of the first sample"
    )
    step_s: float = Field(default=60.0, gt=0, description="simulated seconds between samples")
    speed: float = Field(
        default=720.0, gt=0, description="simulated seconds per real second (720: a day in 2 min)"
    )
    duration_s: float = Field(
        default=86_400.0, ge=0, description="simulated span to produce; 0 runs forever"
    )
    workloads: int = Field(default=8, ge=1, le=8)
    namespace: str = "inference"
    cluster: str = "demo"


class RestartSettings(BaseModel):
    """FRACPILOT_RESTARTS_*: how a usage source that raised is started again."""

    backoff_s: float = Field(
        default=1.0, gt=0, description="first pause before a crashed source is restarted"
    )
    backoff_max_s: float = Field(
        default=60.0, gt=0, description="longest pause between restarts (the pause doubles)"
    )
    failing_after: int = Field(
        default=3,
        ge=1,
        description="crashes in a row (no completed read between) that make ingest not ready",
    )


class ShardSettings(BaseModel):
    """FRACPILOT_INGEST_*: ingest replicas sharing one Prometheus source
    (:mod:`fracpilot_ingest.shards`)."""

    shards: int = Field(
        default=0,
        ge=0,
        le=256,
        description="split the prometheus source's GPUs into this many shards (a power of two "
        "up to 256: a shard is a set of values of the GPU UUID's last hex digits, which "
        "Prometheus selects), shared among the ingest replicas by leases in KV; 0 or 1: one "
        "ingest publishes every GPU",
    )
    shard_lease_s: float = Field(
        default=10.0,
        ge=1.0,
        description="a replica's shards move to the others this long after it dies (the TTL "
        "of the shard lease bucket); the same on every replica",
    )
    replica_id: str | None = Field(
        default=None, description="this replica's name in the shard leases; unique"
    )

    @field_validator("shards")
    @classmethod
    def _a_power_of_two(cls, shards: int) -> int:
        if shards > 1 and shards not in SHARD_COUNTS:
            raise ValueError(f"{shards} shards: 0, 1 or a power of two up to 256")
        return shards

    @property
    def sharded(self) -> bool:
        return self.shards > 1


class IngestSettings(ServiceSettings):
    sources: str = Field(
        default="simulator", description="comma-separated: simulator, prometheus, scrape"
    )
    interval_s: float = Field(default=15.0, gt=0, description="query and scrape interval")
    cluster: str = Field(default="default", description="cluster name in workload identities")
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    backfill_s: float = Field(
        default=3600.0, ge=0, description="history read on a first start, seconds"
    )
    max_sample_age_s: float = Field(
        default=7 * 86_400.0, gt=0, description="older samples are rejected as stale"
    )
    scrape_targets: str = Field(default="", description="comma-separated host:port or URLs")
    mapping_families: str = "dcgm,dcgm-process,hami,hami-legacy,vllm,sglang,tgi"
    extra_mappings_json: str | None = Field(
        default=None, description="more MetricMapping rows as a JSON list"
    )
    owners: str = Field(
        default="pod-name",
        description="how pods map to workloads: pod-name (conventions) or kubernetes (watches)",
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file for owners=kubernetes; in-cluster if unset"
    )
    default_device_memory_gib: float | None = Field(
        default=None, gt=0, description="device memory when no metric or allocation says"
    )
    hami_nodes: bool = Field(
        default=False,
        description="owners=kubernetes: also watch nodes for HAMi's device memory "
        "(annotation hami.io/node-nvidia-register; needs list/watch on nodes)",
    )
    sim: SimulatorSettings = Field(default_factory=SimulatorSettings)
    kai: KaiSettings = Field(
        default_factory=KaiSettings,
        description="where KAI's binder puts its GPU reservation pods: "
        "FRACPILOT_KAI_RESERVATION_NAMESPACE and FRACPILOT_KAI_RESERVATION_APP_LABEL, the "
        "actuator's variables (the queue ones are the actuator's only)",
    )
    restarts: RestartSettings = Field(default_factory=RestartSettings)
    # batch by default: the decision service and the CLI read both formats; sample is the
    # previous version's format, for a rolling upgrade of a fleet with older decision replicas.
    usage_wire: Literal["batch", "sample"] = Field(
        default="batch",
        description="sample: one message per sample; batch: a partition's samples of one "
        "instant in one message (the decision service reads both: upgrade it first)",
    )
    publish_window: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="usage batches published and not acknowledged yet, at most; a full "
        "window holds the reading back",
    )
    usage_view: bool = Field(
        default=True,
        description="also publish each sample alone on fracpilot.usage.v1.view.<ns>.<workload> "
        "(core NATS, not stored) for integrations",
    )
    workload_metrics_limit: int = Field(
        default=500,
        ge=0,
        description="workloads with their own series in the per-workload metrics; the rest "
        'are counted under workload="_other"',
    )
    workload_metrics_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="a workload not seen for this long has its per-workload series removed",
    )

    ingest: ShardSettings = Field(default_factory=ShardSettings)

    @model_validator(mode="after")
    def _shards_need_prometheus_alone(self) -> IngestSettings:
        # Only the prometheus source reads instants every replica can read again alike.
        if self.ingest.sharded and self.source_list != ["prometheus"]:
            raise ValueError("FRACPILOT_INGEST_SHARDS > 1 needs FRACPILOT_SOURCES=prometheus")
        return self

    @property
    def source_list(self) -> list[str]:
        return [s.strip() for s in self.sources.split(",") if s.strip()]


def mapping_table(settings: IngestSettings) -> MappingTable:
    extra: tuple[MetricMapping, ...] = ()
    if settings.extra_mappings_json:
        extra = tuple(TypeAdapter(list[MetricMapping]).validate_json(settings.extra_mappings_json))
    families = tuple(f.strip() for f in settings.mapping_families.split(",") if f.strip())
    return MappingTable.of(families, extra)
