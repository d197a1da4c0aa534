"""The decision service's inputs, fuzzed: usage samples that are valid but extreme, policy
get/set payloads, and the engine checkpoints it reads back from KV.

A valid sample, however extreme (a device of 1 byte or 10^30 bytes, timestamps from year 1 to
9999, in any order), and any valid policy must be decided without an exception: an exception
would have the sample redelivered and finally dead-lettered, and the workload's next samples
with it. A checkpoint either loads (and then decides like any state) or is refused with
ValueError (counted as corrupt and skipped).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import strategies as st

from factories import sample, workload
from fracpilot_libs.contracts import AppSignals, Policy, PolicyScope, UsageSample
from fracpilot_libs.nats.bus import DecodeError, decode
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.policies import parse_scope, scope_problem
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state, state_json
from support.fuzzing import JSON_VALUES, examples_per_subject, junk_payloads, run_property

TIMES = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
SHARE = st.floats(min_value=0.0, max_value=1.0)
FRACTION = st.floats(min_value=5e-324, max_value=1.0)


@st.composite
def extreme_samples(draw: st.DrawFn) -> UsageSample:
    total = draw(st.one_of(st.integers(1, 2**64), st.sampled_from([1, 2, 10**30, 2**1023])))
    used = draw(st.integers(0, total))
    signals = draw(
        st.none()
        | st.builds(
            AppSignals,
            kv_cache_usage=st.none() | SHARE,
            waiting_requests=st.none() | st.integers(0, 2**63),
            oom_event=st.booleans(),
            contention_event=st.booleans(),
        )
    )
    return sample(
        at=draw(TIMES),
        allocated=draw(st.none() | FRACTION),
        compute=draw(SHARE),
        memory_used_bytes=used,
        memory_total_bytes=total,
        signals=signals,
    )


@st.composite
def valid_policies(draw: st.DrawFn) -> Policy:
    steps = draw(st.integers(1, 100))
    low = draw(st.integers(1, steps))
    high = draw(st.integers(low, steps))
    return Policy(
        grid_steps=steps,
        min_fraction=low / steps,
        max_fraction=high / steps,
        compute_percentile=draw(st.floats(min_value=1e-9, max_value=100.0)),
        target_utilization=draw(st.floats(min_value=0.0500001, max_value=1.0)),
        compute_half_life_s=draw(st.floats(min_value=1e-6, max_value=1e12)),
        compute_upsize_confirmations=draw(st.integers(1, 20)),
        memory_window_s=draw(st.floats(min_value=1e-6, max_value=1e12)),
        memory_margin=draw(st.floats(min_value=0.0, max_value=4.0)),
        memory_min_headroom=draw(SHARE),
        memory_upsize_confirmations=draw(st.integers(1, 20)),
        downsize_hold_s=draw(st.floats(min_value=0.0, max_value=1e12)),
        cooldown_s=draw(st.floats(min_value=0.0, max_value=1e12)),
        min_history_s=draw(st.floats(min_value=0.0, max_value=1e12)),
        signal_multiplier=draw(st.floats(min_value=1.0, max_value=8.0)),
        signal_hold_s=draw(st.floats(min_value=0.0, max_value=1e12)),
    )


def test_extreme_valid_samples_are_decided_without_an_exception() -> None:
    def check(case: tuple[Policy, list[UsageSample]]) -> None:
        policy, samples = case
        state = WorkloadState()
        for s in samples:
            state, decision = decide(state, s, policy)
            if decision is not None:  # what it publishes is a valid message
                assert policy.min_fraction - 1e-9 <= decision.new_fraction <= 1.0
        assert load_state(dump_state(state)) == state  # its checkpoint loads back

    strategy = st.tuples(valid_policies(), st.lists(extreme_samples(), min_size=1, max_size=6))
    assert run_property(strategy, check) >= examples_per_subject()


def test_checkpoints_load_or_are_refused_and_what_loads_can_be_decided_on() -> None:
    state = WorkloadState()
    for minute in range(30):
        state, _ = decide(state, sample(minute=minute, compute=0.7, memory_share=0.4), Policy())
    valid = json.loads(state_json(state))

    mutated = st.tuples(st.sampled_from(sorted(valid)), JSON_VALUES).map(
        lambda p: json.dumps({**valid, p[0]: p[1]}, allow_nan=True).encode()
    )
    numbers = st.tuples(
        st.sampled_from(sorted(valid)),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(),
    ).map(lambda p: json.dumps({**valid, p[0]: p[1]}, allow_nan=True).encode())
    outcomes = {"loaded": 0, "refused": 0}

    def check(data: bytes) -> None:
        refusal: ValueError | None = None
        try:
            loaded = load_state(data)
        except ValueError as exc:
            refusal = exc
        if refusal is not None:
            assert str(refusal)
            outcomes["refused"] += 1
            return
        outcomes["loaded"] += 1
        after, _ = decide(loaded, sample(minute=31, compute=0.2), Policy())
        assert load_state(dump_state(after)) == after

    junk = st.one_of(
        mutated,
        numbers,
        st.binary(max_size=512),
        JSON_VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    )
    assert run_property(junk, check) >= examples_per_subject()
    assert outcomes["refused"] > 0


def test_policy_requests_are_answered_or_refused_with_a_reason() -> None:
    """The endpoint's pure part: a set payload is a valid Policy whose scope names a KV key,
    or refused; a get payload is a scope (or a workload), or refused."""
    base = Policy(scope=PolicyScope(level="workload", namespace="inference", workload="chat"))
    payloads = st.one_of(
        junk_payloads(base),
        junk_payloads(base.scope),
        junk_payloads(workload()),
        st.just(b""),
        st.just(b"   "),
    )

    reasons: list[str] = []

    def check(data: bytes) -> None:
        for parse in (lambda d: decode(Policy, d).scope, parse_scope):
            try:
                scope = parse(data)
            except DecodeError as exc:
                reasons.append(exc.reason)
                continue
            problem = scope_problem(scope)
            if problem is None:  # accepted: the scope is a usable KV key
                assert scope.key
                assert not scope.key.startswith(".")
                assert not scope.key.endswith(".")
                assert ".." not in scope.key

    assert run_property(payloads, check) >= examples_per_subject()
    assert reasons
    assert all(r.strip() for r in reasons)
