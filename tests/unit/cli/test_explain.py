"""``fracpilot explain``'s pure core: decisions joined with their results, newest first."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import T0, decision, workload
from fracpilot_cli.explain import build_timeline
from fracpilot_cli.render import timeline_lines
from fracpilot_cli.status import Recorded
from fracpilot_libs.contracts import (
    ActuationResult,
    FractionDecision,
    Outcome,
    PlanKind,
)


def result(
    d: FractionDecision, outcome: Outcome = Outcome.APPLIED, **extra: object
) -> ActuationResult:
    fields: dict[str, object] = {
        "decision_id": d.decision_id,
        "workload": d.workload,
        "plan": PlanKind.IN_PLACE,
        "outcome": outcome,
        "fraction_before": d.current_fraction,
        "fraction_after": d.new_fraction if outcome is Outcome.APPLIED else d.current_fraction,
        "finished_at": d.decided_at + timedelta(seconds=3),
    }
    fields.update(extra)
    return ActuationResult(**fields)  # type: ignore[arg-type]


def rec(value: object, second: int, seq: int) -> Recorded[object]:
    return Recorded(value, T0 + timedelta(seconds=second), seq)


def test_decisions_with_their_results_newest_first() -> None:
    d1 = decision(0.5, 0.25, decision_id="d1", explanation="downsize: quiet for 1 h")
    d2 = decision(0.25, 0.5, decision_id="d2", explanation="upsize at once: memory")
    r1 = result(d1, detail="resized in place")
    r2a = result(d2, plan=PlanKind.SCALE_UP, detail="capacity requested")
    r2b = result(d2, plan=PlanKind.SCALE_UP, detail="capacity appeared; evicted")
    timeline = build_timeline(
        "inference",
        "chat",
        [rec(d1, 10, 1), rec(d2, 20, 2)],
        [rec(r2b, 23, 3), rec(r1, 11, 1), rec(r2a, 21, 2)],
    )
    assert [e.decision_id for e in timeline.entries] == ["d2", "d1"]
    assert timeline.entries[0].results == (r2a, r2b)  # in stream order
    assert timeline.entries[1].results == (r1,)
    assert timeline.workload == d2.workload
    text = "\n".join(timeline_lines(timeline))
    assert text.index("d2") < text.index("d1")
    assert "why: upsize at once: memory" in text
    assert "did: scale_up, applied" in text
    assert "detail: capacity appeared; evicted" in text
    assert "policy revision 0" in text
    assert "kubectl -n inference get events --field-selector involvedObject.name=chat-0" in text


def test_a_decision_without_results_and_results_without_their_decision() -> None:
    pending = decision(0.5, 0.75, decision_id="pending")
    gone = decision(0.75, 0.5, decision_id="gone")  # aged out of the decisions stream
    failed = result(gone, Outcome.FAILED, error="eviction refused (429)")
    timeline = build_timeline("inference", "chat", [rec(pending, 30, 5)], [rec(failed, 5, 1)])
    assert [(e.decision_id, e.decision is not None) for e in timeline.entries] == [
        ("pending", True),
        ("gone", False),
    ]
    text = "\n".join(timeline_lines(timeline))
    assert "nothing recorded yet" in text
    assert "no longer in the decisions stream" in text
    assert "error: eviction refused (429)" in text


def test_other_workloads_on_the_subject_are_left_out() -> None:
    mine = decision(decision_id="mine")
    twin = decision(decision_id="twin").model_copy(
        update={"workload": workload("chat.v2")}  # the same subject token: chat_v2
    )
    other_ns = decision(decision_id="other").model_copy(
        update={"workload": workload("chat", namespace="staging")}
    )
    timeline = build_timeline(
        "inference",
        "chat",
        [rec(mine, 1, 1), rec(twin, 2, 2), rec(other_ns, 3, 3)],
        [rec(result(twin), 4, 1)],
    )
    assert [e.decision_id for e in timeline.entries] == ["mine"]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.sampled_from(["chat", "embed"]), st.integers(0, 3)),
        max_size=15,
        unique_by=lambda t: t[0],
    )
)
def test_every_decision_appears_once_with_exactly_its_results(
    specs: list[tuple[int, str, int]],
) -> None:
    decisions, results = [], []
    seq = 0
    for second, name, n_results in specs:
        d = decision(decision_id=f"{name}-{second}", name=name)
        decisions.append(rec(d, second, second))
        decisions.append(rec(d, second, second))  # a redelivered duplicate
        for i in range(n_results):
            seq += 1
            results.append(rec(result(d, detail=f"stage {i}"), second + i, seq))
    timeline = build_timeline("inference", "chat", decisions, results)
    expected = sorted((s for s in specs if s[1] == "chat"), key=lambda s: -s[0])
    assert [e.decision_id for e in timeline.entries] == [f"chat-{s[0]}" for s in expected]
    for entry, (_, _, n_results) in zip(timeline.entries, expected, strict=True):
        assert [r.detail for r in entry.results] == [f"stage {i}" for i in range(n_results)]
        assert all(r.decision_id == entry.decision_id for r in entry.results)
    document = timeline.as_dict()
    assert len(document["entries"]) == len(expected)
