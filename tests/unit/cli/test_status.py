"""``fracpilot status``'s pure core: rows joined from the sources, risk order, money saved."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import GIB, T0, sample, v1_policy, workload
from fracpilot_cli.status import (
    FleetSnapshot,
    Risk,
    StatusRow,
    build_status_rows,
    risk_of,
    risk_order,
    status_row,
    totals,
    workload_from_key,
)
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    Outcome,
    PlanKind,
    Policy,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState

PRICES = GpuPrices()
WALL = datetime(2026, 12, 2, tzinfo=UTC)  # the wall clock: months after the samples' clock


def policy_for(_wl: WorkloadRef) -> Policy:
    return v1_policy()  # the rules these figures were written for (a 1/8 grid)


def allocation(name: str = "chat", fraction: float = 0.5) -> Allocation:
    return Allocation(
        workload=workload(name),
        pod=f"{name}-0",
        node="node-a",
        gpu_uuid="GPU-a-0",
        fraction=fraction,
        device_memory_bytes=80 * GIB,
        updated_at=T0,
    )


def result(name: str = "chat", outcome: Outcome = Outcome.APPLIED) -> ActuationResult:
    return ActuationResult(
        decision_id="d-1",
        workload=workload(name),
        plan=PlanKind.IN_PLACE,
        outcome=outcome,
        fraction_before=0.75,
        fraction_after=0.5 if outcome is Outcome.APPLIED else 0.75,
        finished_at=T0,
    )


def engine_state(compute: float, memory: float, minutes: int, held: float) -> WorkloadState:
    state = WorkloadState()
    for m in range(minutes):
        state, _ = decide(state, sample(compute, memory, minute=m, allocated=held), v1_policy())
    return state


def row(**sources: Any) -> StatusRow:
    wl = workload(sources.pop("name", "chat"))
    built = status_row(
        subjects.kv_key(wl),
        sources.get("allocation"),
        sources.get("state"),
        sources.get("sample"),
        sources.get("result"),
        policy_for,
        PRICES.hourly,
        WALL,
    )
    assert built is not None
    return built


def test_a_row_from_every_source() -> None:
    latest = sample(0.1, 0.1, minute=39, allocated=0.5, gpu_model="NVIDIA H100 80GB HBM3")
    r = row(
        allocation=allocation(fraction=0.5),
        state=engine_state(0.1, 0.1, 40, 0.5),
        sample=latest,
        result=result(),
    )
    assert (r.namespace, r.workload, r.cluster, r.kind) == (
        "inference",
        "chat",
        "test",
        "Deployment",
    )
    assert r.fraction == 0.5
    assert r.gpu_memory_bytes == 40 * GIB
    assert r.compute_p == pytest.approx(0.1)
    assert r.memory_peak == pytest.approx(0.1)
    assert r.compute_of_fraction == pytest.approx(0.2)
    assert r.memory_of_fraction == pytest.approx(0.2)
    assert r.usage_basis == "engine"
    assert r.target == 0.25
    # The engine's clock is its last sample's (minute 39), not the wall clock.
    assert r.state == "waiting to downsize"
    assert r.wait_s == 3600 - 39 * 60
    assert (r.last_plan, r.last_outcome) == ("in_place", "applied")
    assert (r.last_fraction_before, r.last_fraction_after) == (0.75, 0.5)
    assert r.usd_per_gpu_hour == 4.50
    assert r.saved_usd_month == pytest.approx(0.5 * 4.50 * 730)
    assert r.risk is Risk.NONE
    assert r.samples == 40
    assert r.policy_scope == "cluster"


def test_a_recommendation_shows_what_applying_it_would_save() -> None:
    """Recommend-only (nothing applied: the last result is a dry run): the row still says what
    the engine's target would save against the fraction held, and the totals add it up."""
    latest = sample(0.1, 0.1, minute=39, allocated=0.5, gpu_model="NVIDIA H100 80GB HBM3")
    r = row(
        allocation=allocation(fraction=0.5),
        state=engine_state(0.1, 0.1, 40, 0.5),
        sample=latest,
        result=result(outcome=Outcome.DRY_RUN),
    )
    assert r.target is not None
    assert r.target < 0.5
    assert r.last_outcome == "dry_run"
    assert r.would_save_usd_month == pytest.approx((0.5 - r.target) * 4.50 * 730)
    no_history = row(allocation=allocation(fraction=0.25), sample=sample(allocated=0.25))
    assert no_history.would_save_usd_month is None  # no target, no claim
    assert totals([r, no_history])["would_save_usd_month"] == pytest.approx(r.would_save_usd_month)


def test_money_saved_is_one_minus_the_fraction_at_the_default_price_without_a_model() -> None:
    r = row(allocation=allocation(fraction=0.25), sample=sample(allocated=0.25))
    assert r.gpu_model == ""
    assert r.saved_usd_month == pytest.approx(0.75 * 3.00 * 730)


def test_without_an_allocation_the_sample_says_what_is_held() -> None:
    r = row(sample=sample(0.7, 0.5, allocated=0.75))
    assert r.fraction == 0.75
    assert r.gpu_memory_bytes == 60 * GIB
    assert r.state == "unknown"  # the engine has no state for it
    assert r.usage_basis == "sample"
    assert r.compute_percentile is None
    assert r.compute_of_fraction == pytest.approx(0.7 / 0.75)
    assert r.risk is Risk.NEAR


