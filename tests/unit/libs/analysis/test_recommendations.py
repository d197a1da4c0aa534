"""Recommendations are the replay's: the engine's final fraction per workload, with its peaks,
savings and the cards the recommendations pack on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from factories import sample, workload
from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.recommendations import recommend, trace_points
from fracpilot_libs.analysis.replay import replay
from fracpilot_libs.contracts import Policy, UsageSample

T0 = datetime(2026, 3, 2, tzinfo=UTC)
GIB = 1024**3


def series(
    name: str, compute: float, memory_gib: float, n: int = 600, node: str = "node-a"
) -> list[UsageSample]:
    ref = workload(name, "genai")
    return [
        sample(
            workload=ref,
            pod=f"{name}-0",
            node=node,
            gpu_uuid=f"GPU-{name}",
            timestamp=T0 + timedelta(minutes=5 * i),
            compute=compute * (1 + (i % 7) / 10),
            memory_used_bytes=int(memory_gib * GIB),
            memory_total_bytes=80 * GIB,
            allocated=None,
        )
        for i in range(n)
    ]


def test_the_recommendation_is_the_replays_final_fraction() -> None:
    history = {s[0].workload.key: s for s in (series("a", 0.1, 10), series("b", 0.3, 30))}
    result = recommend(history, Policy())
    report = replay({k: trace_points(v) for k, v in history.items()}, lambda: EngineSizer(Policy()))
    finals = {w.workload.key: w.final_fraction for w in report.workloads}
    assert {r.workload.key: r.recommended_fraction for r in result.workloads} == finals
    a = next(r for r in result.workloads if r.workload.owner_name == "a")
    assert a.recommended_fraction < 1.0
    assert a.held_fraction == 1.0
    assert a.memory_peak_bytes == 10 * GIB
    assert abs(a.compute_peak - 0.16) < 1e-9
    assert a.mode == "unknown"
    assert a.monthly_saving_usd > 0
    assert result.cards_held == 2
    assert result.cards_packed == 1
    assert result.cards_freed == 1


def test_enforced_pods_are_named_so() -> None:
    history = {"k": series("a", 0.1, 10)}
    history = {s[0].workload.key: s for s in history.values()}
    result = recommend(history, Policy(), enforced_pods={("genai", "a-0")})
    assert result.workloads[0].mode == "enforced"
    assert result.as_dict()["totals"]["cards_freed"] == 0


def test_the_nodes_packing_would_free() -> None:
    """Hand-made: four idle workloads, each on a GPU of its own, two GPUs per node on two
    nodes; their recommendations fit on one card, so on one node of two GPUs."""
    history = {
        s[0].workload.key: s
        for s in (
            series("a", 0.1, 10, node="n1"),
            series("b", 0.1, 10, node="n1"),
            series("c", 0.1, 10, node="n2"),
            series("d", 0.1, 10, node="n2"),
        )
    }
    result = recommend(history, Policy())
    assert sum(r.recommended_fraction for r in result.workloads) <= 1.0
    assert (result.cards_held, result.cards_packed, result.cards_freed) == (4, 1, 3)
    assert (result.nodes_held, result.nodes_packed, result.nodes_freed) == (2, 1, 1)
    totals = result.as_dict()["totals"]
    assert (totals["nodes_held"], totals["nodes_packed"], totals["nodes_freed"]) == (2, 1, 1)


def test_nodes_are_unknown_when_the_history_names_none() -> None:
    history = {s[0].workload.key: s for s in (series("a", 0.1, 10, node=""),)}
    result = recommend(history, Policy())
    assert (result.nodes_held, result.nodes_packed, result.nodes_freed) == (None, None, None)
