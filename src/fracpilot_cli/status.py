"""``fracpilot status``'s pure core: one row per workload from what NATS holds about it.

The facts come from the allocations bucket (the fraction held, the GPU memory behind it), the
decision engine's checkpointed state (its compute percentile and memory peak, and through
:func:`fracpilot_libs.sizing.outlook.describe` its target and what it is about to do), the latest
usage sample (the GPU model that prices the row, the engine's clock) and the latest actuation
result. :func:`build_status_rows` joins them by workload key and orders the rows by
:func:`risk_order`. No I/O here: :mod:`fracpilot_cli.operator_data` reads NATS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from functools import cache
from typing import Any, Generic, TypeVar

from fracpilot_cli.mig_view import status_profile
from fracpilot_libs.analysis.accounting import EPS, overruns
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    ConsolidationMove,
    ConsolidationReport,
    MoveState,
    Outcome,
    PlannedMove,
    Policy,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.pricing import GpuPrices, monthly
from fracpilot_libs.sizing.outlook import Outlook, describe
from fracpilot_libs.sizing.state import WorkloadState

T = TypeVar("T")
NEAR = 0.9  # usage at 90% of the fraction or more is "near" it


@dataclass(frozen=True, slots=True)
class Recorded(Generic[T]):
    """A message as a stream holds it: the value, when the server stored it, its sequence."""

    value: T
    received_at: datetime
    sequence: int


class Risk(IntEnum):
    """How urgently a workload needs a look; lower sorts first (see :func:`risk_order`)."""

    MEMORY_OVER = 0  # memory peak above the fraction: out-of-memory errors
    COMPUTE_OVER = 1  # compute percentile above the fraction: contention
    NEAR = 2  # either at NEAR of the fraction or more
    UPSIZING = 3  # the engine wants more (confirming, or asked and not applied yet)
    FAILED = 4  # the last action failed
    NONE = 5

    @property
    def label(self) -> str:
        return _RISK_LABELS[self]


_RISK_LABELS = {
    Risk.MEMORY_OVER: "memory over",
    Risk.COMPUTE_OVER: "compute over",
    Risk.NEAR: "near",
    Risk.UPSIZING: "upsizing",
    Risk.FAILED: "last action failed",
    Risk.NONE: "",
}

RISK_HELP = (
    "Rows are sorted by risk: memory peak above the fraction first, then compute percentile "
    f"above it, then either at {NEAR:.0%} of it or more, then workloads the engine is "
    "upsizing, then those whose last action failed, then the rest; within each, the higher "
    "usage share first, then by name."
)


def risk_of(
    memory_of_fraction: float | None,
    compute_of_fraction: float | None,
    state: str,
    last_outcome: Outcome | None,
) -> Risk:
    """The risk class of a workload from its usage as shares of its fraction and its state."""
    memory = memory_of_fraction or 0.0
    compute = compute_of_fraction or 0.0
    if overruns(memory, 1.0):  # shares of the fraction: above 1 is above it
        return Risk.MEMORY_OVER
    if overruns(compute, 1.0):
        return Risk.COMPUTE_OVER
    if max(memory, compute) >= NEAR - EPS:
        return Risk.NEAR
    if state == Outlook.UPSIZING.value:
        return Risk.UPSIZING
    if last_outcome is Outcome.FAILED:
        return Risk.FAILED
    return Risk.NONE


@dataclass(frozen=True, slots=True)
class StatusRow:
    """One workload as ``fracpilot status`` shows it. Shares are of one whole GPU unless
    named ``*_of_fraction``; times are UTC."""

    cluster: str
    namespace: str
    workload: str
    kind: str
    fraction: float | None  # held now (allocations bucket, else the latest sample)
    gpu_memory_bytes: int | None  # the fraction of the device's memory
    device_memory_bytes: int | None
    node: str
    gpu: str
    gpu_model: str
    compute_percentile: float | None  # the policy's percentile (95); None: a sample's value
    compute_p: float | None  # that percentile of compute, share of a GPU
    memory_peak: float | None  # memory peak over the policy's window, share of the device
    compute_of_fraction: float | None
    memory_of_fraction: float | None
    usage_basis: str  # "engine" (its history) or "sample" (the latest sample only)
    target: float | None  # what the engine sizes it to now
    state: str  # an engine Outlook value, or "unknown" without engine state
    wait_s: float | None  # waiting to downsize: engine seconds left
    held_by: str
    requested: float | None  # asked for and not applied yet
    last_plan: str
    last_outcome: str
    last_fraction_before: float | None
    last_fraction_after: float | None
    last_action_at: datetime | None
    last_error: str | None
    usd_per_gpu_hour: float
    saved_usd_month: float | None  # (1 - fraction) x hourly price x 730
    # (fraction - target) x hourly price x 730: what applying the recommendation would save
    # (negative: an upsize costs); shown before anything is applied, as in recommend mode
    would_save_usd_month: float | None
    risk: Risk
    samples: int
    last_sample_at: datetime | None
    policy_scope: str
    policy_revision: int
    mig_profile: str = "-"  # the smallest MIG profile for the need (fracpilot_cli.mig_view)
    # The container's memory limit (HAMi-core), share of its GPU; None: not enforced. It
    # lags when an in-place change moved KAI's accounting (``fraction``) and not the limit.
    enforced_fraction: float | None = None
    enforcement_lags: bool = False

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.workload}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, times as RFC 3339, the risk as its label."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, Risk):
                value = value.label
            elif isinstance(value, float):
                value = _round(value)
            out[name] = value
        return out


def _round(value: float) -> float:
    return round(value, 6)


def risk_order(row: StatusRow) -> tuple[int, float, str, str, str]:
    """The sort key of :data:`RISK_HELP`."""
    pressure = max(row.memory_of_fraction or 0.0, row.compute_of_fraction or 0.0)
    return (int(row.risk), -pressure, row.namespace, row.workload, row.cluster)


@dataclass
class FleetSnapshot:
    """What NATS holds about the fleet, decoded, each keyed by ``subjects.kv_key(workload)``."""

    allocations: dict[str, Allocation] = field(default_factory=dict)
    states: dict[str, WorkloadState] = field(default_factory=dict)
    samples: dict[str, UsageSample] = field(default_factory=dict)  # the latest per workload
    results: dict[str, ActuationResult] = field(default_factory=dict)  # the latest
    problems: list[str] = field(default_factory=list)  # entries that did not decode
    # consolidation: each cluster's latest report, and the moves stored since midnight (UTC)
    consolidation_reports: list[ConsolidationReport] = field(default_factory=list)
    consolidation_moves: list[ConsolidationMove] = field(default_factory=list)

    def workload_keys(self) -> set[str]:
        return set(self.allocations) | set(self.states) | set(self.samples) | set(self.results)


def workload_from_key(key: str) -> WorkloadRef | None:
    """The workload a KV key names (``cluster/namespace/kind/name``), None if it names none."""
    parts = subjects.kv_key_parts(key)
    if parts is None:
        return None
    try:
        return WorkloadRef(
            cluster=parts[0], namespace=parts[1], owner_kind=parts[2], owner_name=parts[3]
        )
    except ValueError:
        return None


def namespace_of_key(key: str) -> str:
    parts = key.split("/")
    return parts[1] if len(parts) == 4 else ""


PolicyFor = Callable[[WorkloadRef], Policy]


def build_status_rows(
    snapshot: FleetSnapshot,
    policy_for: PolicyFor,
    prices: GpuPrices,
    now: datetime,
    namespace: str | None = None,
) -> list[StatusRow]:
    """One row per workload known to any source, in :func:`risk_order`.

    ``now`` (wall clock) is the engine's time only for a workload without a recent sample;
    otherwise the engine's clock is its latest sample's timestamp, as in :func:`decide`."""
    rows = []
    hourly = cache(prices.hourly)  # one price lookup per GPU model, not per row
    for key in snapshot.workload_keys():
        row = status_row(
            key,
            snapshot.allocations.get(key),
            snapshot.states.get(key),
            snapshot.samples.get(key),
            snapshot.results.get(key),
            policy_for,
            hourly,
            now,
        )
        if row is not None and (namespace is None or row.namespace == namespace):
            rows.append(row)
    rows.sort(key=risk_order)
    return rows


def _workload(key: str, *sources: Allocation | UsageSample | ActuationResult | None) -> WorkloadRef:
    for source in sources:
        if source is not None:
            return source.workload
    ref = workload_from_key(key)
    if ref is None:
        raise ValueError(f"no workload for key {key!r}")
    return ref


def status_row(
    key: str,
    allocation: Allocation | None,
    state: WorkloadState | None,
    sample: UsageSample | None,
    result: ActuationResult | None,
    policy_for: PolicyFor,
    hourly_price: Callable[[str], float],
    now: datetime,
) -> StatusRow | None:
    """One workload's row from what each source knows (any may be missing);
    ``hourly_price`` gives USD per GPU-hour of a GPU model ("" when unknown)."""
    try:
        wl = _workload(key, allocation, sample, result)
    except ValueError:
        return None
    policy = policy_for(wl)
    fraction: float | None = None
    device: int | None = None
    if allocation is not None:
        fraction, device = allocation.fraction, allocation.device_memory_bytes
    elif sample is not None:
        fraction, device = sample.allocated_fraction, sample.memory_total_bytes
    if fraction is None and state is not None:
        fraction = state.current_fraction
    if device is None and sample is not None:
        device = sample.memory_total_bytes

    compute_p: float | None = None
    memory_peak: float | None = None
    target: float | None = None
    requested: float | None = None
    wait_s: float | None = None
    held_by, basis, state_name = "", "", "unknown"
    memory_need: float | None = None
    compute_need: float | None = None
    if state is not None and state.samples > 0:
        clock = sample.timestamp.timestamp() if sample is not None else now.timestamp()
        outlook = describe(state, policy, clock, fraction)
        compute_p, memory_peak = outlook.need.compute_percentile, outlook.need.memory_peak
        memory_need, compute_need = outlook.need.memory_need, outlook.need.compute_need
        target, requested = outlook.target, outlook.requested
        state_name, held_by, basis = outlook.outlook.value, outlook.held_by, "engine"
        if fraction is None:
            fraction = outlook.current
        if outlook.outlook is Outlook.WAITING_TO_DOWNSIZE:
            wait_s = outlook.wait_s
    elif state is not None:
        state_name = Outlook.NO_HISTORY.value
    if basis == "" and sample is not None:
        compute_p, memory_peak, basis = sample.compute, sample.memory_share, "sample"

    def share(value: float | None) -> float | None:
        if value is None or not fraction:
            return None
        return value / fraction

    compute_of, memory_of = share(compute_p), share(memory_peak)
    gpu_model = sample.gpu_model if sample is not None else ""
    hourly = hourly_price(gpu_model)
    saved = monthly((1.0 - fraction) * hourly) if fraction is not None else None
    would_save = (
        monthly((fraction - target) * hourly)
        if fraction is not None and target is not None
        else None
    )
    outcome = result.outcome if result is not None else None
    enforced = allocation.enforced_fraction if allocation is not None else None
    return StatusRow(
        cluster=wl.cluster,
        namespace=wl.namespace,
        workload=wl.owner_name,
        kind=wl.owner_kind,
        fraction=fraction,
        gpu_memory_bytes=int(fraction * device) if fraction is not None and device else None,
        device_memory_bytes=device,
        node=allocation.node if allocation is not None else (sample.node if sample else ""),
        gpu=allocation.gpu_uuid if allocation is not None else (sample.gpu_uuid if sample else ""),
        gpu_model=gpu_model,
        compute_percentile=policy.compute_percentile if basis == "engine" else None,
        compute_p=compute_p,
        memory_peak=memory_peak,
        compute_of_fraction=compute_of,
        memory_of_fraction=memory_of,
        usage_basis=basis,
        target=target,
        state=state_name,
        wait_s=wait_s,
        held_by=held_by,
        requested=requested,
        last_plan=result.plan.value if result is not None else "",
        last_outcome=outcome.value if outcome is not None else "",
        last_fraction_before=result.fraction_before if result is not None else None,
        last_fraction_after=result.fraction_after if result is not None else None,
        last_action_at=result.finished_at if result is not None else None,
        last_error=result.error if result is not None else None,
        usd_per_gpu_hour=hourly,
        saved_usd_month=saved,
        would_save_usd_month=would_save,
        risk=risk_of(memory_of, compute_of, state_name, outcome),
        samples=state.samples if state is not None else 0,
        last_sample_at=sample.timestamp if sample is not None else None,
        policy_scope=policy.scope.key,
        policy_revision=policy.revision,
        mig_profile=status_profile(gpu_model, memory_need, compute_need, device),
        enforced_fraction=enforced,
        enforcement_lags=lags(fraction, enforced),
    )


def lags(accounted: float | None, enforced: float | None) -> bool:
    """The enforced limit differs from the accounting (an in-place change, not restarted yet)."""
    return accounted is not None and enforced is not None and abs(accounted - enforced) > EPS


def totals(rows: Iterable[StatusRow]) -> Mapping[str, float]:
    """The footer: workloads, GPUs held, money saved per month, and what applying every
    recommendation would save on top."""
    n, gpus, saved, would_save = 0, 0.0, 0.0, 0.0
    for row in rows:
        n += 1
        gpus += row.fraction or 0.0
        saved += row.saved_usd_month or 0.0
        would_save += row.would_save_usd_month or 0.0
    return {
        "workloads": n,
        "gpus_held": gpus,
        "saved_usd_month": saved,
        "would_save_usd_month": would_save,
    }


# --- consolidation ---------------------------------------------------------------------------


def start_of_day(now: datetime) -> datetime:
    """Midnight UTC of ``now``'s day: "today" in the consolidation line."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class MoveTally:
    """Consolidation's moves and what they freed, summed over some messages."""

    started: int = 0
    verified: int = 0
    failed: int = 0
    abandoned: int = 0  # nodes whose plan was given up
    freed_nodes: int = 0
    freed_gpus: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def tally_moves(moves: Iterable[ConsolidationMove]) -> MoveTally:
    counts = dict.fromkeys(MoveState, 0)
    gpus = 0
    for move in moves:
        counts[move.state] += 1
        if move.state is MoveState.FREED:
            gpus += move.freed_gpus
    return MoveTally(
        started=counts[MoveState.STARTED],
        verified=counts[MoveState.VERIFIED],
        failed=counts[MoveState.FAILED],
        abandoned=counts[MoveState.ABANDONED],
        freed_nodes=counts[MoveState.FREED],
        freed_gpus=gpus,
    )


