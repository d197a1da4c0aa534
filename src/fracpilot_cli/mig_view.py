"""MIG profile recommendations in ``fracpilot replay --mig``, ``report`` and ``status -o wide``.

Glue between the decision engine's needs and :mod:`fracpilot_libs.mig`, and their text, JSON,
YAML and HTML. A workload's need is the engine's own (:func:`fracpilot_libs.sizing.engine.
need_of`): memory need = the memory peak plus the policy's headroom, as bytes of the device;
compute need = the policy percentile of compute over the target utilization. MIG partitions are
static (a GPU is repartitioned only when idle), so over a trace or a report window a workload is
sized by the largest need the engine computed for it: memory over the whole series, compute once
the history is ``min_history_s`` long (the engine's own wait before trusting a history to
downsize), or at the last sample of a shorter one. Recommendations only: see docs/mig.md.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import Policy, UsageSample, WorkloadRef
from fracpilot_libs.mig.layout import GpuLayout, Span, instances_for_peak, pack, peak_count
from fracpilot_libs.mig.mig_parted import config_name, mig_parted_config
from fracpilot_libs.mig.profiles import A100_80GB, CARDS, MigCard, card_for_model
from fracpilot_libs.mig.recommend import MigNeed, Recommendation, recommend
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.observation import observe
from fracpilot_libs.sizing.policies import cluster_default
from fracpilot_libs.sizing.state import WorkloadState

GIB = 1024**3
GPUS_PER_NODE = 8  # an HGX / DGX board: what a trace without nodes is split into
CARD_CHOICES = "|".join(CARDS)


def series_need(key: str, samples: Sequence[UsageSample], policy: Policy) -> MigNeed:
    """The largest need the engine computes over ``samples`` (in time order), in bytes of the
    device and a share of its compute."""
    state = WorkloadState()
    memory = compute = last_compute = 0.0
    first = samples[0].timestamp.timestamp()
    for s in samples:
        now = s.timestamp.timestamp()
        state = observe(state, s, policy, now)
        need = need_of(state, policy)
        memory = max(memory, need.memory_need)
        last_compute = need.compute_need
        if now - first >= policy.min_history_s:
            compute = max(compute, need.compute_need)
    if samples[-1].timestamp.timestamp() - first < policy.min_history_s:
        compute = last_compute
    device = samples[-1].memory_total_bytes
    return MigNeed(key, math.ceil(memory * device), compute)


def status_profile(
    gpu_model: str, memory_need: float | None, compute_need: float | None, device: int | None
) -> str:
    """The recommended profile of a ``status`` row: its name, "whole" when no profile holds the
    memory need, "-" when the GPU is not a MIG card modelled here or the engine has no need."""
    card = card_for_model(gpu_model)
    if card is None or memory_need is None or compute_need is None or not device:
        return "-"
    rec = recommend(MigNeed("", math.ceil(memory_need * device), compute_need), card)
    return rec.profile.name if rec.profile is not None else "whole"


def choose_card(name: str, models: Iterable[str]) -> tuple[MigCard, str]:
    """The card named by ``--mig-gpu`` (a card key or a model name), else the first MIG card
    among the samples' models, else the A100 80GB (said so). ValueError for a named card that
    is not modelled."""
    if name:
        card = card_for_model(name)
        if card is None:
            raise ValueError(f"{name!r} is not a MIG card modelled here ({CARD_CHOICES})")
        return card, f"--mig-gpu {name}"
    seen = sorted({m for m in models if m})
    for model in seen:
        card = card_for_model(model)
        if card is not None:
            return card, f"GPU model {model}"
    if seen:
        raise ValueError(
            f"GPU model(s) {', '.join(seen)}: no MIG profile table; --mig-gpu picks one"
        )
    return A100_80GB, f"assumed: no GPU model given; --mig-gpu {CARD_CHOICES} to choose"


@dataclass
class WorkloadMig:
    workload: WorkloadRef
    node: str
    recommendation: Recommendation
    span: Span  # present from the first sample to the last one's end


@dataclass
class MigPlan:
    """Recommendations for a set of workloads and the GPUs that hold them at their peak."""

    card: MigCard
    card_source: str
    workloads: list[WorkloadMig]
    nodes: dict[str, list[GpuLayout]]
    instances: dict[str, int]  # instances per profile, all nodes
    peak_workloads: int  # most workloads present at once: whole GPUs without sharing

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.nodes.values())

    @property
    def whole_gpus(self) -> int:
        return sum(not g.mig_enabled for gpus in self.nodes.values() for g in gpus)

    def config(self) -> dict[str, Any]:
        return mig_parted_config(self.nodes, self.card)

    def config_yaml(self) -> str:
        import yaml  # here only: `fracpilot status` imports this module for its column

        return yaml.safe_dump(self.config(), sort_keys=False, default_flow_style=None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "card": self.card.key,
            "card_source": self.card_source,
            "gpus": self.gpus,
            "whole_gpus_mig_disabled": self.whole_gpus,
            "peak_workloads": self.peak_workloads,
            "instances": self.instances,
            "workloads": [_workload_dict(w) for w in self.workloads],
            "nodes": {
                node: {
                    "config": config_name(node),
                    "gpus": [_gpu_dict(g) for g in gpus],
                }
                for node, gpus in self.nodes.items()
            },
            "mig_parted": self.config() if self.gpus else None,
        }


def _workload_dict(w: WorkloadMig) -> dict[str, Any]:
    rec = w.recommendation
    return {
        "namespace": w.workload.namespace,
        "workload": w.workload.owner_name,
        "node": w.node,
        "memory_need_bytes": rec.need.memory_bytes,
        "compute_need": round(rec.need.compute_share, 4),
        "profile": rec.profile.name if rec.profile is not None else None,
        "sized_by": rec.driver,
        "reason": rec.reason,
    }


def _gpu_dict(gpu: GpuLayout) -> dict[str, Any]:
    if not gpu.mig_enabled:
        return {"mig_enabled": False, "workload": gpu.whole}
    return {
        "mig_enabled": True,
        "instances": [
            {"profile": p.profile.name, "start": p.start, "workload": p.label or None}
            for p in sorted(gpu.placements, key=lambda p: p.start)
        ],
    }


def plan(
    series: Mapping[str, Sequence[UsageSample]],
    policy: Policy,
    card: MigCard,
    card_source: str,
    node_of: Mapping[str, str] | None = None,
) -> MigPlan:
    """Recommendations for every workload of ``series`` (samples in time order, by workload key)
    and, per node (``node_of``: key -> node; one pool split into nodes of 8 GPUs without it),
    the fewest instances that hold the workloads present at any moment, packed on GPUs."""
    workloads = []
    for key in sorted(series):
        samples = series[key]
        times = [s.timestamp.timestamp() for s in samples]
        end = times[-1] + sample_intervals(times)[-1]
        rec = recommend(series_need(key, samples, policy), card)
        node = node_of.get(key, "") if node_of is not None else ""
        workloads.append(
            WorkloadMig(samples[0].workload, node, rec, Span(times[0], end, rec.profile))
        )
    by_node: dict[str, list[WorkloadMig]] = defaultdict(list)
    for w in workloads:
        by_node[w.node].append(w)
    nodes: dict[str, list[GpuLayout]] = {}
    total: dict[str, int] = defaultdict(int)
    for node, members in sorted(by_node.items()):
        counts, whole_count = instances_for_peak([w.span for w in members], card)
        for name, n in counts.items():
            total[name] += n
        # with one workload per node each instance is its own; otherwise they serve in turn
        alone = [w for w in members if w.recommendation.profile is None]
        labels = (
            [w.workload.key for w in alone] if len(alone) == whole_count else [""] * whole_count
        )
        instances = [("", card.profile(name)) for name, n in counts.items() for _ in range(n)]
        gpus = pack(instances, card, whole=labels)
        if node_of is None:
            nodes.update(_split(gpus))
        else:
            nodes[node or "unknown-node"] = gpus
    order = {p.name: i for i, p in enumerate(card.profiles)}
    return MigPlan(
        card,
        card_source,
        workloads,
        nodes,
        dict(sorted(total.items(), key=lambda kv: -order[kv[0]])),
        peak_count((w.span.start, w.span.end) for w in workloads),
    )


def _split(gpus: list[GpuLayout]) -> dict[str, list[GpuLayout]]:
    return {
        f"node-{i // GPUS_PER_NODE + 1}": gpus[i : i + GPUS_PER_NODE]
        for i in range(0, len(gpus), GPUS_PER_NODE)
    }


# --- replay ------------------------------------------------------------------------------------


def trace_mig(
    groups: Mapping[str, Sequence[TracePoint]],
    policy: Policy,
    card_name: str,
    gpu_model: str,
    config_path: Path | None,
    err: Console,
) -> MigPlan:
    """``fracpilot replay --mig``: the plan for a trace (no nodes: one pool in nodes of 8), its
    mig-parted config written to ``config_path`` when given. Exits 2 on a bad card or path."""
    series = {key: [p.sample for p in points] for key, points in groups.items()}
    models = {s.gpu_model for ss in series.values() for s in ss} | {gpu_model}
    try:
        card, source = choose_card(card_name, models)
    except ValueError as exc:
        _fail(f"--mig-gpu: {exc}")
    if config_path is not None and not config_path.parent.is_dir():
        _fail(f"--mig-config: no such directory: {config_path.parent}")
    mig = plan(series, policy, card, source)
    if config_path is not None:
        try:
            config_path.write_text(mig.config_yaml())
        except OSError as exc:
            _fail(f"--mig-config: cannot write {config_path}: {exc.strerror or exc}")
        err.print(f"mig-parted config written to {config_path}", markup=False, highlight=False)
    return mig


def _fail(message: str) -> NoReturn:
    typer.echo(f"fracpilot replay: error: {message}", err=True)
    raise typer.Exit(code=2)


def with_mig(document: dict[str, Any], mig: MigPlan | None) -> dict[str, Any]:
    """The replay's JSON with a ``mig`` object when there is a plan (today's keys kept)."""
    return {**document, "mig": mig.as_dict()} if mig is not None else document


# --- text --------------------------------------------------------------------------------------


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def print_mig(console: Console, mig: MigPlan, config_path: str | None) -> None:
    """The recommendation per workload, the instances and GPUs at the peak, the layout."""
    table = Table(
        title=f"MIG profiles on {mig.card.name} ({mig.card_source})",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    for col, right in (
        ("workload", False),
        ("memory need GiB", True),
        ("compute need", True),
        ("profile", False),
        ("sized by", False),
    ):
        table.add_column(col, justify="right" if right else "left", no_wrap=True)
    order = {p.name: i for i, p in enumerate(mig.card.profiles)}
    for w in sorted(
        mig.workloads,
        key=lambda w: (
            -order.get(w.recommendation.profile.name, 99) if w.recommendation.profile else -100,
            w.workload.key,
        ),
    ):
        rec = w.recommendation
        table.add_row(
            w.workload.display,
            _gib(rec.need.memory_bytes),
            f"{rec.need.compute_share:.2f}",
            rec.profile.name if rec.profile else "whole GPU (no MIG)",
            rec.driver,
        )
    console.print(table)
    console.print(
        "instances held at the peak: "
        + (", ".join(f"{n} x {name}" for name, n in mig.instances.items()) or "none")
        + (f", {mig.whole_gpus} whole GPU(s) with MIG disabled" if mig.whole_gpus else ""),
        highlight=False,
    )
    console.print(
        f"MIG GPUs needed: {mig.gpus} on {len(mig.nodes)} node(s), against {mig.peak_workloads} "
        "whole GPUs for the workloads present at once",
        highlight=False,
    )
    for node, gpus in mig.nodes.items():
        for i, gpu in enumerate(gpus):
            console.print(f"  {node} gpu {i}: {_gpu_text(gpu)}", highlight=False)
    where = f"written to {config_path}" if config_path else "--mig-config FILE writes it"
    console.print(f"mig-parted config ({where}); docs/mig.md says how to apply it", highlight=False)


def _gpu_text(gpu: GpuLayout) -> str:
    if not gpu.mig_enabled:
        return "MIG disabled (whole GPU)"
    return "  ".join(
        f"{p.profile.name}@{p.start}" for p in sorted(gpu.placements, key=lambda p: p.start)
    )


# --- report ------------------------------------------------------------------------------------


def report_plan(
    samples: Iterable[UsageSample], policy: Policy, asked: bool, card_name: str = ""
) -> MigPlan | None:
    """The MIG section of ``fracpilot report``: per node where the workloads last ran, when
    their GPUs are MIG cards modelled here or when ``asked``; None otherwise."""
    series: dict[str, list[UsageSample]] = defaultdict(list)
    for s in samples:
        series[s.workload.key].append(s)
    if not series:
        return None
    models = {s.gpu_model for ss in series.values() for s in ss}
    if not asked and not any(card_for_model(m) for m in models):
        return None
    card, source = choose_card(card_name, models)
    for ss in series.values():
        ss.sort(key=lambda s: s.timestamp)
    node_of = {key: ss[-1].node for key, ss in series.items()}
    return plan(series, policy, card, source, node_of)


def with_report_section(
    document: dict[str, Any],
    page: str,
    samples: Iterable[UsageSample],
    policy_json: str | None,
    asked: bool,
) -> tuple[dict[str, Any], str]:
    """``report.json`` with a ``mig`` object and the page with its MIG section, when the
    workloads' GPUs are MIG cards modelled here or when ``asked`` (else both unchanged). A card
    the samples name without a table here leaves the report unchanged, said in ``mig``. The
    policy is the cluster default (``FRACPILOT_POLICY_JSON``), the one the engine starts from."""
    try:
        mig = report_plan(samples, cluster_default(policy_json), asked)
    except ValueError as exc:  # a card without a table, or FRACPILOT_POLICY_JSON invalid
        return {**document, "mig": {"error": str(exc)}}, page
    if mig is None:
        return document, page
    end = page.rfind("</body>")
    section = mig_html(mig)
    page = page[:end] + section + page[end:] if end >= 0 else page + section
    return {**document, "mig": mig.as_dict()}, page


def mig_html(mig: MigPlan) -> str:
    """The report page's MIG section."""
    rows = "".join(
        "<tr><td class='l'>{}</td><td class='l'>{}</td><td>{}</td><td>{:.2f}</td>"
        "<td class='l'>{}</td></tr>".format(
            html.escape(w.workload.display),
            html.escape(w.node or "-"),
            _gib(w.recommendation.need.memory_bytes),
            w.recommendation.need.compute_share,
            html.escape(w.recommendation.profile.name if w.recommendation.profile else "whole"),
        )
        for w in mig.workloads
    )
    layout = "".join(
        f"<li>{html.escape(node)} (config <code>{html.escape(config_name(node))}</code>): "
        + "; ".join(html.escape(_gpu_text(g)) for g in gpus)
        + "</li>"
        for node, gpus in mig.nodes.items()
    )
    return (
        f"<h2>MIG profiles ({html.escape(mig.card.name)})</h2>"
        f"<p class='muted'>{html.escape(mig.card_source)}. The smallest profile that holds "
        "each workload's memory need and compute need; recommendations only (docs/mig.md). "
        f"{mig.gpus} GPU(s) hold them at their peak.</p>"
        "<table><thead><tr><th class='l'>workload</th><th class='l'>node</th>"
        "<th>memory need GiB</th><th>compute need</th><th class='l'>profile</th></tr></thead>"
        f"<tbody>{rows}</tbody></table><ul>{layout}</ul>"
        f"<pre>{html.escape(mig.config_yaml()) if mig.gpus else ''}</pre>"
    )
