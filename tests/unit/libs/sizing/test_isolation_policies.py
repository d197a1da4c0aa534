"""The policy an engine sizes with under a memory-isolation mode: enforced isolation's learned
headroom and resize budget where the policy leaves them to the mode, the same in the decision
service (LivePolicies) and in the enforced replay; and the population prior it starts from."""

from __future__ import annotations

from datetime import timedelta

from factories import T0, sample, workload
from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.packing_replay import replay_packed
from fracpilot_libs.analysis.trace import TracePoint
from fracpilot_libs.contracts import (
    MemoryHeadroom,
    MemoryHeadroomMode,
    MemoryIsolation,
    Policy,
    PolicyLevel,
    PolicyScope,
)
from fracpilot_libs.placement.card_budget import Isolation
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.isolation_policies import (
    ENFORCED_HEADROOM,
    MODE_RESIZE_BUDGET,
    engine_prior,
    sizing_policy,
)
from fracpilot_libs.sizing.policies import LivePolicies
from fracpilot_libs.sizing.state import WorkloadState

NAMESPACE = PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference")
ENFORCED = MemoryIsolation.ENFORCED


def test_an_enforced_policy_sizes_with_the_modes_headroom_and_budget_where_it_sets_none() -> None:
    sized = sizing_policy(Policy(isolation=ENFORCED, max_fraction=0.8))
    assert sized.memory_headroom == ENFORCED_HEADROOM
    assert sized.resize_budget_per_day == MODE_RESIZE_BUDGET
    assert sized.max_fraction == 0.8  # the rest as the policy says
    own = MemoryHeadroom(mode=MemoryHeadroomMode.LEARNED, floor=0.08)
    kept = sizing_policy(Policy(isolation=ENFORCED, memory_headroom=own, resize_budget_per_day=2.0))
    assert kept.memory_headroom == own
    assert kept.resize_budget_per_day == 2.0
    assert sizing_policy(sized) == sized  # applying it again changes nothing
    # As stored (KV, FractionPolicy): the JSON writes every field, the built-in values say
    # the user chose nothing.
    stored = Policy.model_validate_json(Policy(isolation=ENFORCED).to_json())
    assert sizing_policy(stored).memory_headroom == ENFORCED_HEADROOM
    assert sizing_policy(stored).resize_budget_per_day == MODE_RESIZE_BUDGET


def test_auto_and_shared_policies_size_as_they_are() -> None:
    for isolation in (MemoryIsolation.AUTO, MemoryIsolation.SHARED):
        policy = Policy(isolation=isolation)
        assert sizing_policy(policy) is policy


def test_live_policies_resolve_to_the_sizing_policy_and_keep_the_stored_one() -> None:
    live = LivePolicies(Policy())
    stored = Policy(scope=NAMESPACE, isolation=ENFORCED)
    live.apply(NAMESPACE.key, stored)
    chat, other = workload("chat"), workload("chat", namespace="batch")
    assert live.for_workload(chat) == sizing_policy(stored)
    assert live.for_workload(chat).memory_headroom == ENFORCED_HEADROOM
    assert live.stored[NAMESPACE.key] is stored  # what `policy get` shows
    assert live.for_workload(other) is live.default
    live.apply(NAMESPACE.key, None)
    assert live.for_workload(chat) is live.default
    live.default = Policy(isolation=ENFORCED)  # a cluster default of the mode is sized too
    assert live.for_workload(chat).memory_headroom == ENFORCED_HEADROOM


def test_the_prior_is_a_quantile_of_the_warm_workloads_jumps() -> None:
    policy = sizing_policy(Policy(isolation=ENFORCED))
    warm = policy.memory_headroom.warmup
    jumps = [(0.0, 0.02), (0.0, 0.04), (0.0, 0.06), (0.0, 0.08), (warm, 0.5)]
    assert engine_prior(jumps, warm - 1, policy) is None  # none warm yet: the uniform rule
    # The fifth has no history yet at `warm`: the 75th percentile of the first four.
    assert engine_prior(jumps, warm, policy) == 0.08
    assert engine_prior(jumps, 2 * warm, policy) == 0.08  # 0.75 x 5 -> index 3 of 5
    assert engine_prior(jumps, warm, policy, quantile=0.0) == 0.02


def _sized(points: list[TracePoint], policy: Policy) -> tuple[int, float]:
    """Resizes and the final fraction of one engine under ``policy``, each sample at the
    fraction held."""
    state, held, resizes = WorkloadState(), 1.0, 0
    for p in points:
        at_held = p.sample.model_copy(update={"allocated_fraction": held})
        state, decision = decide(state, at_held, policy)
        if decision is not None:
            held, resizes = decision.new_fraction, resizes + 1
    return resizes, held


def test_the_enforced_replay_sizes_with_the_sizing_policy() -> None:
    """The enforced replay and an engine under sizing_policy decide alike (one workload: no
    population, so no prior); a jump of 0.2 in the first hours makes the learned headroom
    upsize at the end of the warm-up, which the uniform rule does not."""
    points = [
        TracePoint(
            sample=sample(
                compute=0.05,
                memory_share=0.3 + (0.2 if 200 <= m < 210 else 0.0),
                at=T0 + timedelta(minutes=m),
                allocated=None,
            ),
            requested_fraction=None,
            isolation=None,
        )
        for m in range(0, 600)
    ]
    report = replay_packed(
        {points[0].sample.workload.key: points},
        EngineSizer(Policy()),  # as `fracpilot replay --pack --isolation enforced` gives it
        isolation=Isolation.ENFORCED,
    )
    resizes, held = _sized(points, sizing_policy(Policy(isolation=ENFORCED)))
    assert (report.replay.totals.resizes, report.replay.workloads[0].final_fraction) == (
        resizes,
        held,
    )
    assert (resizes, held) != _sized(points, Policy())  # the mode's headroom made a difference