@dataclass(frozen=True, slots=True)
class ConsolidationStatus:
    """What ``status`` shows of consolidation: the latest plan of each cluster (summed) and
    what auto mode freed today."""

    modes: tuple[str, ...]  # "recommend", "auto" (each cluster's, sorted, once each)
    would_free_gpus: int
    would_free_nodes: int
    move_count: int
    moves: tuple[PlannedMove, ...]  # the plans' moves (each report keeps its first ones)
    refused_count: int
    reported_at: datetime | None
    today: MoveTally

    @property
    def auto(self) -> bool:
        return "auto" in self.modes

    def as_dict(self) -> dict[str, Any]:
        return {
            "modes": list(self.modes),
            "would_free_gpus": self.would_free_gpus,
            "would_free_nodes": self.would_free_nodes,
            "move_count": self.move_count,
            "moves": [m.model_dump(mode="json") for m in self.moves],
            "refused_count": self.refused_count,
            "reported_at": self.reported_at.isoformat() if self.reported_at else None,
            "today": self.today.as_dict(),
        }


def consolidation_status(
    reports: Iterable[ConsolidationReport], moves: Iterable[ConsolidationMove], now: datetime
) -> ConsolidationStatus | None:
    """From each cluster's reports (the latest counts) and the moves; None when no actuator
    reported (consolidation off, or an older actuator)."""
    latest: dict[str, ConsolidationReport] = {}
    for report in reports:
        seen = latest.get(report.cluster)
        if seen is None or report.reported_at >= seen.reported_at:
            latest[report.cluster] = report
    midnight = start_of_day(now)
    today = tally_moves(m for m in moves if m.at >= midnight)
    if not latest:
        return None
    plans = [latest[c] for c in sorted(latest)]
    return ConsolidationStatus(
        modes=tuple(sorted({r.mode.value for r in plans})),
        would_free_gpus=sum(r.would_free_gpus for r in plans),
        would_free_nodes=sum(r.would_free_nodes for r in plans),
        move_count=sum(r.move_count for r in plans),
        moves=tuple(m for r in plans for m in r.moves),
        refused_count=sum(r.refused_count for r in plans),
        reported_at=max(r.reported_at for r in plans),
        today=today,
    )
