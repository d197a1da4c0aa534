"""The Kubernetes backend wired to in-memory stores and a recording API: what it writes where.

The API here answers from fixed objects and records each write; the stores are the fakes of
:mod:`fracpilot_actuator.stores.memory`. The real API server is in tests/integration/k8s.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.errors import PermanentKubeError
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.settings import EvictionSettings, OptInSettings
from fracpilot_actuator.stores.memory import (
    MemoryAllocationStore,
    MemoryDisruptionHistory,
    MemoryTargetStore,
)
from fracpilot_libs.contracts import FractionDecision, GpuSharing, Outcome, PlanKind, WorkloadTarget
from fracpilot_libs.nats import subjects
from support.kube_objects import MEM_MIB, T0, hami, kai, node, reservation

UUID_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = ("Deployment", "chat")
NOW = T0 + timedelta(minutes=6)
AUTO = OptInSettings(default_mode="auto")  # this cluster opts every namespace in


class RecordingApi:
    """The calls the backend makes, answered from ``pods`` and ``nodes``; writes recorded."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.writes: list[tuple[str, str]] = []
        self.refuse_evictions = False

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.nodes

    async def list_pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [] if label_selector else self.pods

    async def list_owners(self, namespace: str) -> tuple[list[Any], list[Any]]:
        return [], []

    async def read_owner(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "namespace": namespace}}

    async def patch_pod_annotations(self, namespace: str, name: str, _: Any) -> int:
        self.writes.append(("patch", name))
        return 2

    async def evict(self, namespace: str, name: str) -> None:
        self.writes.append(("evict", name))
        if self.refuse_evictions:
            raise PermanentKubeError("(403)", status=403, message="forbidden")

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.writes.append(("event:" + str(body["reason"]), str(body["involvedObject"]["name"])))


def backend_for(
    api: RecordingApi, **settings: Any
) -> tuple[KubernetesBackend, MemoryTargetStore, MemoryAllocationStore, MemoryDisruptionHistory]:
    targets, allocations, history = (
        MemoryTargetStore(),
        MemoryAllocationStore(),
        MemoryDisruptionHistory(),
    )

    async def report(_decision: FractionDecision, _actuation: Actuation) -> None:
        return None

    backend = KubernetesBackend(
        cast(KubeApi, api),
        targets,
        KubeBackendSettings(cluster="test", inventory_cache=False, opt_in=AUTO, **settings),
        report,
        instance="unit",
        allocations=allocations,
        history=history,
    )
    return backend, targets, allocations, history


def grow(current: float, new: float) -> FractionDecision:
    return decision(current, new, name="chat", decided_at=T0 + timedelta(minutes=5))


def test_in_place_records_the_target_then_patches_and_publishes_the_allocation() -> None:
    pods = [kai(f"chat-{i}", "0.25", group="g1", owner=OWNER) for i in range(2)]
    api = RecordingApi([node("n1", gpus=1)], [reservation("g1", UUID_A), *pods])
    backend, targets, allocations, history = backend_for(api)

    async def run() -> Actuation:
        await backend.start()
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
    assert history.saves == 1
    assert history.recent is not None
    assert [d.workload for d in history.recent] == [grow(0.1, 0.2).workload.key]
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
    assert (resumed.plan, resumed.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.APPLIED)
    assert resumed.detail.endswith("resumed: target recorded; chat-0 evicted")
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
