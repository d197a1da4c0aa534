"""``fracpilot replay --pack``: the packed replays and their tables.

CLI glue only: :func:`fracpilot_libs.analysis.packing_replay.replay_packed` places the workloads
on cards with the actuator's planner and accounts card-hours, contention and collisions
(definitions in :mod:`fracpilot_libs.analysis.packing`); this module runs it once per sizer with
a progress bar, and renders the result beside the unpacked totals. ``--pack-bound`` adds what
no sizer or planner with hard per-pod memory can beat
(:mod:`fracpilot_libs.analysis.packing_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from fracpilot_libs.analysis.baselines import EngineSizer, Sizer
from fracpilot_libs.analysis.packing import PackedAccount
from fracpilot_libs.analysis.packing_bound import (
    PackBound,
    held_fractions,
    held_parts,
    pack_bound,
    two_part_bound,
)
from fracpilot_libs.analysis.packing_replay import PackedReport, replay_packed
from fracpilot_libs.analysis.replay import Progress as ReplayProgress
from fracpilot_libs.analysis.replay import replay
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.placement.card_budget import Isolation
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.state import WorkloadState


def run_packed(
    groups: dict[str, list[TracePoint]],
    sizers: list[Sizer],
    progress: Progress,
    gpus: int | None,
    consolidate: bool,
    prices: GpuPrices | None = None,
    isolation: Isolation | None = None,
    gpus_per_node: int = 1,
) -> list[PackedReport]:
    """Each sizer replayed packed on the same parsed trace, one progress bar each."""
    samples = sum(len(series) for series in groups.values())
    reports = []
    for sizer in sizers:
        task = progress.add_task(f"pack {sizer.name}", total=samples)
        reports.append(
            replay_packed(
                groups,
                sizer,
                gpus=gpus,
                progress=_advancer(progress, task),
                prices=prices,
                consolidate=consolidate,
                isolation=isolation,
                gpus_per_node=gpus_per_node,
            )
        )
    return reports


def _advancer(progress: Progress, task: TaskID) -> ReplayProgress:
    def advance(advance: int) -> None:
        progress.advance(task, advance)

    return advance


def _rows(p: PackedAccount) -> list[tuple[str, str]]:
    cards = f"{p.gpus:,} pinned" if p.gpus is not None else f"{p.peak_cards:,} at peak"
    rows = [
        ("cards", cards),
        ("card-hours", f"{p.card_hours:,.1f}"),
        ("card-hours as whole GPUs", f"{p.whole_card_hours:,.1f}"),
        ("card-hours saved", f"{p.card_hours_saved_pct:.1f}%"),
        (
            f"node-hours saved ({p.gpus_per_node} GPU{'s' if p.gpus_per_node > 1 else ''} a node)",
            f"{p.node_hours_saved_pct:.1f}%",
        ),
        ("card-hours freed as whole nodes", f"{p.freed_on_whole_nodes_pct:.1f}%"),
        ("compute contention", f"{p.contention_pct:.3f}% of compute work"),
        ("memory collisions", f"{p.memory_collision_samples:,} samples"),
        (
            "memory collisions per card-sample",
            f"{p.memory_collision_card_samples:,} ({p.memory_collision_pct:.4f}%)",
        ),
        ("memory overruns", f"{p.memory_overrun_samples:,} samples"),
        ("moves per workload-day", f"{p.moves_per_workload_day:.2f}"),
        ("in place per workload-day", f"{p.in_place_per_workload_day:.2f}"),
    ]
    if p.gpus is not None:
        rows += [
            ("decisions refused", f"{p.decisions_refused:,}"),
            ("workloads unplaced", f"{len(p.unplaced):,} ({p.unplaced_samples:,} samples)"),
        ]
    return rows


def packed_table(names: list[str], accounts: list[PackedAccount]) -> Table:
    """The packed figures, one column per sizer (fracpilot first)."""
    table = Table(title="packed on GPUs (cards of the trace's device memory)")
    table.add_column("")
    for i, name in enumerate(names):
        table.add_column(name if i == 0 else f"baseline {name}", justify="right")
    columns = [_rows(a) for a in accounts]
    for r, (label, _) in enumerate(columns[0]):
        table.add_row(label, *(col[r][1] for col in columns))
    return table


def contended_table(name: str, account: PackedAccount, top: int) -> Table | None:
    """The workloads whose compute was delayed most by their neighbours, or None if none."""
    worst = account.most_contended(top)
    if not worst:
        return None
    table = Table(
        title=f"most delayed by neighbours ({name})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    table.add_column("workload", no_wrap=True)
    table.add_column("delayed\nGPU-h", justify="right")
    table.add_column("of its\nwork", justify="right")
    for c in worst:
        table.add_row(c.workload, f"{c.delayed_gpu_hours:.3f}", f"{c.contention_pct:.2f}%")
    return table


def print_packed(out: Console, names: list[str], reports: list[PackedReport], top: int) -> None:
    out.print(packed_table(names, [r.packed for r in reports]))
    for name, report in zip(names, reports, strict=True):
        table = contended_table(name, report.packed, top)
        if table is not None:
            out.print(table)


@dataclass
class _PartsRecorder:
    """The engine sizer, keeping at each sample its held fraction as two parts
    (:func:`~fracpilot_libs.analysis.packing_bound.held_parts`)."""

    sizer: EngineSizer
    parts: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.sizer.name

    def initial(self, requested: float | None) -> float:
        return self.sizer.initial(requested)

    def start(self) -> WorkloadState:
        return self.sizer.start()

    def step(self, state: WorkloadState, sample: UsageSample) -> tuple[WorkloadState, float | None]:
        state, new = self.sizer.step(state, sample)
        held = sample.allocated_fraction or 1.0
        part = held_parts(held, need_of(state, self.sizer.policy), self.sizer.policy)
        self.parts.setdefault(sample.workload.key, []).append(part)
        return state, new


def run_pack_bound(groups: dict[str, list[TracePoint]], sizer: Sizer) -> PackBound:
    """The bounds on the trace, and ``sizer``'s fractions repacked from scratch at every
    instant (one more replay of the sizer, keeping its timeline); for the engine, also as two
    parts on HAMi's sums."""
    recorder = _PartsRecorder(sizer) if isinstance(sizer, EngineSizer) else None
    replayed: Sizer = recorder or sizer
    timelines = replay(groups, lambda: replayed, keep_timeline=True)
    held = held_fractions({w.workload.key: w.timeline for w in timelines.workloads})
    bound = pack_bound(groups, fractions=held)
    if recorder is not None:
        bound.fractions_two_part = two_part_bound(groups, recorder.parts).best()
    return bound


