"""The policy's wire models: how the decision engine sizes a workload (:class:`Policy`, its
scope, grid, compute sizing and memory headroom), the answer to a policy request, and the
policy's modes that every decision carries on (:class:`Mode`, :class:`EnforcementMode`,
:class:`MemoryIsolation`).

They change when a sizing knob does; the messages built on them stay in
:mod:`fracpilot_libs.contracts`, which re-exports them. The FractionPolicy CRDs are generated
from :class:`Policy` (``scripts/gen_policy_crds.py``).
"""

from __future__ import annotations

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

from fracpilot_libs.contracts_base import SCHEMA_VERSION, Fraction, Share, WireModel, must_be_finite


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
    "and memory_min_headroom) or learned per workload (experimental; the default under "
    "isolation enforced; docs/sizing.md)"
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
        "upsize for memory (never withheld, but counted). None: no budget (under isolation "
        "enforced: 4; docs/sizing.md)",
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
        "is sized on its own, with a learned headroom and 4 resizes a day where the policy "
        "keeps the defaults (docs/sizing.md)",
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
