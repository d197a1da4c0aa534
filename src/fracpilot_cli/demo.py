"""``fracpilot demo``: the three services over a real NATS on a simulated GPU cluster.

It starts an embedded nats-server (unless ``FRACPILOT_NATS_URL`` names one), runs ingest with
the workload simulator, decision, and the actuator with the simulated cluster as separate
processes, follows the usage and actuation streams to draw a live table, and ends with a
summary computed from those streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from fracpilot_cli.operator_cli import operator_hint
from fracpilot_cli.processes import ServiceProcess
from fracpilot_cli.settings import CliSettings
from fracpilot_cli.summary import SIMULATED_CLUSTER_KEY, RunSummary, WorkloadView, cluster_cards_of
from fracpilot_libs.analysis.accounting import overruns
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import ActuationResult, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.connect import open_connection
from fracpilot_libs.nats.decision_backlog import decision_backlog
from fracpilot_libs.nats.decoding import DecodeError, decode
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.nats.kv_snapshot import read_kv
from fracpilot_libs.nats.usage_batch import decode_batch, decode_sample
from fracpilot_libs.nats.usage_streams import usage_streams
from fracpilot_libs.simulation.workloads import demo_workloads


@dataclass(frozen=True)
class DemoConfig:
    workloads: int = 8
    nodes: int = 2
    gpus_per_node: int = 2
    initial_fraction: float = 0.5
    sim_hours: float = 24.0
    speed: float = 720.0  # simulated seconds per real second: a day in two minutes
    step_s: float = 60.0
    namespace: str = "inference"
    cluster: str = "demo"
    log_dir: Path | None = None

    @property
    def expected_samples(self) -> int:
        steps = int(self.sim_hours * 3600 // self.step_s)
        return steps * self.workloads

    def service_env(self, nats_url: str) -> dict[str, dict[str, str]]:
        pods = ",".join(
            f"{w.workload.namespace}/{w.workload.owner_name}={self.initial_fraction}"
            for w in demo_workloads(self.namespace, self.cluster)[: self.workloads]
        )
        common = {"FRACPILOT_NATS_URL": nats_url, "FRACPILOT_METRICS_PORT": "0"}
        return {
            "actuator": {
                **common,
                "FRACPILOT_SIM_PODS": pods,
                "FRACPILOT_SIM_CLUSTER": self.cluster,
                "FRACPILOT_SIM_NODES": str(self.nodes),
                "FRACPILOT_SIM_GPUS_PER_NODE": str(self.gpus_per_node),
                # The demo's cluster is the user's own: its namespace opts in to automatic
                # resizing, as `kubectl label namespace <ns> fracpilot.io/mode=auto` would.
                "FRACPILOT_SIM_NAMESPACE_LABELS": json.dumps(
                    {self.namespace: {"fracpilot.io/mode": "auto"}}
                ),
                # Consolidation moves the opted-in pods off a node so that the simulated
                # autoscaler removes it (its clock is the simulation's).
                "FRACPILOT_CONSOLIDATION_MODE": "auto",
            },
            "decision": dict(common),
            "ingest": {
                **common,
                "FRACPILOT_SIM_WORKLOADS": str(self.workloads),
                "FRACPILOT_SIM_SPEED": str(self.speed),
                "FRACPILOT_SIM_STEP_S": str(self.step_s),
                "FRACPILOT_SIM_DURATION_S": str(self.sim_hours * 3600),
                "FRACPILOT_SIM_NAMESPACE": self.namespace,
                "FRACPILOT_SIM_CLUSTER": self.cluster,
            },
        }


class StreamFollower:
    """Follows the usage and actuation streams into a RunSummary."""

    def __init__(self, summary: RunSummary) -> None:
        self.summary = summary
        self.nc: NatsClient | None = None

    async def start(self, url: str) -> None:
        # The FRACPILOT_NATS_* identity and TLS settings, as the services read them.
        self.nc = await open_connection(
            ServiceSettings(nats={"url": url}), servers=url, name="fracpilot-demo"
        )
        js = self.nc.jetstream()
        for stream in await usage_streams(js):  # one per usage partition
            await js.subscribe(
                f"{subjects.USAGE_PREFIX}.>",
                stream=stream,
                cb=self._on_usage,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
        await js.subscribe(
            f"{subjects.ACTUATION_PREFIX}.>",
            cb=self._on_result,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )

    async def _on_usage(self, msg: Msg) -> None:
        if not subjects.is_usage_batch(msg.subject):  # one sample (ingest's earlier format)
            with contextlib.suppress(DecodeError):
                self.summary.add_sample(decode(UsageSample, msg.data))
            return
        with contextlib.suppress(DecodeError):
            lines = decode_batch(msg.data).lines
            for line in lines:  # a sample that does not decode is left out alone
                with contextlib.suppress(DecodeError):
                    self.summary.add_sample(decode_sample(line))

    async def _on_result(self, msg: Msg) -> None:
        with contextlib.suppress(DecodeError):
            self.summary.add_result(decode(ActuationResult, msg.data))

    async def pipeline_idle(self) -> bool:
        """True when decision and actuator have acknowledged everything published so far."""
        assert self.nc is not None
        js = self.nc.jetstream()
        try:  # the decision replicas consume the usage stream by partition
            backlog = await decision_backlog(js)
            info = await js.consumer_info(subjects.DECISION_STREAM, subjects.ACTUATOR_CONSUMER)
        except Exception:
            return False
        if backlog is None or not backlog.caught_up:
            return False
        return not (info.num_pending or info.num_ack_pending)

    async def read_cluster(self) -> None:
        """The simulated cluster's GPUs as the actuator left them: which hold no pod."""
        assert self.nc is not None
        try:
            values = await read_kv(self.nc, subjects.ACTUATOR_STATE_BUCKET)
            stored = values.get(SIMULATED_CLUSTER_KEY)
            if stored is not None:
                self.summary.cluster = cluster_cards_of(stored.data)
        except Exception:  # the summary goes without the cluster's line; the run is done
            return

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


