"""Wire contracts: the pydantic models every fracpilot message is made of.

Each model is frozen, forbids unknown fields and carries a ``schema_version`` so that a
consumer can refuse a payload it does not understand instead of guessing. JSON on the wire.
The subjects these models travel on live in :mod:`fracpilot_libs.nats.subjects`. The base
types (:mod:`fracpilot_libs.contracts_base`), the policy and its modes
(:mod:`fracpilot_libs.contracts_policy`), the usage batch's header
(:mod:`fracpilot_libs.contracts_usage_batch`) and consolidation's messages
(:mod:`fracpilot_libs.contracts_consolidation`) live in modules of their own, re-exported here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

# Re-exported (``X as X``): importers keep importing them from here.
from fracpilot_libs.contracts_base import SCHEMA_VERSION as SCHEMA_VERSION
from fracpilot_libs.contracts_base import Bytes as Bytes
from fracpilot_libs.contracts_base import FiniteFloat as FiniteFloat
from fracpilot_libs.contracts_base import Fraction as Fraction
from fracpilot_libs.contracts_base import Share as Share
from fracpilot_libs.contracts_base import UtcDatetime as UtcDatetime
from fracpilot_libs.contracts_base import WireModel as WireModel
from fracpilot_libs.contracts_base import WorkloadRef as WorkloadRef
from fracpilot_libs.contracts_consolidation import (
    CONSOLIDATION_MOVES_KEPT as CONSOLIDATION_MOVES_KEPT,
)
from fracpilot_libs.contracts_consolidation import (
    CONSOLIDATION_REFUSALS_KEPT as CONSOLIDATION_REFUSALS_KEPT,
)
from fracpilot_libs.contracts_consolidation import ConsolidationMode as ConsolidationMode
from fracpilot_libs.contracts_consolidation import ConsolidationMove as ConsolidationMove
from fracpilot_libs.contracts_consolidation import ConsolidationRefusal as ConsolidationRefusal
from fracpilot_libs.contracts_consolidation import ConsolidationReport as ConsolidationReport
from fracpilot_libs.contracts_consolidation import MoveState as MoveState
from fracpilot_libs.contracts_consolidation import PlannedMove as PlannedMove
from fracpilot_libs.contracts_policy import BACKEND_GRID_STEPS as BACKEND_GRID_STEPS
from fracpilot_libs.contracts_policy import HEADROOM_DOC as HEADROOM_DOC
from fracpilot_libs.contracts_policy import ComputeSizing as ComputeSizing
from fracpilot_libs.contracts_policy import EnforcementMode as EnforcementMode
from fracpilot_libs.contracts_policy import GridKind as GridKind
from fracpilot_libs.contracts_policy import MemoryHeadroom as MemoryHeadroom
from fracpilot_libs.contracts_policy import MemoryHeadroomMode as MemoryHeadroomMode
from fracpilot_libs.contracts_policy import MemoryIsolation as MemoryIsolation
from fracpilot_libs.contracts_policy import Mode as Mode
from fracpilot_libs.contracts_policy import Policy as Policy
from fracpilot_libs.contracts_policy import PolicyLevel as PolicyLevel
from fracpilot_libs.contracts_policy import PolicyReply as PolicyReply
from fracpilot_libs.contracts_policy import PolicyScope as PolicyScope
from fracpilot_libs.contracts_usage_batch import USAGE_BATCH_FORMAT as USAGE_BATCH_FORMAT
from fracpilot_libs.contracts_usage_batch import UsageBatchHeader as UsageBatchHeader

MIB = 1024 * 1024


class Attribution(StrEnum):
    EXACT = "exact"  # per-container or per-process numbers
    ESTIMATED = "estimated"  # device numbers split by allocated fraction


class AppSignals(WireModel):
    """Optional signals from the application or runtime (vLLM metrics, OOM events)."""

    kv_cache_usage: Share | None = None
    waiting_requests: Annotated[int, Field(ge=0)] | None = None
    oom_event: bool = False
    contention_event: bool = False
    # A server that preallocates its KV cache (vLLM, SGLang, TGI) and the pool's size in bytes
    # when its metrics say it: the engine then sizes memory from the KV cache actually used
    # (sizing/kv_memory.py). Both absent on older publishers.
    llm_server: Literal["vllm", "sglang", "tgi"] | None = None
    kv_pool_bytes: Bytes | None = Field(
        default=None, description="the server's KV-cache pool on this GPU, bytes, when known"
    )
    # The pool's size in tokens (vLLM num_gpu_blocks x block_size, SGLang max_total_num_tokens,
    # TGI max batch total tokens) and the longest sequence the server must hold at once (vLLM
    # max_model_len): the engine learns the pool's bytes and its minimum from them
    # (sizing/kv_memory.py). Absent on older publishers.
    kv_pool_tokens: Annotated[int, Field(gt=0)] | None = None
    kv_max_sequence_tokens: Annotated[int, Field(gt=0)] | None = None


class UsageSample(WireModel):
    """One observation of one workload's pod on one GPU."""

    schema_version: Literal[1] = SCHEMA_VERSION
    sample_id: str = Field(min_length=1, max_length=200)
    workload: WorkloadRef
    pod: str = Field(min_length=1, max_length=253)
    container: str = Field(default="main", min_length=1, max_length=63)
    node: str = Field(default="", max_length=253)
    gpu_uuid: str = Field(default="", max_length=128)
    gpu_model: str = Field(
        default="", max_length=128, description="the GPU's model name, when the source says"
    )
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
    QUEUE_GROWING = "queue_growing"  # the application's queue grew (vLLM waiting requests)
    UNDERUSED = "underused"
    POLICY_BOUNDS = "policy_bounds"


