"""The demo's run summary: GPU-hours and the money they cost, per workload and in total."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest
from rich.console import Console

from factories import sample, workload
from fracpilot_actuator.simulated.autoscaler import NodeGroup
from fracpilot_actuator.simulated.cluster import STATE_KEY, seed_cluster
from fracpilot_cli.demo import live_table, summary_table
from fracpilot_cli.summary import SIMULATED_CLUSTER_KEY, RunSummary, cluster_cards_of
from fracpilot_libs.contracts import ActuationResult, AppSignals, Outcome, PlanKind
from fracpilot_libs.pricing import GpuPrices


def test_money_saved_is_whole_minus_allocated_priced_by_model() -> None:
    prices = GpuPrices(usd_per_hour={"H100": 4.0}, default_usd_per_hour=2.0)
    summary = RunSummary(step_s=3600, prices=prices)
    summary.add_sample(sample(name="a", allocated=0.25, gpu_model="NVIDIA H100 80GB HBM3"))
    summary.add_sample(sample(name="a", allocated=0.5, minute=60, gpu_model="NVIDIA H100"))
    summary.add_sample(sample(name="b", allocated=None))  # not placed: a whole GPU, no saving
    summary.add_sample(sample(name="c", allocated=0.5))  # unknown model: the default price
    assert summary.whole_cost_usd == pytest.approx(4.0 + 4.0 + 2.0 + 2.0)
    assert summary.allocated_cost_usd == pytest.approx(1.0 + 2.0 + 2.0 + 1.0)
    assert summary.cost_saved_usd == pytest.approx(6.0)
    per_workload = {v.name: v.cost_saved_usd for v in summary.workloads.values()}
    assert per_workload == pytest.approx(
        {"inference/a": 5.0, "inference/b": 0.0, "inference/c": 1.0}
    )
    assert sum(per_workload.values()) == pytest.approx(summary.cost_saved_usd)


# --- cards: GPUs in use, cards freed, card-hours, and the cluster's GPUs without a pod ---------

A100 = "NVIDIA A100-SXM4-80GB"
DEMO_NAMES = [
    "chat-llama-8b",
    "embed-bge",
    "rerank-minilm",
    "sdxl-images",
    "whisper-asr",
    "code-qwen-7b",
    "ocr-donut",
    "tts-xtts",
]


def three_cards_for_eight(minutes: int = 60) -> RunSummary:
    """The demo's eight workloads at a quarter each, three to a card: three cards for eight."""
    summary = RunSummary(step_s=60)
    for m in range(minutes):
        for i, name in enumerate(DEMO_NAMES):
            summary.add_sample(
                sample(
                    minute=m, name=name, allocated=0.25, gpu_uuid=f"GPU-{i // 3}", gpu_model=A100
                )
            )
    return summary


def test_the_run_counts_cards_in_use_and_freed_as_the_report_does() -> None:
    summary = three_cards_for_eight()
    cards = summary.cards()
    assert (cards.gpus_whole, cards.gpus_in_use, cards.cards_freed) == (8, 3, 5)
    assert cards.account.card_hours == pytest.approx(3.0)
    assert cards.account.whole_card_hours == pytest.approx(summary.whole_gpu_hours) == 8.0
    assert summary.cards_now == 3


def test_the_cluster_line_counts_gpus_without_a_pod_from_the_actuators_state() -> None:
    pods = [(workload(n), 0.25) for n in DEMO_NAMES[:5]]
    state = seed_cluster(nodes=2, gpus_per_node=2, memory_bytes=80 * 1024**3, pods=pods)
    stored = json.dumps({"cluster": state.model_dump(mode="json"), "applied": ["d1"]}).encode()
    cards = cluster_cards_of(stored)
    assert (cards.gpus, cards.with_pods, cards.without_pods) == (4, 2, 2)  # first fit: 4 + 1
    assert (cards.nodes, cards.nodes_added, cards.nodes_removed) == (2, 0, 0)
    legacy = cluster_cards_of(json.dumps(state.model_dump(mode="json")).encode())
    assert legacy == cards
    assert SIMULATED_CLUSTER_KEY == STATE_KEY  # where the demo reads what the actuator writes


