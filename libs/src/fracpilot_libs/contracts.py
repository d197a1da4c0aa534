"""Wire contracts: the pydantic models every fracpilot message is made of.

Each model is frozen, forbids unknown fields and carries a ``schema_version`` so that a
consumer can refuse a payload it does not understand instead of guessing. JSON on the wire.
The subjects these models travel on live in :mod:`fracpilot_libs.nats.subjects`. The base
types (:mod:`fracpilot_libs.contracts_base`), the usage batch's header
(:mod:`fracpilot_libs.contracts_usage_batch`) and consolidation's messages
(:mod:`fracpilot_libs.contracts_consolidation`) live in modules of their own, re-exported here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

# Re-exported (``X as X``): importers keep importing them from here.
from fracpilot_libs.contracts_base import SCHEMA_VERSION as SCHEMA_VERSION
from fracpilot_libs.contracts_base import Bytes as Bytes
from fracpilot_libs.contracts_base import FiniteFloat as FiniteFloat
from fracpilot_libs.contracts_base import Fraction as Fraction
from fracpilot_libs.contracts_base import Share as Share
from fracpilot_libs.contracts_base import UtcDatetime as UtcDatetime
from fracpilot_libs.contracts_base import WireModel as WireModel
from fracpilot_libs.contracts_base import WorkloadRef as WorkloadRef
from fracpilot_libs.contracts_base import must_be_finite
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


class Mode(StrEnum):
    RECOMMEND = "recommend"  # decisions are published, the actuator changes nothing
    AUTO = "auto"


class EnforcementMode(StrEnum):
    """How a container's memory limit (fixed at its start) follows an in-place change."""

    RECREATE_WITHIN_BUDGET = "recreate_within_budget"  # evict, if the disruption budget allows
    NEXT_RESTART = "next_restart"  # at the pod's next natural restart


class MemoryIsolation(StrEnum):
    """Whether a pod's GPU memory is held to its own share (docs/sizing.md)."""

    AUTO = "auto"  # as the actuator detects it, per pod (the default)
    SHARED = "shared"  # not held (KAI without HAMi-core): the card is the limit, sized as one
    ENFORCED = "enforced"  # held (HAMi, KAI with HAMi-core): each pod sized on its own


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


class PolicyLevel(StrEnum):
    CLUSTER = "cluster"
    NAMESPACE = "namespace"
    WORKLOAD = "workload"


class PolicyScope(WireModel):
    level: PolicyLevel = PolicyLevel.CLUSTER
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    workload: str | None = Field(default=None, min_length=1, max_length=253)
    kind: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]+$",
        max_length=63,
        description="workload level: only the workload of this owner kind (WorkloadRef."
        "owner_kind, e.g. StatefulSet); None: every kind with that name",
    )

    @model_validator(mode="after")
    def _names_match_level(self) -> PolicyScope:
        need_ns = self.level in (PolicyLevel.NAMESPACE, PolicyLevel.WORKLOAD)
        need_wl = self.level is PolicyLevel.WORKLOAD
        if need_ns != (self.namespace is not None) or need_wl != (self.workload is not None):
            raise ValueError(
                f"scope level {self.level.value} needs "
                f"namespace={'yes' if need_ns else 'no'}, workload={'yes' if need_wl else 'no'}"
            )
        if self.kind is not None and not need_wl:
            raise ValueError(f"scope level {self.level.value} takes no kind (workload only)")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_kind(self, handler: SerializerFunctionWrapHandler) -> object:
        # A scope of any kind is written as before the kind existed: services of the previous
        # version (which refuse unknown fields) still read it during a rolling upgrade.
        data = handler(self)
        if isinstance(data, dict) and data.get("kind") is None:
            data.pop("kind", None)
        return data

    @property
    def key(self) -> str:
        """KV key of the scope (KV keys allow only ``[-/_=.a-zA-Z0-9]``): a kind goes before
        the name as kubectl writes it (``workload.team-a.StatefulSet/x``); a Kubernetes name
        has no ``/``, so no name of any kind reads the same."""
        name = self.workload or ""
        if self.kind is not None:
            name = f"{self.kind}/{name}"
        parts = [self.level.value, self.namespace or "", name]
        return ".".join(p for p in parts if p)


