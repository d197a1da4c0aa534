"""Wire contracts: the pydantic models every fracpilot message is made of.

Each model is frozen, forbids unknown fields and carries a ``schema_version`` so that a
consumer can refuse a payload it does not understand instead of guessing. JSON on the wire.
The subjects these models travel on live in :mod:`fracpilot_libs.subjects`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

SCHEMA_VERSION: Literal[1] = 1
MIB = 1024 * 1024


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number (NaN and infinity are rejected)")
    return value


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a timezone (UTC)")
    return value.astimezone(UTC)


FiniteFloat = Annotated[float, AfterValidator(_finite)]
Share = Annotated[float, Field(ge=0.0, le=1.0), AfterValidator(_finite)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0), AfterValidator(_finite)]
UtcDatetime = Annotated[datetime, AfterValidator(_aware_utc)]
Bytes = Annotated[int, Field(ge=0)]


class WireModel(BaseModel):
    """Base of every message: immutable, strict about unknown fields, JSON on the wire."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class WorkloadRef(WireModel):
    """The owner a pod belongs to: decisions are per workload, not per pod."""

    cluster: str = Field(default="default", min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=63)
    owner_kind: str = Field(default="Deployment", min_length=1, max_length=63)
    owner_name: str = Field(min_length=1, max_length=253)

    @property
    def key(self) -> str:
        """Stable identity: ``cluster/namespace/kind/name``."""
        return f"{self.cluster}/{self.namespace}/{self.owner_kind}/{self.owner_name}"

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.owner_name}"


class Attribution(StrEnum):
    EXACT = "exact"  # per-container or per-process numbers
    ESTIMATED = "estimated"  # device numbers split by allocated fraction


class AppSignals(WireModel):
    """Optional signals from the application or runtime (vLLM metrics, OOM events)."""

    kv_cache_usage: Share | None = None
    waiting_requests: Annotated[int, Field(ge=0)] | None = None
    oom_event: bool = False
    contention_event: bool = False


class UsageSample(WireModel):
    """One observation of one workload's pod on one GPU."""

    schema_version: Literal[1] = SCHEMA_VERSION
    sample_id: str = Field(min_length=1, max_length=200)
    workload: WorkloadRef
    pod: str = Field(min_length=1, max_length=253)
    container: str = Field(default="main", min_length=1, max_length=63)
    node: str = Field(default="", max_length=253)
    gpu_uuid: str = Field(default="", max_length=128)
    timestamp: UtcDatetime
    compute: Share = Field(description="share of one whole GPU's compute in use, 0..1")
    memory_used_bytes: Bytes
    memory_total_bytes: Annotated[int, Field(gt=0)]
    allocated_fraction: Fraction | None = Field(
        default=None, description="the fraction the pod holds now, when the source knows it"
    )
    source: str = Field(min_length=1, max_length=63)
    attribution: Attribution = Attribution.EXACT
    signals: AppSignals | None = None

    @model_validator(mode="after")
    def _memory_within_device(self) -> UsageSample:
        if self.memory_used_bytes > self.memory_total_bytes:
            raise ValueError(
                f"memory_used_bytes {self.memory_used_bytes} exceeds device memory "
                f"{self.memory_total_bytes}"
            )
        return self

    @property
    def memory_share(self) -> float:
        return self.memory_used_bytes / self.memory_total_bytes


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"


class ReasonCode(StrEnum):
    COMPUTE_HIGH = "compute_high"
    MEMORY_HIGH = "memory_high"
    OOM_SIGNAL = "oom_signal"
    CONTENTION_SIGNAL = "contention_signal"
    UNDERUSED = "underused"


class Mode(StrEnum):
    RECOMMEND = "recommend"  # decisions are published, the actuator changes nothing
    AUTO = "auto"


