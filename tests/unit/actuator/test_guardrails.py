"""Guardrails: opt-out, stale, in flight, single replica, rate limits; the order they run in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_actuator.guardrails import (
    Disruption,
    GuardrailSettings,
    GuardState,
    Subject,
    check,
    in_flight,
    opt_out,
    rate,
    single_replica,
    stale,
)

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
LIMITS = GuardrailSettings(
    max_disruptions=3, max_disruptions_per_namespace=2, window_s=600, allow_single_replica=False
)


def subject(**changes: object) -> Subject:
    fields: dict[str, object] = {
        "workload": "test/inference/Deployment/chat",
        "namespace": "inference",
        "decided_at": T0,
        "last_change": T0 - timedelta(hours=1),
        "replicas": 2,
    }
    fields.update(changes)
    return Subject(**fields)  # type: ignore[arg-type]


def acted(*actions: tuple[str, float]) -> GuardState:
    """A state with disruptive actions (namespace, seconds before T0)."""
    state = GuardState()
    for namespace, ago in sorted(actions, key=lambda a: -a[1]):
        state = state.record(
            Disruption(f"w/{namespace}/{ago}", namespace, T0 - timedelta(seconds=ago)), 1e9
        )
    return state


# --- each guard ----------------------------------------------------------------------------------


def test_opt_out_denies_and_names_where_it_was_set() -> None:
    verdict = opt_out(subject(opted_out_by="pod inference/chat-0"))
    assert not verdict.allowed
    assert "pod inference/chat-0" in verdict.reason
    assert opt_out(subject()).allowed


def test_a_decision_older_than_the_last_change_is_stale() -> None:
    changed = T0 + timedelta(seconds=1)
    verdict = stale(subject(last_change=changed))
    assert not verdict.allowed
    assert verdict.guard == "stale"
    assert changed.isoformat() in verdict.reason


@pytest.mark.parametrize("last_change", [T0, T0 - timedelta(seconds=1), None])
def test_a_decision_made_at_or_after_the_last_change_is_current(
    last_change: datetime | None,
) -> None:
    assert stale(subject(last_change=last_change)).allowed


def test_in_flight_from_memory_and_from_the_cluster() -> None:
    busy_state = GuardState().begin("test/inference/Deployment/chat")
    assert not in_flight(subject(), busy_state).allowed
    assert in_flight(subject(), busy_state.end("test/inference/Deployment/chat")).allowed
    seen = in_flight(subject(busy="pod chat-0 is terminating"), GuardState())
    assert not seen.allowed
    assert "chat-0 is terminating" in seen.reason
    # Another workload in flight does not hold this one back.
    assert in_flight(subject(), GuardState().begin("test/inference/Deployment/other")).allowed


def test_single_replica_only_when_allowed() -> None:
    assert not single_replica(subject(replicas=1), LIMITS).allowed
    allowing = GuardrailSettings(allow_single_replica=True)
    assert single_replica(subject(replicas=1), allowing).allowed
    assert single_replica(subject(replicas=2), LIMITS).allowed


def test_rate_limit_cluster_wide() -> None:
    state = acted(("a", 10), ("b", 20))
    assert rate(subject(namespace="c"), state, LIMITS, T0).allowed
    full = acted(("a", 10), ("b", 20), ("d", 30))
    verdict = rate(subject(namespace="c"), full, LIMITS, T0)
    assert not verdict.allowed
    assert "cluster-wide limit 3" in verdict.reason


def test_rate_limit_per_namespace() -> None:
    state = acted(("inference", 10), ("inference", 20))
    verdict = rate(subject(namespace="inference"), state, LIMITS, T0)
    assert not verdict.allowed
    assert "namespace inference" in verdict.reason
    assert rate(subject(namespace="batch"), state, LIMITS, T0).allowed


def test_actions_older_than_the_window_are_forgotten() -> None:
    state = acted(("inference", 601), ("inference", 700), ("x", 900), ("y", 1000))
    assert rate(subject(), state, LIMITS, T0).allowed
    assert state.pruned(T0, 600).recent == ()
    just_inside = acted(("inference", 599), ("inference", 10))
    assert not rate(subject(), just_inside, LIMITS, T0).allowed


def test_zero_allows_no_disruption() -> None:
    none = GuardrailSettings(max_disruptions=0)
    assert not rate(subject(), GuardState(), none, T0).allowed


# --- the chain -----------------------------------------------------------------------------------


def test_first_denial_wins_in_order() -> None:
    everything_wrong = subject(
        opted_out_by="Deployment inference/chat",
        last_change=T0 + timedelta(hours=1),
        busy="pod chat-0 is terminating",
        replicas=1,
    )
    full = acted(("inference", 1), ("inference", 2), ("x", 3))
    kwargs = {"disruptive": True, "state": full, "settings": LIMITS, "now": T0}
    assert check(everything_wrong, **kwargs).guard == "opt_out"  # type: ignore[arg-type]
    no_opt_out = subject(last_change=T0 + timedelta(hours=1), busy="x", replicas=1)
    assert check(no_opt_out, **kwargs).guard == "stale"  # type: ignore[arg-type]
    assert check(subject(busy="x", replicas=1), **kwargs).guard == "in_flight"  # type: ignore[arg-type]
    assert check(subject(replicas=1), **kwargs).guard == "single_replica"  # type: ignore[arg-type]
    assert check(subject(), **kwargs).guard == "rate"  # type: ignore[arg-type]


def test_non_disruptive_plans_skip_the_replica_and_rate_guards() -> None:
    full = acted(("inference", 1), ("inference", 2), ("x", 3))
    verdict = check(subject(replicas=1), disruptive=False, state=full, settings=LIMITS, now=T0)
    assert verdict.allowed
    assert verdict.reason == "checked opt_out, stale, in_flight"
    allowed = check(subject(), disruptive=True, state=GuardState(), settings=LIMITS, now=T0)
    assert allowed.allowed
    assert "rate" in allowed.reason


def test_guard_state_is_immutable() -> None:
    state = GuardState()
    state.begin("w").record(Disruption("w", "ns", T0), 600)
    assert state == GuardState()


# --- property: the limits hold over any stream of attempts ---------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    attempts=st.lists(
        st.tuples(st.floats(0, 3600, allow_nan=False), st.sampled_from(["a", "b", "c"])),
        max_size=60,
    ),
    max_total=st.integers(0, 5),
    max_per_ns=st.integers(0, 3),
    window=st.floats(1, 900, allow_nan=False),
)
def test_no_window_ever_holds_more_than_the_limits(
    attempts: list[tuple[float, str]], max_total: int, max_per_ns: int, window: float
) -> None:
    limits = GuardrailSettings(
        max_disruptions=max_total, max_disruptions_per_namespace=max_per_ns, window_s=window
    )
    state, done = GuardState(), []
    for offset, namespace in sorted(attempts):
        now = T0 + timedelta(seconds=offset)
        wanted = subject(namespace=namespace, workload=f"w-{offset}")
        if check(wanted, disruptive=True, state=state, settings=limits, now=now).allowed:
            state = state.record(Disruption(wanted.workload, namespace, now), window)
            done.append((now, namespace))
    for end, _ in done:  # every window that ends at an action
        inside = [(t, ns) for t, ns in done if end - timedelta(seconds=window) < t <= end]
        assert len(inside) <= max_total
        for namespace in "abc":
            assert sum(1 for _, ns in inside if ns == namespace) <= max_per_ns