class GridKind(StrEnum):
    """Which fractions the engine sizes to (:mod:`fracpilot_libs.sizing.grids` quantizes)."""

    BACKEND = "backend"  # what the GPU-sharing backends represent exactly: hundredths
    STEPS = "steps"  # multiples of 1/grid_steps (the grid of policies written before v2)
    LEVELS = "levels"  # the fractions in grid_levels only (MIG profiles' shares of a card)


class ComputeSizing(StrEnum):
    """How the engine sizes compute (memory is always sized by its peak: an overrun is OOM)."""

    PERCENTILE = "percentile"  # a high percentile of utilization over a target utilization
    SOFT = "soft"  # what sharing costs: compute work that would wait, within a budget


BACKEND_GRID_STEPS = 100  # KAI's GPU_PORTION "%.2f" and HAMi's whole percents: hundredths


HEADROOM_DOC = (
    "the headroom above a workload's memory peak: mode uniform (the default: memory_margin "
    "and memory_min_headroom) or learned per workload (experimental; docs/sizing.md)"
)


class MemoryHeadroomMode(StrEnum):
    """How the engine chooses the headroom above a workload's memory peak."""

    UNIFORM = "uniform"  # one rule for all: max(memory_margin x peak, memory_min_headroom)
    LEARNED = "learned"  # per workload, from its own jumps above its peak (experimental)


class MemoryHeadroom(BaseModel):
    """The headroom above a workload's memory peak (``Policy.memory_headroom``)."""

    # The settings only: the rule is in fracpilot_libs.sizing.headroom. Field names are single
    # words, so the CRD spec spells them as the model does. The floor's and the cap's ranges do
    # not overlap: the floor is never above the cap.

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: MemoryHeadroomMode = Field(
        default=MemoryHeadroomMode.UNIFORM,
        description="uniform: max(memory_margin x peak, memory_min_headroom) for every "
        "workload; learned: per workload, factor x its largest jump above its own peak over "
        "memory_window_s so far, within [floor, cap], raised at once by an overrun",
    )
    factor: Annotated[float, Field(ge=1.0, le=8.0), AfterValidator(must_be_finite)] = Field(
        default=1.5, description="learned: safety factor on the largest jump seen (1.5)"
    )
    floor: Annotated[float, Field(gt=0.0, le=0.2), AfterValidator(must_be_finite)] = Field(
        default=0.03, description="learned: least headroom, share of the device (0.03)"
    )
    cap: Annotated[float, Field(ge=0.2, le=1.0), AfterValidator(must_be_finite)] = Field(
        default=0.25, description="learned: most headroom, share of the device (0.25)"
    )
    warmup: Annotated[float, Field(ge=0.0), AfterValidator(must_be_finite)] = Field(
        default=2 * 3600.0,
        description="learned: seconds of history before the learned headroom replaces the "
        "uniform one (7200)",
    )

    def __str__(self) -> str:  # the CRD's "(default: ...)" and explanations
        return self.model_dump_json()


