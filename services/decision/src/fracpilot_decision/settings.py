"""The decision service's settings: flat ones, and groups whose environment names share a prefix.

A group ``checkpoint`` with a field ``interval_s`` reads ``FRACPILOT_CHECKPOINT_INTERVAL_S``
(the base settings' nested delimiter), so every environment name is what it was when they
were flat. Each group goes whole to the component that uses it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.sizing.policies import ClusterPolicySettings


class CheckpointSettings(BaseModel):
    """``FRACPILOT_CHECKPOINT_*``: when a partition's changed states are checkpointed."""

    interval_s: float = Field(
        default=60.0,
        gt=0,
        description="how often a busy partition's changed workload states are checkpointed "
        "(then its mark); longer than the sampling interval, a workload is "
        "written once for several samples. A crash replays at most this much",
    )
    when_idle_s: float = Field(
        default=30.0,
        ge=0,
        description="checkpoint a partition as soon as no sample came for this long (so a "
        "pipeline that stopped is checkpointed without waiting for the interval); longer than "
        "the sampling interval, or every partition is quiet between two scrapes and each "
        "state is written once a sample; 0: only on the interval",
    )


class HeapSettings(BaseModel):
    """``FRACPILOT_GC_*``: how the garbage collector is kept off the workload states."""

    freeze_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="move the objects that survived to Python's permanent generation this "
        "often, so that the collector's full passes do not scan the workload states (they "
        "paused deciding for up to 0.6 s at 100,000 workloads); 0: Python's own collector "
        "behaviour (see fracpilot_decision.heap)",
    )
    full_interval_s: float = Field(
        default=600.0,
        gt=0,
        description="with gc_freeze_interval_s, unfreeze and collect everything this often "
        "(cycles among frozen objects are freed then; one pause each time)",
    )


class PartitionLeaseSettings(BaseModel):
    """``FRACPILOT_PARTITION_*``: the leases through which replicas share the partitions."""

    lease_s: float = Field(
        default=10.0,
        ge=1.0,
        description="a replica's partitions move to the others this long after it dies "
        "(the TTL of the partition lease bucket); the same on every replica",
    )


class DecisionSettings(ServiceSettings, ClusterPolicySettings):
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    gc: HeapSettings = Field(default_factory=HeapSettings)
    partition: PartitionLeaseSettings = Field(default_factory=PartitionLeaseSettings)
    replica_id: str | None = Field(
        default=None, description="this replica's name in the partition leases; unique"
    )
    fetch_linger_s: float = Field(
        default=0.02,
        ge=0,
        description="when few samples are waiting, wait this long for more before deciding "
        "(bigger batches under load; adds at most this to the latency)",
    )
    max_unacked: int = Field(
        default=100_000,
        ge=100,
        description="samples a partition may decide between two checkpoints (what a crash "
        "replays at most; also the consumer's max ack pending); a "
        "checkpoint is written early at half of it",
    )
    workload_metrics_limit: int = Field(
        default=500,
        ge=0,
        description="workloads with their own recommendation series "
        "(fracpilot_workload_recommended_ratio); the rest have none",
    )
    workload_metrics_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="a workload not decided on for this long (gone, or its partition moved "
        "to another replica) has its recommendation series removed",
    )