def pack_bound_table(name: str, bound: PackBound) -> Table:
    """Card-hours saved by each repacking from scratch (free moves) of the module's doc."""
    table = Table(title="card-hours saved, repacked from scratch at every instant (free moves)")
    table.add_column("reservation per pod")
    table.add_column("saved", justify="right")
    table.add_row("memory in use (FFD with compute)", f"{bound.saved_pct(bound.actual):.2f}%")
    table.add_row("memory in use, no packing beats", f"{bound.saved_pct(bound.actual_lower):.2f}%")
    for h, hours in sorted(bound.static_peak.items()):
        table.add_row(f"whole-trace memory peak + {h:g}", f"{bound.saved_pct(hours):.2f}%")
    table.add_row(
        "memory in use, in hindsight, changed at most 4 times a day",
        f"{bound.saved_pct(bound.clairvoyant):.2f}%",
    )
    for window, rule in sorted(bound.window_uniform.items()):
        headroom = next(iter(rule.headroom.values()), 0.0)
        table.add_row(
            f"last {window / 3600:g} h peak + {headroom:.3f} for all (the engine's rule), "
            f"{rule.overrun_samples} overruns",
            f"{bound.saved_pct(rule.card_hours):.2f}%",
        )
    for window, rule in sorted(bound.window_peak.items()):
        table.add_row(
            f"last {window / 3600:g} h peak + per-pod headroom in hindsight, "
            f"{rule.overrun_samples} overruns",
            f"{bound.saved_pct(rule.card_hours):.2f}%",
        )
    if bound.fractions is not None:
        table.add_row(f"{name}'s fractions", f"{bound.saved_pct(bound.fractions):.2f}%")
    if bound.fractions_two_part is not None:
        table.add_row(
            f"{name}'s fractions as two parts on HAMi (memory, cores; the smaller at its need)",
            f"{bound.saved_pct(bound.fractions_two_part):.2f}%",
        )
    for window, shared in sorted(bound.shared_chosen().items()):
        table.add_row(
            f"shared: last {window / 3600:g} h peak, one pooled headroom {shared.headroom:g} per "
            f"card, {shared.collision_card_samples} card-level collisions "
            f"({shared.collision_pct:.4f}% of card-samples)",
            f"{bound.saved_pct(shared.card_hours):.2f}%",
        )
    return table