class Policy(WireModel):
    """How the decision engine sizes a workload. Every default is documented here (and in
    docs/sizing.md).

    Sizing: memory need = the memory peak over ``memory_window_s`` plus the larger of
    ``memory_margin`` (relative) and ``memory_min_headroom`` (share of the device). Compute
    need, by ``compute_sizing``: ``percentile``, the ``compute_percentile`` of a decaying
    compute histogram (half-life ``compute_half_life_s``) divided by ``target_utilization``;
    ``soft``, the smallest fraction above which at most ``compute_delay_budget`` of the compute
    work lies (the work that waits when neighbours on the GPU use their shares). The fraction
    is the larger need rounded up to the ``grid`` and clamped to ``[min_fraction,
    max_fraction]``.
    Hysteresis: upsize once the need has exceeded the fraction for
    ``memory_upsize_confirmations`` (memory) or ``compute_upsize_confirmations`` (compute)
    consecutive samples; downsize only by ``downsize_min_change`` or more (and a grid step),
    after the need stayed that much lower for ``downsize_hold_s``, with at least
    ``min_history_s`` of history, not within ``cooldown_s`` of the last change and not while
    the application's queue is non-empty; an upsize goes half ``downsize_min_change`` above
    the need. While requests wait, a sample counts as compute above the fraction held. An OOM
    or contention signal bumps the fraction by
    ``signal_multiplier`` (at least ``downsize_min_change``) and holds it for
    ``signal_hold_s``; a queue that grew over ``queue_growth_samples`` samples bumps it by
    ``downsize_min_change`` whatever the utilization.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    scope: PolicyScope = PolicyScope()
    revision: Annotated[int, Field(ge=0)] = Field(
        default=0, description="set by the policy store on every change"
    )
    mode: Mode = Field(
        default=Mode.AUTO, description="recommend: publish decisions only; auto: also apply them"
    )
    grid: GridKind = Field(
        default=GridKind.BACKEND,
        description="which fractions the engine sizes to: backend (hundredths, which KAI's "
        "gpu-fraction and HAMi's whole percents both represent exactly), steps (multiples of "
        "1/grid_steps) or levels (grid_levels only: MIG profiles). Left out with grid_steps "
        "given: steps, as policies written before the grid existed meant",
    )
    grid_steps: Annotated[int, Field(ge=1, le=100)] = Field(
        default=8, description="grid steps: fractions are multiples of 1/grid_steps"
    )
    grid_levels: tuple[Fraction, ...] = Field(
        default=(),
        max_length=64,
        description="grid levels: the fractions allowed, ascending (e.g. the MIG profiles' "
        "shares of the card)",
    )
    min_fraction: Fraction = Field(default=0.1, description="never size below this (on the grid)")
    max_fraction: Fraction = Field(default=1.0, description="never size above this (on the grid)")
    compute_sizing: ComputeSizing = Field(
        default=ComputeSizing.SOFT,
        description="percentile: compute sized by compute_percentile / target_utilization; "
        "soft: by the work that would wait (compute_delay_budget), with app signals",
    )
    compute_percentile: Annotated[float, Field(gt=0.0, le=100.0)] = Field(
        default=95.0, description="percentile of the compute histogram that sizes compute"
    )
    target_utilization: Annotated[float, Field(gt=0.05, le=1.0)] = Field(
        default=0.85, description="compute percentile / fraction the sizing aims at (headroom)"
    )
    compute_delay_budget: Annotated[float, Field(gt=0.0, le=0.5)] = Field(
        default=0.015,
        description="soft: share of the compute work that may lie above the fraction (and "
        "wait when the GPU's other shares are busy)",
    )
    compute_half_life_s: Annotated[float, Field(gt=0)] = Field(
        default=6 * 3600.0, description="half-life of a compute sample's weight, seconds"
    )
    compute_upsize_confirmations: Annotated[int, Field(ge=1, le=20)] = Field(
        default=2,
        description="consecutive samples of compute above the fraction before an "
        "upsize: shorter bursts are tolerated",
    )
    memory_window_s: Annotated[float, Field(gt=0)] = Field(
        default=24 * 3600.0, description="window of the memory peak, seconds"
    )
    memory_margin: Annotated[float, Field(ge=0.0, le=4.0)] = Field(
        default=0.15, description="relative margin on the memory peak (0.15 = 15%)"
    )
    memory_min_headroom: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        default=0.1, description="least headroom above the memory peak, share of the device"
    )
    memory_upsize_confirmations: Annotated[int, Field(ge=1, le=20)] = Field(
        default=1, description="samples of memory above the fraction before an upsize"
    )
    memory_headroom: MemoryHeadroom = Field(default=MemoryHeadroom(), description=HEADROOM_DOC)
    downsize_min_change: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        default=0.1,
        description="a downsize lowers the fraction by at least this share of a GPU (and a "
        "grid step): resizes stay rare on fine grids",
    )
    downsize_hold_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0,
        description="the need must stay downsize_min_change lower this long to downsize",
    )
    cooldown_s: Annotated[float, Field(ge=0)] = Field(
        default=3 * 3600.0, description="no downsize within this long after any change"
    )
    min_history_s: Annotated[float, Field(ge=0)] = Field(
        default=1800.0, description="a shorter history blocks downsizing"
    )
    signal_multiplier: Annotated[float, Field(ge=1.0, le=8.0)] = Field(
        default=1.5, description="an OOM or contention signal multiplies the fraction by this"
    )
    signal_hold_s: Annotated[float, Field(ge=0)] = Field(
        default=6 * 3600.0, description="no downsize this long after an OOM or contention signal"
    )
    kv_cache_busy: Share = Field(
        default=0.9,
        description="downsizes wait while the application's KV cache (vLLM) is at least this full",
    )
    queue_growth_samples: Annotated[int, Field(ge=1, le=20)] = Field(
        default=3,
        description="consecutive samples of a growing application queue (vLLM waiting "
        "requests) before a compute upsize, whatever the utilization",
    )
    resize_budget_per_day: Annotated[float, Field(ge=0.0, le=1440.0)] | None = Field(
        default=None,
        description="most resizes per workload in any 24 h; a resize beyond it waits, except an "
        "upsize for memory (never withheld, but counted). None: no budget (docs/sizing.md)",
    )
    enforcement: EnforcementMode = Field(
        default=EnforcementMode.NEXT_RESTART,
        description="after an in-place downsize (KAI accounting only) the container keeps its "
        "memory limit: next_restart lets it lag until the pod restarts; recreate_within_budget "
        "evicts the pod when the disruption budget allows",
    )

    isolation: MemoryIsolation = Field(
        default=MemoryIsolation.AUTO,
        description="whether a pod's GPU memory is held to its share: auto detects it per pod "
        "(KAI without HAMi-core: shared; HAMi, KAI with HAMi-core: enforced); shared: the "
        "actuator divides each card among its KAI gpu-fraction tenants; enforced: each pod "
        "is sized on its own (docs/sizing.md)",
    )

    @model_validator(mode="before")
    @classmethod
    def _grid_of_older_policies(cls, data: object) -> object:
        # A policy written before ``grid`` existed meant 1/grid_steps: keep that meaning.
        if isinstance(data, dict) and "grid_steps" in data and "grid" not in data:
            return {**data, "grid": GridKind.STEPS.value}
        return data

    @model_validator(mode="after")
    def _bounds_valid(self) -> Policy:
        if self.min_fraction > self.max_fraction:
            raise ValueError(
                f"min_fraction {self.min_fraction} is above max_fraction {self.max_fraction}"
            )
        levels = self.grid_levels
        if self.grid is GridKind.LEVELS:
            if not levels:
                raise ValueError("grid levels needs grid_levels (the fractions allowed)")
            if any(b <= a for a, b in pairwise(levels)):
                raise ValueError(f"grid_levels {list(levels)} must be strictly ascending")
        for name in ("min_fraction", "max_fraction"):
            value = getattr(self, name)
            if self.grid is GridKind.LEVELS:
                if not any(abs(value - level) <= 1e-9 for level in levels):
                    raise ValueError(f"{name} {value} is not one of grid_levels {list(levels)}")
                continue
            steps = self.steps_per_gpu
            if abs(value * steps - round(value * steps)) > 1e-9:
                raise ValueError(f"{name} {value} is not on the grid of 1/{steps}")
        return self

    @property
    def steps_per_gpu(self) -> int:
        """The grid's steps per GPU (steps and backend grids; levels have none)."""
        return self.grid_steps if self.grid is GridKind.STEPS else BACKEND_GRID_STEPS

    @property
    def step(self) -> float:
        """The grid's finest step: 1/grid_steps, 0.01 on backend, the smallest gap of levels."""
        if self.grid is GridKind.LEVELS:
            levels = (0.0, *self.grid_levels)
            return min(b - a for a, b in pairwise(levels))
        return 1.0 / self.steps_per_gpu


class PolicyReply(WireModel):
    """The answer to a policy request: the effective policy, a list, or why it was refused."""

    ok: bool
    policy: Policy | None = None
    policies: list[Policy] = Field(default_factory=list)
    error: str | None = None


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
