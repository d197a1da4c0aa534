"""``fracpilot status`` and ``explain`` tell the accounted share from the enforced one: a pod
resized in place (KAI accounting only) whose memory limit lags is flagged, in -o wide and JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from factories import GIB, T0, v1_policy, workload
from fracpilot_cli import render
from fracpilot_cli.explain import DecisionTimeline
from fracpilot_cli.status import FleetSnapshot, StatusRow, build_status_rows
from fracpilot_libs.contracts import ActuationResult, Allocation, Outcome, PlanKind
from fracpilot_libs.nats import subjects
from fracpilot_libs.pricing import GpuPrices

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def rows(*held: tuple[str, float, float | None]) -> dict[str, StatusRow]:
    """One workload per (name, accounted, enforced), by name."""
    snapshot = FleetSnapshot()
    for name, accounted, enforced in held:
        wl = workload(name)
        snapshot.allocations[subjects.kv_key(wl)] = Allocation(
            workload=wl,
            pod=f"{name}-0",
            node="n",
            gpu_uuid="g",
            fraction=accounted,
            enforced_fraction=enforced,
            device_memory_bytes=80 * GIB,
            updated_at=T0,
        )
    found = build_status_rows(snapshot, lambda _: v1_policy(), GpuPrices(), NOW)
    return {r.workload: r for r in found}


def test_status_flags_a_lagging_enforced_fraction_in_wide_and_json() -> None:
    by_name = rows(("lagging", 0.25, 0.5), ("settled", 0.5, 0.5), ("kai-only", 0.25, None))
    lagging, settled, unenforced = by_name["lagging"], by_name["settled"], by_name["kai-only"]
    assert (lagging.enforced_fraction, lagging.enforcement_lags) == (0.5, True)
    assert (settled.enforced_fraction, settled.enforcement_lags) == (0.5, False)
    assert (unenforced.enforced_fraction, unenforced.enforcement_lags) == (None, False)

    assert "ENFORCED" in render.WIDE_COLUMNS
    assert "ENFORCED" not in render.COLUMNS
    at = render.WIDE_COLUMNS.index("ENFORCED")
    assert render.status_cells(lagging, wide=True)[at] == "0.5 (lags)"
    assert render.status_cells(settled, wide=True)[at] == "0.5"
    assert render.status_cells(unenforced, wide=True)[at] == "-"

    document = render.status_document(list(by_name.values()), NOW)
    items = {i["workload"]: i for i in json.loads(json.dumps(document))["items"]}
    assert items["lagging"]["enforced_fraction"] == 0.5
    assert items["lagging"]["enforcement_lags"] is True
    assert items["kai-only"]["enforced_fraction"] is None


def test_explain_says_accounted_and_enforced_for_each_action() -> None:
    result = ActuationResult(
        decision_id="d-1",
        workload=workload("chat"),
        plan=PlanKind.IN_PLACE,
        outcome=Outcome.APPLIED,
        fraction_before=0.5,
        fraction_after=0.25,
        enforced_fraction=0.5,
        finished_at=T0,
    )
    lines = render._result_lines(result)
    assert "       share: accounted 0.25, enforced 0.5 (lags until the pod restarts)" in lines
    unenforced = result.model_copy(update={"enforced_fraction": None})
    assert any("memory not enforced" in line for line in render._result_lines(unenforced))
    status = rows(("chat", 0.25, 0.5))["chat"]
    now = render.timeline_lines(DecisionTimeline(workload("chat"), (), status))[1]
    assert now.startswith("now: fraction 0.25 (20Gi; enforced 0.5 (lags)), ")