class FractionDecision(WireModel):
    """The decision engine's verdict for one workload, with the numbers behind it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    decision_id: str = Field(min_length=1, max_length=200)
    workload: WorkloadRef
    decided_at: UtcDatetime
    pod: str = Field(default="", max_length=253)
    gpu_uuid: str = Field(default="", max_length=128)
    current_fraction: Fraction
    new_fraction: Fraction
    device_memory_bytes: Annotated[int, Field(gt=0)]
    current_memory_mib: Annotated[int, Field(ge=0)]
    new_memory_mib: Annotated[int, Field(ge=0)]
    direction: Direction
    reason: ReasonCode
    explanation: str = Field(min_length=1, max_length=4000)
    policy_revision: Annotated[int, Field(ge=0)]
    mode: Mode = Mode.AUTO
    trigger_sample_id: str = Field(default="", max_length=200)

    @model_validator(mode="after")
    def _direction_matches(self) -> FractionDecision:
        expected = Direction.UP if self.new_fraction > self.current_fraction else Direction.DOWN
        if self.new_fraction == self.current_fraction:
            raise ValueError("a decision must change the fraction")
        if self.direction is not expected:
            raise ValueError(
                f"direction {self.direction.value} contradicts "
                f"{self.current_fraction} -> {self.new_fraction}"
            )
        return self


class PlanKind(StrEnum):
    IN_PLACE = "in_place"
    RECREATE_ELSEWHERE = "recreate_elsewhere"
    SCALE_UP = "scale_up"
    NONE = "none"


class Outcome(StrEnum):
    APPLIED = "applied"
    DRY_RUN = "dry_run"
    SKIPPED = "skipped"
    FAILED = "failed"


class ActuationResult(WireModel):
    """What the actuator did with one decision, and why."""

    schema_version: Literal[1] = SCHEMA_VERSION
    decision_id: str = Field(min_length=1, max_length=200)
    workload: WorkloadRef
    plan: PlanKind
    outcome: Outcome
    fraction_before: Fraction | None = None
    fraction_after: Fraction | None = None
    node_before: str = ""
    node_after: str = ""
    gpu_before: str = ""
    gpu_after: str = ""
    detail: str = Field(default="", max_length=4000)
    error: str | None = Field(default=None, max_length=4000)
    finished_at: UtcDatetime


class PolicyLevel(StrEnum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"
    WORKLOAD = "workload"


class PolicyScope(WireModel):
    level: PolicyLevel = PolicyLevel.CLUSTER
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    workload: str | None = Field(default=None, min_length=1, max_length=253)

    @model_validator(mode="after")
    def _names_match_level(self) -> PolicyScope:
        need_ns = self.level in (PolicyLevel.NAMESPACE, PolicyLevel.WORKLOAD)
        need_wl = self.level is PolicyLevel.WORKLOAD
        if need_ns != (self.namespace is not None) or need_wl != (self.workload is not None):
            raise ValueError(
                f"scope level {self.level.value} needs "
                f"namespace={'yes' if need_ns else 'no'}, workload={'yes' if need_wl else 'no'}"
            )
        return self

    @property
    def key(self) -> str:
        """KV key of the scope (KV keys allow only ``[-/_=.a-zA-Z0-9]``)."""
        parts = [self.level.value, self.namespace or "", self.workload or ""]
        return ".".join(p for p in parts if p)


class Policy(WireModel):
    """How the decision engine sizes a workload. Every default is documented here."""

    schema_version: Literal[1] = SCHEMA_VERSION
    scope: PolicyScope = PolicyScope()
    revision: Annotated[int, Field(ge=0)] = 0
    mode: Mode = Mode.AUTO
    grid_steps: Annotated[int, Field(ge=1, le=100)] = Field(
        default=8, description="fractions are multiples of 1/grid_steps (default 1/8)"
    )
    min_fraction: Fraction = Field(default=0.125, description="never size below this")
    max_fraction: Fraction = Field(default=1.0, description="never size above this")
    compute_percentile: Annotated[float, Field(gt=0.0, le=100.0)] = Field(
        default=98.0, description="percentile of compute over the window that sizes compute"
    )
    target_utilization: Annotated[float, Field(gt=0.05, le=1.0)] = Field(
        default=0.75, description="compute percentile / fraction the sizing aims at (headroom)"
    )
    window_s: Annotated[float, Field(gt=0)] = Field(
        default=6 * 3600.0, description="history window for percentiles and peaks, seconds"
    )
    memory_margin: Annotated[float, Field(ge=0.0, le=4.0)] = Field(
        default=0.15, description="added on top of the memory peak (0.15 = 15%)"
    )
    downsize_hold_s: Annotated[float, Field(ge=0)] = Field(
        default=2 * 3600.0, description="need must stay a full step below this long to downsize"
    )
    cooldown_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0, description="no downsize within this long after any change"
    )
    min_history_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0, description="a shorter history blocks downsizing"
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Policy:
        if self.min_fraction > self.max_fraction:
            raise ValueError(
                f"min_fraction {self.min_fraction} is above max_fraction {self.max_fraction}"
            )
        return self


class DeadLetter(WireModel):
    """A message a service could not accept, kept with the reason and the raw payload."""

    schema_version: Literal[1] = SCHEMA_VERSION
    service: str
    subject: str
    reason: str = Field(max_length=8000)
    error_kind: Literal["decode", "validation", "processing", "max_deliveries"]
    raw_payload: str = Field(description="the payload as received, UTF-8 or repr for binary")
    headers: dict[str, str] = Field(default_factory=dict)
    received_at: UtcDatetime


def utcnow() -> datetime:
    return datetime.now(UTC)


class Allocation(WireModel):
    """Where a workload's pod runs and the fraction it holds (the allocations KV bucket)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    workload: WorkloadRef
    pod: str = Field(min_length=1, max_length=253)
    node: str = Field(min_length=1, max_length=253)
    gpu_uuid: str = Field(min_length=1, max_length=128)
    fraction: Fraction
    device_memory_bytes: Annotated[int, Field(gt=0)]
    updated_at: UtcDatetime
