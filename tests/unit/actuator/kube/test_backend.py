"""The Kubernetes backend wired to in-memory stores and a recording API: what it writes where.

The API here answers from fixed objects and records each write; the stores are the fakes of
:mod:`fracpilot_actuator.stores.memory`. The real API server is in tests/integration/k8s.
"""

from __future__ import annotations

import asyncio

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.settings import EvictionSettings
from fracpilot_libs.contracts import FractionDecision, GpuSharing, Outcome, PlanKind, WorkloadTarget
from fracpilot_libs.nats import subjects
from support.kube_objects import MEM_MIB, hami, kai, node, reservation
from support.recording_kube import NOW, OWNER, UUID_A, RecordingApi, backend_for, grow


def test_in_place_records_the_target_then_patches_and_publishes_the_allocation() -> None:
    pods = [kai(f"chat-{i}", "0.25", group="g1", owner=OWNER) for i in range(2)]
    api = RecordingApi([node("n1", gpus=1)], [reservation("g1", UUID_A), *pods])
    backend, targets, allocations, history = backend_for(api)

    async def run() -> Actuation:
        await backend.start(NOW)
        return await backend.actuate(grow(0.25, 0.38), dry_run="", now=NOW)

    result = asyncio.run(run())
    assert (result.plan, result.outcome, result.fraction_after) == (
        PlanKind.IN_PLACE,
        Outcome.APPLIED,
        0.38,  # hundredths, as KAI's GPU_PORTION ("%.2f") holds it
    )
    target = targets.targets[subjects.kv_key(grow(0.25, 0.38).workload)]
    # gpu-memory KAI counts as 0.38: the label floored to 100 MiB (kube/kai.py)
    assert (target.fraction, target.memory_mib) == (0.38, round(0.38 * (MEM_MIB // 100 * 100)))
    assert [w for w in api.writes if w[0] == "patch"] == [("patch", "chat-0"), ("patch", "chat-1")]
    assert [a.pod for a in allocations.allocations.values()] == ["chat-0"]
    assert history.saves == 0  # nothing disruptive
    assert not backend.guards.in_flight


def test_a_disruption_is_recorded_before_the_eviction_and_a_refusal_fails_the_action() -> None:
    pods = [hami(f"chat-{i}", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER) for i in range(2)]
    api = RecordingApi([node("n1", gpus=1)], pods)
    api.refuse_evictions = True
    backend, targets, allocations, history = backend_for(
        api,
        guardrails=GuardrailSettings(allow_single_replica=True),
        eviction=EvictionSettings(attempts=1),
    )
    result = asyncio.run(backend.actuate(grow(0.1, 0.2), dry_run="", now=NOW))
    assert (result.plan, result.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED)
    assert result.error == "eviction of inference/chat-0 failed (403): forbidden"
    assert history.saves == 2  # recorded before the eviction, taken back after the refusal
    assert history.recent == ()
    assert len(targets.targets) == 1  # recorded first, whatever happens to the pods
    assert allocations.allocations == {}
    assert ("event:FractionEvictionFailed", "chat-0") in api.writes


def test_a_dry_run_writes_nothing() -> None:
    pods = [kai("chat-0", "0.25", group="g1", owner=OWNER)]
    api = RecordingApi([node("n1", gpus=1)], [reservation("g1", UUID_A), *pods])
    backend, targets, allocations, history = backend_for(api)
    result = asyncio.run(backend.actuate(grow(0.25, 0.375), dry_run="dry-run", now=NOW))
    assert result.outcome is Outcome.DRY_RUN
    assert (api.writes, targets.targets, allocations.allocations, history.saves) == ([], {}, {}, 0)


def test_a_resumed_decision_whose_target_was_recorded_skips_the_guardrails() -> None:
    pods = [hami("chat-0", f"{UUID_A},NVIDIA,8192,0:;", owner=OWNER)]
    api = RecordingApi([node("n1", gpus=1)], pods)
    backend, targets, _, history = backend_for(api)
    made = grow(0.1, 0.2)
    fresh = asyncio.run(backend.actuate(made, dry_run="", now=NOW))
    assert fresh.detail.startswith("single_replica: ")  # one replica: not recreated
    asyncio.run(targets.put(backend_target(made)))
    resumed = asyncio.run(backend.actuate(made, dry_run="", now=NOW, resumed=True))
    # Evicted: PENDING until the replacement is bound (test_verified_results.py).
    assert (resumed.plan, resumed.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
    assert "resumed: target recorded; chat-0 evicted" in resumed.detail
    assert ("evict", "chat-0") in api.writes
    assert history.saves == 1


def backend_target(made: FractionDecision) -> WorkloadTarget:
    return WorkloadTarget(
        workload=made.workload,
        fraction=made.new_fraction,
        memory_mib=made.new_memory_mib,
        backend=GpuSharing.HAMI,
        decision_id=made.decision_id,
        updated_at=NOW,
    )
