"""``status``'s consolidation line and ``report``'s account, from the actuator's reports and
moves (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fracpilot_cli import render
from fracpilot_cli.report import consolidation_account
from fracpilot_cli.status import consolidation_status
from fracpilot_libs.contracts import (
    ConsolidationMode,
    ConsolidationMove,
    ConsolidationReport,
    MoveState,
    PlannedMove,
    WorkloadRef,
)

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def planned(n: int) -> PlannedMove:
    return PlannedMove(
        pod=f"inference/chat-{n}",
        workload=WorkloadRef(cluster="c1", namespace="inference", owner_name="chat"),
        fraction=0.25,
        from_node="n1",
        from_gpu="GPU-1",
        to_node="n2",
        to_gpu="GPU-2",
    )


def report(
    cluster: str, gpus: int, nodes: int, moves: int, at: datetime, **more: object
) -> ConsolidationReport:
    return ConsolidationReport.model_validate(
        {
            "cluster": cluster,
            "mode": more.pop("mode", ConsolidationMode.RECOMMEND),
            "would_free_gpus": gpus,
            "would_free_nodes": nodes,
            "move_count": moves,
            "moves": [planned(n) for n in range(moves)],
            "reported_at": at,
            **more,
        }
    )


def freed(at: datetime, gpus: int) -> ConsolidationMove:
    return ConsolidationMove(
        cluster="c1", state=MoveState.FREED, node="n1", freed_node="n1", freed_gpus=gpus, at=at
    )


def test_recommend_mode_says_what_it_would_free_and_the_moves() -> None:
    older = report("c1", 9, 9, 1, NOW - timedelta(hours=1))
    status = consolidation_status(
        [report("c1", 3, 1, 7, NOW), older, report("c2", 1, 0, 1, NOW)], [], NOW
    )
    assert status is not None
    lines = render.consolidation_footer(status)
    # each cluster's latest report, summed; the first moves listed
    assert lines[0] == "consolidation: would free 4 GPUs / 1 node (8 moves)"
    assert lines[1] == "  move inference/chat-0 (0.25 GPU): n1/GPU-1 -> n2/GPU-2"
    assert len(lines) == 1 + render.MOVES_SHOWN + 1
    assert lines[-1] == "  ... 3 more (-o json lists them)"
    assert status.as_dict()["move_count"] == 8


def test_auto_mode_says_what_it_freed_today_only() -> None:
    plan = report("c1", 0, 0, 0, NOW, mode=ConsolidationMode.AUTO)
    midnight = NOW.replace(hour=0)
    moves = [freed(midnight - timedelta(seconds=1), 8), freed(midnight, 2), freed(NOW, 4)]
    status = consolidation_status([plan], moves, NOW)
    assert status is not None
    assert render.consolidation_line(status) == (
        "consolidation: freed 6 GPUs / 2 nodes today (0 moves); "
        "would free 0 GPUs / 0 nodes (0 moves) more"
    )


def test_nothing_reported_shows_nothing() -> None:
    assert consolidation_status([], [freed(NOW, 2)], NOW) is None
    assert render.consolidation_footer(None) == []
    assert consolidation_account([], [], NOW) is None


def test_report_sums_the_windows_moves() -> None:
    moves = [freed(NOW - timedelta(minutes=m), 2) for m in (3, 2)]
    account = consolidation_account([report("c1", 1, 0, 1, NOW)], moves, NOW)
    assert account is not None
    document = {"consolidation": account.as_dict()}
    assert document["consolidation"]["freed_node_names"] == ["n1", "n1"]
    assert render.report_consolidation(document) == (
        "consolidation: freed 4 GPUs / 2 nodes with 0 moves verified (0 failed, 0 given up); "
        "last plan would free 1 GPU / 0 nodes (1 move)"
    )
