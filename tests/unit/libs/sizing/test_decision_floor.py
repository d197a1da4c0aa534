"""Every decision carries the engine's memory floor (peak + headroom, MiB) and the policy's
enforcement mode: the actuator downsizes in place only where the floor fits the new share."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import sample, v1_policy
from fracpilot_libs.contracts import MIB, EnforcementMode, FractionDecision
from fracpilot_libs.sizing.engine import decide, memory_need_of, need_of
from fracpilot_libs.sizing.state import WorkloadState


def decisions(
    memory: float, compute: float, enforcement: EnforcementMode
) -> list[tuple[WorkloadState, FractionDecision]]:
    policy = v1_policy(enforcement=enforcement)
    state, made = WorkloadState(), []
    for minute in range(0, 6 * 60, 5):
        s = sample(compute, memory, minute=minute, allocated=state.current_fraction or 0.5)
        state, decision = decide(state, s, policy)
        if decision is not None:
            made.append((state, decision))
    return made


@settings(max_examples=25, deadline=None)
@given(
    memory=st.floats(0.01, 0.6),
    compute=st.floats(0.0, 0.9),
    enforcement=st.sampled_from(list(EnforcementMode)),
)
def test_each_decision_carries_the_memory_floor_under_its_new_fraction(
    memory: float, compute: float, enforcement: EnforcementMode
) -> None:
    policy = v1_policy(enforcement=enforcement)
    for state, d in decisions(memory, compute, enforcement):
        assert d.enforcement is enforcement
        assert d.memory_need_mib is not None
        floor = need_of(state, policy).memory_need
        assert d.memory_need_mib == math.ceil(floor * d.device_memory_bytes / MIB - 1e-9)
        # The engine never sizes below its floor (within the policy's bounds).
        if floor <= policy.max_fraction:
            assert d.memory_need_mib * MIB <= d.new_fraction * d.device_memory_bytes + MIB


def test_the_floor_is_the_peak_plus_headroom() -> None:
    [(_, d), *_] = decisions(0.6, 0.05, EnforcementMode.NEXT_RESTART)  # an upsize at once
    expected = memory_need_of(0.6, v1_policy())
    assert abs(d.memory_need_mib * MIB / d.device_memory_bytes - expected) < 1e-3  # type: ignore[operator]