# The periods a peak profile may span: twice the engine's memory slots
# (fracpilot_libs.sizing.state.MEMORY_SLOTS; contracts import no sizing, a test ties them).
PROFILE_MAX_PERIODS = 48
PROFILE_PERIOD_S = (1.0, 7 * 86400.0)  # a period's length, seconds: the shortest, the longest


class PeakProfile(WireModel):
    """A workload's memory peak per period of its memory window, on the clock all workloads
    share: period ``k`` is ``[k * period_s, (k + 1) * period_s)`` unix seconds. With every
    tenant's, a card planner reserves the most the tenants held together in one period (their
    joint peak) rather than the sum of their peaks."""

    period_s: float = Field(
        ge=PROFILE_PERIOD_S[0],
        le=PROFILE_PERIOD_S[1],
        description="the period's length: the engine's memory slot",
    )
    first: int = Field(ge=0, le=2**40, description="the first period the profile covers")
    last: int = Field(
        ge=0,
        le=2**40,
        description="the last period it covers (included): a period from first to last "
        "without a peak held no sample, one outside them is unknown",
    )
    peaks: tuple[tuple[int, Share], ...] = Field(
        default=(),
        max_length=PROFILE_MAX_PERIODS,
        description="(period, the peak share of its samples), periods increasing",
    )

    @model_validator(mode="after")
    def _periods_in_order(self) -> PeakProfile:
        if not self.first <= self.last < self.first + PROFILE_MAX_PERIODS:
            raise ValueError(
                f"a profile covers 1 to {PROFILE_MAX_PERIODS} periods: {self.first}..{self.last}"
            )
        before = self.first - 1
        for period, _ in self.peaks:
            if not before < period <= self.last:
                raise ValueError(
                    f"peak periods increase within {self.first}..{self.last}: {period} "
                    f"after {before}"
                )
            before = period
        return self


class CardForecast(WireModel):
    """What the engine predicts of a workload, shares of a card: what a card planner
    (:mod:`fracpilot_libs.placement.card_budget`) needs to size a card's tenants together."""

    memory_peak: Share  # the memory peak over the policy's memory window
    memory_jump: Share  # how far above its trailing peak its memory has jumped (the largest)
    compute: Share  # the compute level that sizes it
    burst: Share = 0.0  # how far above that level its compute reaches
    # its memory peak per period of the window; None: unknown (a young workload, which has
    # not shown its peaks, or a decision service before profiles): its peak counts throughout
    profile: PeakProfile | None = None


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
    memory_need_mib: Annotated[int, Field(ge=0)] | None = None  # peak + headroom; None: unknown
    enforcement: EnforcementMode = EnforcementMode.NEXT_RESTART  # the policy's
    forecast: CardForecast | None = None  # what the engine predicts; None: unknown
    isolation: MemoryIsolation = MemoryIsolation.AUTO  # the policy's

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
    APPLIED = "applied"  # done and verified (the pod read back, the replacement bound)
    PENDING = "pending"  # started, not verified yet: a final result of the decision follows
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
    enforced_fraction: Fraction | None = None  # the container's memory limit; None: unenforced
    detail: str = Field(default="", max_length=4000)
    error: str | None = Field(default=None, max_length=4000)
    finished_at: UtcDatetime


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
    fraction: Fraction  # KAI's (or HAMi's) accounting
    enforced_fraction: Fraction | None = None  # the container's memory limit; None: unenforced
    device_memory_bytes: Annotated[int, Field(gt=0)]
    updated_at: UtcDatetime


class GpuSharing(StrEnum):
    """How a workload's pods hold their GPU share: the GPU-sharing scheduler (KAI or HAMi)."""

    KAI = "kai"  # annotation gpu-fraction (portion of one GPU) or gpu-memory (MiB)
    HAMI = "hami"  # limits nvidia.com/gpumem(-percentage) and nvidia.com/gpucores


class WorkloadTarget(WireModel):
    """The fraction a workload's next pods get (the targets KV bucket; the admission webhook
    writes it into every new pod of the workload, as the VPA admission controller does)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    workload: WorkloadRef
    fraction: Fraction
    memory_mib: Annotated[int, Field(ge=0)]
    backend: GpuSharing
    decision_id: str = Field(min_length=1, max_length=200)
    updated_at: UtcDatetime