def test_the_demo_summary_shows_cards_within_80_columns() -> None:
    summary = three_cards_for_eight(minutes=1440)  # a simulated day
    summary.cluster = cluster_cards_of(
        json.dumps(
            {
                "cluster": seed_cluster(
                    2, 2, 80 * 1024**3, [(workload(n), 0.25) for n in DEMO_NAMES]
                ).model_dump(mode="json"),
                # the actuator's simulated node group: grew by one, then lost two
                "node_group": NodeGroup(
                    added=("sim-node-2",), removed=("sim-node-2", "sim-node-1")
                ).as_json(),
            }
        ).encode()
    )
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(summary_table(summary, 120.0))
    console.print(live_table(summary, 24.0, 24))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = {
        cells[0].strip(): cells[1].strip()
        for line in lines
        if (cells := line.strip("│ ").split("│")) and len(cells) == 2
    }
    assert rows["GPUs as whole GPUs (one per pod)"] == "8"
    assert rows["GPUs in use"] == "3 (5 cards freed)"
    assert rows["card-hours of whole GPUs"] == "72.00 of 192.00 (62.5% saved)"
    assert rows["cluster GPUs without a pod"] == "2 of 4"
    assert rows["nodes removed by the autoscaler"] == "2 (1 added, 2 left)"
    footer = [line for line in lines if "GPUs 3 for 8 workloads" in line]
    assert len(footer) == 1
    assert any("GPU-hours 48.0 of 192.0" in line for line in lines)


def test_the_demo_summary_shows_the_memory_a_preallocating_server_gave_back() -> None:
    """A day of the demo's eight workloads at a quarter each; chat-llama-8b runs vLLM, its flag
    rewritten for 0.25 to 0.237 of the card, where on a GPU of its own vLLM preallocates its
    default 0.92."""
    assert three_cards_for_eight().preallocated.samples == 0  # no such server: no line
    summary = RunSummary(step_s=60)
    vllm = AppSignals(kv_cache_usage=0.3, llm_server="vllm", kv_pool_bytes=3 * 1024**3)
    for m in range(1440):
        for i, name in enumerate(DEMO_NAMES):
            llm = name == "chat-llama-8b"
            summary.add_sample(
                sample(
                    minute=m,
                    name=name,
                    allocated=0.25,
                    memory_share=0.237 if llm else 0.1,
                    signals=vllm if llm else None,
                    gpu_uuid=f"GPU-{i // 3}",
                    gpu_model=A100,
                )
            )
    llm = summary.preallocated
    assert llm.samples == 1440
    assert llm.alone_gib_hours == pytest.approx(0.92 * 80 * 24)  # 1766.4
    assert llm.held_gib_hours == pytest.approx(0.237 * 80 * 24, abs=0.01)  # 455.04
    assert llm.released_gib_hours == pytest.approx(1311.36, abs=0.01)
    assert llm.released_pct == pytest.approx(74.24, abs=0.01)
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(summary_table(summary, 120.0))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    [row] = [line for line in lines if "LLM memory given back" in line]
    assert "1,311 of 1,766 GiB-h preallocated (74.2%)" in row


def test_the_live_table_keeps_workload_names_whole_at_80_columns() -> None:
    """Issue 30: the names were cut to ``inference/…``; the one namespace goes in the title."""
    summary = three_cards_for_eight(minutes=60)
    for i, name in enumerate(DEMO_NAMES):
        summary.add_result(
            ActuationResult(
                decision_id=f"d{i}",
                workload=workload(name),
                plan=PlanKind.IN_PLACE,
                outcome=Outcome.APPLIED,
                fraction_before=0.55,
                fraction_after=0.25,
                node_after="sim-node-10",
                finished_at=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(live_table(summary, 3.0, 24))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "namespace inference" in lines[0]
    rows = [line.split() for line in lines if line.split() and line.split()[0] in DEMO_NAMES]
    assert sorted(row[0] for row in rows) == sorted(DEMO_NAMES)  # whole, one row each
    assert all(row[-3:] == ["in", "place", "0.55->0.25"] for row in rows)