def test_an_allocation_alone() -> None:
    r = row(allocation=allocation(fraction=0.5))
    assert r.fraction == 0.5
    assert r.compute_p is None
    assert r.compute_of_fraction is None
    assert r.state == "unknown"
    assert r.last_plan == ""
    assert r.risk is Risk.NONE


def test_a_workload_known_only_by_its_engine_state_is_named_by_its_key() -> None:
    state = engine_state(0.1, 0.1, 5, 0.5)
    snapshot = FleetSnapshot(states={"c1/ns-a/StatefulSet/db": state})
    (only,) = build_status_rows(snapshot, policy_for, PRICES, WALL)
    assert (only.cluster, only.namespace, only.kind, only.workload) == (
        "c1",
        "ns-a",
        "StatefulSet",
        "db",
    )
    assert only.fraction == 0.5  # what the engine believes it holds
    assert only.gpu_memory_bytes is None  # no device size known


def test_keys_that_name_no_workload() -> None:
    assert workload_from_key("c/ns/Deployment/name") == WorkloadRef(
        cluster="c", namespace="ns", owner_kind="Deployment", owner_name="name"
    )
    for bad in ("", "a/b/c", "a//c/d", "a/b/c/d/e"):
        assert workload_from_key(bad) is None
    snapshot = FleetSnapshot(states={"not-a-workload": engine_state(0.1, 0.1, 2, 0.5)})
    assert build_status_rows(snapshot, policy_for, PRICES, WALL) == []


def test_risk_classes() -> None:
    assert risk_of(1.2, 0.1, "stable", None) is Risk.MEMORY_OVER
    assert risk_of(0.5, 1.01, "stable", None) is Risk.COMPUTE_OVER
    assert risk_of(1.0, 1.0, "stable", None) is Risk.NEAR  # at the fraction is not over it
    assert risk_of(0.9, 0.1, "stable", None) is Risk.NEAR
    assert risk_of(0.5, 0.5, "upsizing", None) is Risk.UPSIZING
    assert risk_of(0.5, 0.5, "stable", Outcome.FAILED) is Risk.FAILED
    assert risk_of(None, None, "unknown", None) is Risk.NONE


def test_rows_are_joined_filtered_and_ordered_by_risk() -> None:
    names = {
        "calm": (0.1, 0.1, 0.5),
        "hot-memory": (0.1, 0.6, 0.5),
        "hot-compute": (0.7, 0.1, 0.5),
        "busy": (0.46, 0.1, 0.5),
        "growing": (0.44, 0.1, 0.5),  # 88% of the fraction, above what 0.85 utilization allows
    }
    snapshot = FleetSnapshot()
    for name, (compute, memory, held) in names.items():
        key = subjects.kv_key(workload(name))
        snapshot.allocations[key] = allocation(name, held)
        snapshot.samples[key] = sample(compute, memory, minute=10, name=name, allocated=held)
        snapshot.states[key] = engine_state(compute, memory, 11, held)
    other = workload("elsewhere", namespace="jobs")
    snapshot.samples[subjects.kv_key(other)] = sample(name="elsewhere").model_copy(
        update={"workload": other}
    )
    rows = build_status_rows(snapshot, policy_for, PRICES, WALL, namespace="inference")
    assert [r.workload for r in rows] == ["hot-memory", "hot-compute", "busy", "growing", "calm"]
    assert [r.risk for r in rows] == [
        Risk.MEMORY_OVER,
        Risk.COMPUTE_OVER,
        Risk.NEAR,
        Risk.UPSIZING,
        Risk.NONE,
    ]
    assert rows[3].state == "upsizing"
    everything = build_status_rows(snapshot, policy_for, PRICES, WALL)
    assert {r.namespace for r in everything} == {"inference", "jobs"}


def _row_with(risk: Risk, memory: float, compute: float, name: str) -> StatusRow:
    base = row(allocation=allocation(name, 0.5), name=name)
    fields = {n: getattr(base, n) for n in StatusRow.__slots__}
    fields.update(risk=risk, memory_of_fraction=memory, compute_of_fraction=compute)
    return StatusRow(**fields)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Risk)),
            st.floats(0, 3),
            st.floats(0, 3),
            st.text("abc", min_size=1, max_size=3),
        ),
        max_size=12,
    )
)
def test_risk_order_is_by_class_then_pressure_then_name(
    specs: list[tuple[Risk, float, float, str]],
) -> None:
    rows = sorted((_row_with(*spec) for spec in specs), key=risk_order)
    for a, b in itertools.pairwise(rows):
        assert a.risk <= b.risk
        if a.risk == b.risk:
            pa = max(a.memory_of_fraction or 0, a.compute_of_fraction or 0)
            pb = max(b.memory_of_fraction or 0, b.compute_of_fraction or 0)
            assert pa >= pb
            if pa == pb:
                assert a.workload <= b.workload


def test_as_dict_is_json_ready() -> None:
    r = row(allocation=allocation(), sample=sample(minute=3), result=result(outcome=Outcome.FAILED))
    d = r.as_dict()
    assert d["risk"] == "last action failed"
    assert d["last_action_at"] == T0.isoformat()
    assert d["last_sample_at"] == (T0 + timedelta(minutes=3)).isoformat()
    assert set(d) == set(StatusRow.__slots__)
