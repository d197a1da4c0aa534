"""Wire contracts: immutability, strictness, finite numbers, cross-field rules, JSON."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from factories import GIB, T0, as_json_with, decision, sample, workload
from fracpilot_libs.contracts import (
    PROFILE_MAX_PERIODS,
    ActuationResult,
    Allocation,
    AppSignals,
    CardForecast,
    ComputeSizing,
    DeadLetter,
    Direction,
    FractionDecision,
    GridKind,
    MemoryIsolation,
    Mode,
    Outcome,
    PeakProfile,
    PlanKind,
    Policy,
    PolicyLevel,
    PolicyReply,
    PolicyScope,
    ReasonCode,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.sizing.state import MEMORY_SLOTS

NON_FINITE = [math.nan, math.inf, -math.inf]


# --- frozen and extra=forbid ---------------------------------------------------------------


def test_models_are_frozen() -> None:
    s = sample()
    with pytest.raises(ValidationError):
        s.compute = 0.9  # type: ignore[misc]
    assert s.compute == 0.1
    p = Policy()
    with pytest.raises(ValidationError):
        p.grid_steps = 4  # type: ignore[misc]
    assert p.grid_steps == 8


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="surprise"):
        sample(surprise=True)
    with pytest.raises(ValidationError):
        UsageSample.model_validate_json(as_json_with(sample(), surprise=True))
    with pytest.raises(ValidationError):
        Policy(grid=8)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        WorkloadRef(namespace="ns", owner_name="x", kind="Deployment")  # type: ignore[call-arg]


def test_wrong_schema_version_is_rejected() -> None:
    with pytest.raises(ValidationError):
        UsageSample.model_validate_json(as_json_with(sample(), schema_version=2))


# --- finite numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", NON_FINITE)
def test_usage_sample_rejects_non_finite_compute(bad: float) -> None:
    with pytest.raises(ValidationError):
        sample(compute=bad)


@pytest.mark.parametrize("bad", NON_FINITE)
def test_usage_sample_rejects_non_finite_allocated_fraction(bad: float) -> None:
    with pytest.raises(ValidationError):
        sample(allocated=bad)


def test_nan_in_json_payload_is_rejected() -> None:
    with pytest.raises(ValidationError):
        UsageSample.model_validate_json(as_json_with(sample(), compute=float("nan")))
    with pytest.raises(ValidationError):
        FractionDecision.model_validate_json(as_json_with(decision(), new_fraction=float("inf")))


@pytest.mark.parametrize("bad", NON_FINITE)
@pytest.mark.parametrize("field", ["new_fraction", "current_fraction"])
def test_decision_rejects_non_finite_fractions(field: str, bad: float) -> None:
    with pytest.raises(ValidationError):
        decision(**{field: bad})


@pytest.mark.parametrize("bad", NON_FINITE)
@pytest.mark.parametrize(
    "field",
    [
        "target_utilization",
        "compute_percentile",
        "compute_half_life_s",
        "memory_window_s",
        "memory_margin",
        "memory_min_headroom",
        "downsize_hold_s",
        "cooldown_s",
        "min_history_s",
        "signal_multiplier",
        "signal_hold_s",
        "max_fraction",
    ],
)
def test_policy_rejects_non_finite_numbers(field: str, bad: float) -> None:
    with pytest.raises(ValidationError):
        Policy(**{field: bad})


@pytest.mark.parametrize("bad", NON_FINITE)
def test_signals_reject_non_finite_kv_cache_usage(bad: float) -> None:
    with pytest.raises(ValidationError):
        AppSignals(kv_cache_usage=bad)


# --- ranges and cross-field rules ----------------------------------------------------------


@pytest.mark.parametrize("bad", [-0.01, -1.0, 1.0000001, 1.5, 2.0])
def test_compute_outside_unit_interval_is_rejected(bad: float) -> None:
    with pytest.raises(ValidationError):
        sample(compute=bad)


@pytest.mark.parametrize("ok", [0.0, 0.5, 1.0])
def test_compute_at_and_inside_bounds_is_accepted(ok: float) -> None:
    assert sample(compute=ok).compute == ok


@settings(max_examples=50, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_compute_accepted_iff_finite_share(value: float) -> None:
    valid = math.isfinite(value) and 0.0 <= value <= 1.0
    if valid:
        assert sample(compute=value).compute == value
    else:
        with pytest.raises(ValidationError):
            sample(compute=value)


@pytest.mark.parametrize("bad", [0.0, -0.125, 1.125])
def test_allocated_fraction_must_be_in_zero_exclusive_one_inclusive(bad: float) -> None:
    with pytest.raises(ValidationError):
        sample(allocated=bad)


def test_memory_used_above_device_memory_is_rejected() -> None:
    with pytest.raises(ValidationError, match="exceeds device memory"):
        sample(memory_used_bytes=80 * GIB + 1)


def test_memory_used_equal_to_device_memory_is_accepted() -> None:
    s = sample(memory_used_bytes=80 * GIB)
    assert s.memory_share == 1.0


def test_memory_share_is_used_over_total() -> None:
    s = sample(memory_used_bytes=20 * GIB)
    assert s.memory_share == pytest.approx(0.25)


def test_negative_memory_and_zero_device_memory_are_rejected() -> None:
    with pytest.raises(ValidationError):
        sample(memory_used_bytes=-1)
    with pytest.raises(ValidationError):
        sample(memory_used_bytes=0, memory_total_bytes=0)


def test_naive_datetime_is_rejected() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        sample(at=datetime(2026, 3, 2, 12, 0))
    with pytest.raises(ValidationError, match="timezone"):
        decision(decided_at=datetime(2026, 3, 2, 12, 0))
    body = as_json_with(sample(), timestamp="2026-03-02T12:00:00")
    with pytest.raises(ValidationError):
        UsageSample.model_validate_json(body)


def test_aware_datetime_is_normalised_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    s = sample(at=datetime(2026, 3, 2, 14, 0, tzinfo=plus_two))
    assert s.timestamp.utcoffset() == timedelta(0)
    assert s.timestamp == datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    assert s.timestamp.hour == 12


def test_decision_direction_must_match_fractions() -> None:
    assert decision(current=0.5, new=0.75).direction is Direction.UP
    assert decision(current=0.75, new=0.5).direction is Direction.DOWN
    with pytest.raises(ValidationError, match="contradicts"):
        decision(current=0.5, new=0.75, direction=Direction.DOWN)
    with pytest.raises(ValidationError, match="contradicts"):
        decision(current=0.75, new=0.5, direction=Direction.UP)


@pytest.mark.parametrize("direction", [Direction.UP, Direction.DOWN])
def test_decision_that_changes_nothing_is_rejected(direction: Direction) -> None:
    with pytest.raises(ValidationError, match="must change"):
        decision(current=0.5, new=0.5, direction=direction)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.25])
def test_decision_fraction_out_of_range_is_rejected(bad: float) -> None:
    with pytest.raises(ValidationError):
        decision(current=0.5, new=bad, direction=Direction.DOWN)


@pytest.mark.parametrize(
    ("level", "namespace", "wl", "key"),
    [
        (PolicyLevel.CLUSTER, None, None, "cluster"),
        (PolicyLevel.NAMESPACE, "inference", None, "namespace.inference"),
        (PolicyLevel.WORKLOAD, "inference", "chat", "workload.inference.chat"),
    ],
)
def test_policy_scope_consistent_levels_are_accepted(
    level: PolicyLevel, namespace: str | None, wl: str | None, key: str
) -> None:
    scope = PolicyScope(level=level, namespace=namespace, workload=wl)
    assert scope.key == key


@pytest.mark.parametrize(
    ("level", "namespace", "wl"),
    [
        (PolicyLevel.CLUSTER, "inference", None),
        (PolicyLevel.CLUSTER, None, "chat"),
        (PolicyLevel.CLUSTER, "inference", "chat"),
        (PolicyLevel.NAMESPACE, None, None),
        (PolicyLevel.NAMESPACE, "inference", "chat"),
        (PolicyLevel.NAMESPACE, None, "chat"),
        (PolicyLevel.WORKLOAD, None, None),
        (PolicyLevel.WORKLOAD, "inference", None),
        (PolicyLevel.WORKLOAD, None, "chat"),
    ],
)
def test_policy_scope_inconsistent_levels_are_rejected(
    level: PolicyLevel, namespace: str | None, wl: str | None
) -> None:
    with pytest.raises(ValidationError, match="needs"):
        PolicyScope(level=level, namespace=namespace, workload=wl)


def test_policy_min_above_max_is_rejected() -> None:
    with pytest.raises(ValidationError, match="above max_fraction"):
        Policy(min_fraction=0.5, max_fraction=0.25)


def test_policy_min_equal_to_max_is_accepted() -> None:
    p = Policy(min_fraction=0.5, max_fraction=0.5)
    assert (p.min_fraction, p.max_fraction) == (0.5, 0.5)


def test_policy_defaults_are_the_documented_ones() -> None:
    p = Policy()
    assert p.grid is GridKind.BACKEND
    assert p.grid_steps == 8  # used by grid steps only
    assert p.grid_levels == ()
    assert p.step == 0.01
    assert (p.min_fraction, p.max_fraction) == (0.1, 1.0)
    assert p.compute_sizing is ComputeSizing.SOFT
    assert p.compute_delay_budget == 0.015
    assert p.downsize_min_change == 0.1
    assert p.kv_cache_busy == 0.9
    assert p.queue_growth_samples == 3
    assert p.compute_percentile == 95.0
    assert p.target_utilization == 0.85
    assert p.compute_half_life_s == 6 * 3600
    assert p.compute_upsize_confirmations == 2
    assert p.memory_window_s == 24 * 3600
    assert p.memory_margin == 0.15
    assert p.memory_min_headroom == 0.1
    assert p.memory_upsize_confirmations == 1
    assert p.downsize_hold_s == 1800
    assert p.cooldown_s == 3 * 3600
    assert p.min_history_s == 1800
    assert p.signal_multiplier == 1.5
    assert p.signal_hold_s == 6 * 3600
    assert p.scope.level is PolicyLevel.CLUSTER
    assert p.mode is Mode.AUTO
    assert p.revision == 0
    assert p.isolation is MemoryIsolation.AUTO


def test_policy_fields_are_all_documented() -> None:
    for name, field in Policy.model_fields.items():
        if name not in ("schema_version", "scope"):
            assert field.description, name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"min_fraction": 0.125}, "min_fraction 0.125 is not on the grid of 1/100"),
        ({"max_fraction": 0.905}, "max_fraction 0.905 is not on the grid of 1/100"),
        ({"grid_steps": 8, "min_fraction": 0.2}, "min_fraction 0.2 is not on the grid of 1/8"),
        (
            {"grid_steps": 8, "min_fraction": 0.125, "max_fraction": 0.9},
            "max_fraction 0.9 is not on the grid of 1/8",
        ),
        ({"grid_steps": 4, "min_fraction": 0.25, "max_fraction": 0.875}, "max_fraction 0.875"),
        # The default min_fraction 0.1 is on a grid of tenths: a coarser grid needs a new min.
        ({"grid_steps": 8}, "min_fraction 0.1 is not on the grid of 1/8"),
        ({"grid_steps": 3, "min_fraction": 0.5}, "min_fraction 0.5 is not on the grid of 1/3"),
    ],
)
def test_policy_bounds_off_the_grid_are_rejected(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Policy(**overrides)
    body = json.loads(Policy().model_dump_json())
    body.update(overrides)
    if "grid_steps" in overrides:
        body["grid"] = "steps"
    with pytest.raises(ValidationError, match="not on the grid"):
        Policy.model_validate_json(json.dumps(body))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), steps=st.integers(1, 100))
def test_policy_bounds_on_any_grid_are_accepted(data: st.DataObject, steps: int) -> None:
    lo = data.draw(st.integers(1, steps))
    hi = data.draw(st.integers(lo, steps))
    p = Policy(grid_steps=steps, min_fraction=lo / steps, max_fraction=hi / steps)
    assert p.step == 1 / steps
    assert Policy.model_validate_json(p.to_json()) == p


def test_policy_bounds_tolerate_float_noise() -> None:
    p = Policy(grid_steps=10, min_fraction=0.1 + 0.2, max_fraction=0.7)  # 0.30000000000000004
    assert p.min_fraction == pytest.approx(0.3)


def test_policy_bounds_is_a_reason() -> None:
    assert ReasonCode.POLICY_BOUNDS.value == "policy_bounds"
    d = decision(current=1.0, new=0.5, reason=ReasonCode.POLICY_BOUNDS)
    assert FractionDecision.model_validate_json(d.to_json()).reason is ReasonCode.POLICY_BOUNDS


@pytest.mark.parametrize(
    "overrides",
    [
        {"grid_steps": 0},
        {"grid_steps": 101},
        {"target_utilization": 0.05},
        {"target_utilization": 1.01},
        {"compute_percentile": 0.0},
        {"compute_percentile": 100.5},
        {"compute_half_life_s": 0.0},
        {"compute_upsize_confirmations": 0},
        {"compute_upsize_confirmations": 21},
        {"memory_window_s": 0.0},
        {"memory_margin": -0.1},
        {"memory_margin": 4.5},
        {"memory_min_headroom": -0.01},
        {"memory_min_headroom": 1.5},
        {"memory_upsize_confirmations": 0},
        {"downsize_hold_s": -1.0},
        {"cooldown_s": -1.0},
        {"min_history_s": -1.0},
        {"signal_multiplier": 0.9},
        {"signal_multiplier": 8.5},
        {"signal_hold_s": -1.0},
        {"min_fraction": 0.0},
        {"max_fraction": 1.125},
        {"window_s": 3600.0},  # the old name is an unknown field now
    ],
)
def test_policy_out_of_range_settings_are_rejected(overrides: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Policy(**overrides)


def test_workload_key_and_display() -> None:
    wl = workload("chat", "inference")
    assert wl.key == "test/inference/Deployment/chat"
    assert wl.display == "inference/chat"
    assert workload("chat").key != workload("chat2").key


# --- JSON round trip -----------------------------------------------------------------------


def _allocation() -> Allocation:
    return Allocation(
        workload=workload(),
        pod="chat-0",
        node="node-a",
        gpu_uuid="GPU-a-0",
        fraction=0.375,
        device_memory_bytes=80 * GIB,
        updated_at=T0,
    )


ROUND_TRIP_MODELS: list[BaseModel] = [
    workload(),
    AppSignals(kv_cache_usage=0.42, waiting_requests=3, oom_event=True),
    sample(signals=AppSignals(contention_event=True)),
    sample(allocated=None, node="", gpu_uuid=""),
    decision(),
    decision(current=1.0, new=0.375, mode=Mode.RECOMMEND, trigger_sample_id="s-1"),
    ActuationResult(
        decision_id="d-1",
        workload=workload(),
        plan=PlanKind.RECREATE_ELSEWHERE,
        outcome=Outcome.APPLIED,
        fraction_before=0.25,
        fraction_after=0.5,
        node_before="a",
        node_after="b",
        gpu_before="GPU-a-0",
        gpu_after="GPU-b-0",
        detail="moved",
        finished_at=T0,
    ),
    PolicyScope(level=PolicyLevel.WORKLOAD, namespace="inference", workload="chat"),
    Policy(),
    Policy(
        scope=PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference"),
        revision=7,
        mode=Mode.RECOMMEND,
        grid_steps=10,
        min_fraction=0.1,
        max_fraction=0.9,
    ),
    PolicyReply(ok=True, policy=Policy(revision=3, mode=Mode.RECOMMEND)),
    PolicyReply(
        ok=True,
        policies=[
            Policy(),
            Policy(
                scope=PolicyScope(level=PolicyLevel.WORKLOAD, namespace="ns", workload="w"),
                grid_steps=4,
                min_fraction=0.25,
                max_fraction=0.75,
                compute_upsize_confirmations=3,
                signal_hold_s=0.0,
            ),
        ],
    ),
    PolicyReply(ok=False, error="min_fraction 0.2 is not on the grid of 1/8"),
    DeadLetter(
        service="decision",
        subject="fracpilot.usage.x",
        reason="bad",
        error_kind="validation",
        raw_payload='{"x": 1}',
        headers={"Nats-Msg-Id": "1"},
        received_at=T0,
    ),
    _allocation(),
]


@pytest.mark.parametrize("model", ROUND_TRIP_MODELS, ids=lambda m: type(m).__name__)
def test_json_round_trip(model: BaseModel) -> None:
    raw = model.to_json()  # type: ignore[attr-defined]
    assert isinstance(raw, bytes)
    back = type(model).model_validate_json(raw)
    assert back == model
    assert back.to_json() == raw  # type: ignore[attr-defined]


def test_round_trip_covers_every_wire_model() -> None:
    covered = {type(m) for m in ROUND_TRIP_MODELS}
    assert covered >= {
        WorkloadRef,
        AppSignals,
        UsageSample,
        FractionDecision,
        ActuationResult,
        PolicyScope,
        Policy,
        PolicyReply,
        DeadLetter,
        Allocation,
    }


@settings(max_examples=40, deadline=None)
@given(
    compute=st.floats(0.0, 1.0),
    memory_share=st.floats(0.0, 1.0),
    allocated=st.none() | st.floats(0.001, 1.0),
    minute=st.integers(0, 10_000),
)
def test_usage_sample_round_trip_property(
    compute: float, memory_share: float, allocated: float | None, minute: int
) -> None:
    s = sample(compute=compute, memory_share=memory_share, allocated=allocated, minute=minute)
    assert UsageSample.model_validate_json(s.to_json()) == s


def test_policy_reply_defaults_and_strictness() -> None:
    reply = PolicyReply(ok=True)
    assert (reply.policy, reply.policies, reply.error) == (None, [], None)
    with pytest.raises(ValidationError):
        PolicyReply(ok=True, surprise=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        PolicyReply.model_validate_json(b'{"policy": null}')  # ok is required


def test_policy_reply_rejects_an_invalid_policy_inside() -> None:
    body = json.loads(PolicyReply(ok=True, policy=Policy()).to_json())
    body["policy"]["min_fraction"] = 0.125
    with pytest.raises(ValidationError, match="not on the grid"):
        PolicyReply.model_validate_json(json.dumps(body))
    body = json.loads(PolicyReply(ok=True, policies=[Policy()]).to_json())
    body["policies"][0]["target_utilization"] = 2.0
    with pytest.raises(ValidationError):
        PolicyReply.model_validate_json(json.dumps(body))


@settings(max_examples=30, deadline=None)
@given(
    steps=st.sampled_from([1, 2, 4, 8, 10, 16, 100]),
    revision=st.integers(0, 10**6),
    confirmations=st.integers(1, 20),
    hold=st.floats(0.0, 1e7),
    error=st.none() | st.text(max_size=50),
)
def test_policy_reply_round_trip_property(
    steps: int, revision: int, confirmations: int, hold: float, error: str | None
) -> None:
    policy = Policy(
        revision=revision,
        grid_steps=steps,
        min_fraction=1 / steps,
        max_fraction=1.0,
        compute_upsize_confirmations=confirmations,
        signal_hold_s=hold,
    )
    reply = PolicyReply(ok=error is None, policy=policy, policies=[policy, Policy()], error=error)
    raw = reply.to_json()
    back = PolicyReply.model_validate_json(raw)
    assert back == reply
    assert back.to_json() == raw


def test_a_policy_written_before_the_grid_keeps_its_steps() -> None:
    old = {"grid_steps": 8, "min_fraction": 0.125, "max_fraction": 1.0}
    p = Policy.model_validate_json(json.dumps(old))
    assert p.grid is GridKind.STEPS
    assert p.step == 0.125
    assert Policy.model_validate_json(p.to_json()) == p  # the dump names its grid
    assert Policy(grid="backend", grid_steps=8).grid is GridKind.BACKEND


def test_levels_need_levels_ascending_and_bounds_among_them() -> None:
    levels = (0.125, 0.25, 0.5, 1.0)
    p = Policy(grid="levels", grid_levels=levels, min_fraction=0.125)
    assert p.step == 0.125
    with pytest.raises(ValidationError, match="needs grid_levels"):
        Policy(grid="levels", min_fraction=0.125)
    with pytest.raises(ValidationError, match="strictly ascending"):
        Policy(grid="levels", grid_levels=(0.25, 0.125, 1.0), min_fraction=0.125)
    with pytest.raises(ValidationError, match=r"min_fraction 0\.1 is not one of grid_levels"):
        Policy(grid="levels", grid_levels=levels)
    with pytest.raises(ValidationError):
        Policy(grid="levels", grid_levels=(0.0, 1.0), min_fraction=1.0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"compute_sizing": "sideways"},
        {"compute_delay_budget": 0.0},
        {"compute_delay_budget": 0.6},
        {"downsize_min_change": -0.1},
        {"kv_cache_busy": 1.5},
        {"queue_growth_samples": 0},
        {"grid": "mig"},
    ],
)
def test_new_policy_fields_refuse_bad_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Policy(**overrides)


# --- the decision's forecast and isolation ---------------------------------------------------


def test_a_decision_without_forecast_or_isolation_reads_as_unknown_and_detected() -> None:
    body = json.loads(decision().model_dump_json())
    del body["forecast"], body["isolation"]  # as a decision service before them wrote it
    old = FractionDecision.model_validate_json(json.dumps(body))
    assert old.forecast is None
    assert old.isolation is MemoryIsolation.AUTO


def test_a_decision_carries_its_forecast_over_the_wire() -> None:
    forecast = CardForecast(memory_peak=0.3, memory_jump=0.05, compute=0.2, burst=0.1)
    sent = decision(forecast=forecast, isolation=MemoryIsolation.SHARED)
    got = FractionDecision.model_validate_json(sent.to_json())
    assert got.forecast == forecast
    assert got.isolation is MemoryIsolation.SHARED


PROFILE = PeakProfile(period_s=3600.0, first=100, last=124, peaks=((100, 0.2), (103, 0.45)))


def test_a_forecast_carries_its_peak_profile_over_the_wire() -> None:
    forecast = CardForecast(memory_peak=0.45, memory_jump=0.05, compute=0.2, profile=PROFILE)
    got = FractionDecision.model_validate_json(decision(forecast=forecast).to_json())
    assert got.forecast is not None
    assert got.forecast.profile == PROFILE
    body = json.loads(decision(forecast=forecast).to_json())
    del body["forecast"]["profile"]  # as a decision service before profiles wrote it
    old = FractionDecision.model_validate_json(json.dumps(body))
    assert old.forecast is not None
    assert old.forecast.profile is None


def test_profiles_are_bounded_to_the_engines_window() -> None:
    assert PROFILE_MAX_PERIODS == 2 * MEMORY_SLOTS  # contracts import no sizing: tied here


@pytest.mark.parametrize(
    "change",
    [
        {"peaks": ((103, 0.45), (100, 0.2))},  # periods out of order
        {"peaks": ((100, 0.2), (100, 0.3))},  # a period twice
        {"peaks": ((99, 0.2),)},  # before the window it covers
        {"peaks": ((125, 0.2),)},  # after it
        {"peaks": ((100, 1.01),)},  # more than the card
        {"peaks": ((100, -0.01),)},
        *({"peaks": ((100, bad),)} for bad in NON_FINITE),
        {"first": 125},  # an empty window
        {"last": 100 + PROFILE_MAX_PERIODS},  # too long a window
        {"period_s": 0.0},
        {"period_s": math.inf},
        {"first": -1},
    ],
)
def test_a_profile_out_of_shape_is_refused(change: dict[str, object]) -> None:
    values = {**PROFILE.model_dump(), **change}
    with pytest.raises(ValidationError):
        PeakProfile.model_validate(values)
    payload = as_json_with(
        decision(),
        forecast={"memory_peak": 0.3, "memory_jump": 0.05, "compute": 0.2, "profile": values},
    )
    with pytest.raises(ValidationError):
        FractionDecision.model_validate_json(payload)


def test_a_profile_of_the_longest_window_is_accepted() -> None:
    last = 100 + PROFILE_MAX_PERIODS - 1
    peaks = tuple((k, 0.5) for k in range(100, last + 1))
    assert len(PeakProfile(period_s=3600.0, first=100, last=last, peaks=peaks).peaks) == 48


@pytest.mark.parametrize("field", ["memory_peak", "memory_jump", "compute", "burst"])
@pytest.mark.parametrize("bad", [-0.01, 1.01, *NON_FINITE])
def test_a_forecast_holds_shares_of_a_card(field: str, bad: float) -> None:
    values = {"memory_peak": 0.3, "memory_jump": 0.05, "compute": 0.2, field: bad}
    with pytest.raises(ValidationError):
        CardForecast(**values)
    payload = as_json_with(decision(), forecast={**values, field: 0.5})
    assert FractionDecision.model_validate_json(payload).forecast is not None
    with pytest.raises(ValidationError):
        FractionDecision.model_validate_json(
            as_json_with(decision(), forecast={**values, "unknown": 0.1})
        )