# The live table's short words for a plan and an outcome (80 columns, names kept whole).
_PLAN_WORDS = {"in_place": "in place", "recreate_elsewhere": "moved", "scale_up": "scale-up"}
_OUTCOME_WORDS = {"applied": "", "dry_run": " dry run"}


def short_action(view: WorkloadView) -> str:
    """``in place 0.5->0.25``, ``moved 0.5->0.75 (pending)``, ``scale-up ... failed``."""
    if not view.last_plan:
        return view.last_action
    plan = _PLAN_WORDS.get(view.last_plan, view.last_plan)
    outcome = _OUTCOME_WORDS.get(view.last_outcome, f" {view.last_outcome}")
    return f"{plan} {view.last_change}".strip() + outcome


def live_table(summary: RunSummary, sim_hours_done: float, sim_hours: float) -> Group:
    views = sorted(summary.workloads.values(), key=lambda v: v.name)
    # One namespace (the demo's): said once in the title, so that names fit whole in 80 columns.
    spaces = {v.name.partition("/")[0] for v in views if "/" in v.name}
    one = spaces.pop() if len(spaces) == 1 and all("/" in v.name for v in views) else None
    title = f"fracpilot demo - simulated hour {sim_hours_done:4.1f} of {sim_hours:g}"
    table = Table(
        title=title + (f", namespace {one}" if one else ""),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for col, justify in (
        ("workload", "left"),
        ("compute", "right"),
        ("memory", "right"),
        ("share", "right"),
        ("saved", "right"),
        ("node", "left"),
        ("last action", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=col != "last action")  # type: ignore[arg-type]
    for view in views:
        frac = f"{view.fraction:.2f}" if view.fraction is not None else "-"
        hot = view.fraction is not None and (
            overruns(view.compute, view.fraction) or overruns(view.memory_share, view.fraction)
        )
        style = "bold red" if hot else ""
        table.add_row(
            view.name.partition("/")[2] if one else view.name,
            f"{view.compute:.0%}",
            f"{view.memory_share:.0%}",
            frac,
            f"${view.cost_saved_usd:,.0f}",
            view.node,
            short_action(view),
            style=style,
        )
    footer = Table.grid(padding=(0, 2))  # two rows: each fits 80 columns with a day's numbers
    footer.add_row(
        f"samples {summary.samples}",
        f"GPU-hours {summary.allocated_gpu_hours:.1f} of {summary.whole_gpu_hours:.1f}",
        f"saved {summary.savings_pct:.1f}% (${summary.cost_saved_usd:,.2f})",
    )
    footer.add_row(
        f"actions {sum(summary.actions.values())}",
        f"GPUs {summary.cards_now} for {len(summary.workloads)} workloads",
        "",
    )
    return Group(table, footer)


def summary_table(summary: RunSummary, elapsed_s: float) -> Table:
    t = Table(title="fracpilot demo - summary", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    n = max(summary.samples, 1)
    t.add_row("samples", str(summary.samples))
    t.add_row("GPU-hours allocated", f"{summary.allocated_gpu_hours:.2f}")
    t.add_row("GPU-hours as whole GPUs", f"{summary.whole_gpu_hours:.2f}")
    t.add_row("savings", f"{summary.savings_pct:.1f}%")
    t.add_row(
        "money saved",
        f"${summary.cost_saved_usd:,.2f} of ${summary.whole_cost_usd:,.2f} as whole GPUs",
    )
    t.add_row(
        "compute overruns",
        f"{summary.compute_overruns} ({100 * summary.compute_overruns / n:.2f}% of samples)",
    )
    t.add_row(
        "memory overruns",
        f"{summary.memory_overruns} ({100 * summary.memory_overruns / n:.2f}% of samples)",
    )
    cards = summary.cards()
    c = cards.account
    t.add_row("GPUs as whole GPUs (one per pod)", str(cards.gpus_whole))
    t.add_row("GPUs in use", f"{cards.gpus_in_use} ({cards.cards_freed} cards freed)")
    t.add_row(
        "card-hours of whole GPUs",
        f"{c.card_hours:.2f} of {c.whole_card_hours:.2f} ({c.card_hours_saved_pct:.1f}% saved)",
    )
    llm = summary.preallocated
    if llm.samples:  # preallocating LLM servers: the memory their flags gave back
        t.add_row(
            "LLM memory given back",
            f"{llm.released_gib_hours:,.0f} of {llm.alone_gib_hours:,.0f} GiB-h preallocated "
            f"({llm.released_pct:.1f}%)",
        )
    if summary.cluster is not None:
        t.add_row(
            "cluster GPUs without a pod",
            f"{summary.cluster.without_pods} of {summary.cluster.gpus}",
        )
        group = summary.cluster
        t.add_row(
            "nodes removed by the autoscaler",
            f"{group.nodes_removed} ({group.nodes_added} added, {group.nodes} left)",
        )
    for kind, count in sorted(summary.actions.items()):
        t.add_row(f"actions {kind}", str(count))
    t.add_row("wall time", f"{elapsed_s:.0f} s")
    return t


async def run_demo(config: DemoConfig, console: Console) -> RunSummary:
    started = time.monotonic()
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="fracpilot-demo-"))
    external = os.environ.get("FRACPILOT_NATS_URL")
    server = None if external else EmbeddedNats().start()
    url = external or (server.url if server else "")
    # The embedded server listens on loopback only and asks for no credentials: say so.
    where = " (embedded: loopback only, no authentication)" if server else ""
    console.print(f"NATS: {url}{where}; service logs in {log_dir}")
    example = demo_workloads(config.namespace, config.cluster)[0].workload.display
    hint = operator_hint(url, example, server is not None)
    console.print(hint, markup=False, highlight=False, soft_wrap=True)  # whole commands
    envs = config.service_env(url)
    # The actuator seeds the cluster and the decision consumer exists before samples flow.
    order = ("actuator", "decision", "ingest")
    procs = [ServiceProcess(name, envs[name], log_dir) for name in order]
    summary = RunSummary(step_s=config.step_s, prices=CliSettings().prices)
    follower = StreamFollower(summary)
    try:
        for p in procs:
            p.start().wait_for_log("service ready", timeout_s=60)
        await follower.start(url)
        deadline = time.monotonic() + config.sim_hours * 3600 / config.speed + 120
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while time.monotonic() < deadline:
                per_workload = summary.samples / max(config.workloads, 1)
                live.update(
                    live_table(summary, per_workload * config.step_s / 3600, config.sim_hours)
                )
                if summary.samples >= config.expected_samples and await follower.pipeline_idle():
                    break
                for p in procs:
                    if not p.running:
                        raise RuntimeError(f"{p.name} stopped unexpectedly; see {p.log_path}")
                await asyncio.sleep(0.25)
            else:
                console.print("[yellow]demo timed out before the pipeline drained[/]")
        await follower.read_cluster()
    finally:
        await follower.close()
        for p in reversed(procs):
            p.stop()
        if server is not None:
            server.cleanup()
    console.print()
    console.print(summary_table(summary, time.monotonic() - started))
    return summary
