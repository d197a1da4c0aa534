"""Issue 26: a recreate waiting for its replacement survives a restart (each test fails on the
code before it, which kept the waiting recreates in memory only).

A second backend over the first one's stores (:class:`MemoryPendingRecreates`, the disruption
history) and the same recording API plays the restarted actuator, or the new leader.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.errors import PermanentKubeError
from fracpilot_actuator.kube.object_values import CAPACITY_ROLE, ROLE
from fracpilot_actuator.kube.placeholders import DECISION, FOR_POD
from fracpilot_actuator.kube.verification import (
    PendingRecreate,
    recreate_from_record,
    recreate_record,
)
from fracpilot_actuator.stores.memory import MemoryDisruptionHistory, MemoryPendingRecreates
from fracpilot_libs.contracts import FractionDecision, Outcome, PlanKind
from fracpilot_libs.placement.planner import ResizePlan
from support.kube_objects import kai, node, reservation
from support.recording_kube import NOW, OWNER, UUID_A, RecordingApi, backend_for, grow

UUID_B = "GPU-11111111-2222-3333-4444-555555555555"
SAFE = GuardrailSettings(allow_single_replica=True)


class PlaceholderApi(RecordingApi):
    """Lists placeholder pods by their label too (the backend's resume asks for them)."""

    async def list_pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        if label_selector is None:
            return await super().list_pods()
        key, value = label_selector.split("=")
        return [p for p in self.pods if (p["metadata"].get("labels") or {}).get(key) == value]


def cluster() -> PlaceholderApi:
    """chat-0 and chat-1 at 0.5 on n1's one GPU, an empty n2: 0.75 means a recreate."""
    pods = [kai(f"chat-{i}", "0.5", group="g1", owner=OWNER) for i in range(2)]
    return PlaceholderApi(
        [node("n1", gpus=1), node("n2", gpus=1)], [reservation("g1", UUID_A), *pods]
    )


def reporting(backend: KubernetesBackend) -> list[Actuation]:
    reported: list[Actuation] = []

    async def report(_decision: FractionDecision, actuation: Actuation) -> None:
        reported.append(actuation)

    backend.report = report
    return reported


def replacement(api: RecordingApi, fraction: str = "0.75") -> None:
    """The ReplicaSet's new pod, sized by the webhook, bound by KAI on n2."""
    api.pods.append(reservation("g2", UUID_B, node_name="n2"))
    api.pods.append(kai("chat-0-new", fraction, group="g2", owner=OWNER, node_name="n2"))


def test_a_recreate_is_saved_at_the_eviction_and_verified_after_a_restart() -> None:
    api, saved, history = cluster(), MemoryPendingRecreates(), MemoryDisruptionHistory()
    made = grow(0.5, 0.75)
    first, *_ = backend_for(api, pending_recreates=saved, history=history, guardrails=SAFE)
    evicted = asyncio.run(first.actuate(made, dry_run="", now=NOW))
    assert (evicted.plan, evicted.outcome) == (PlanKind.RECREATE_ELSEWHERE, Outcome.PENDING)
    assert list(saved.records) == [made.workload.key]

    # The actuator stops before the replacement exists; a new one starts.
    restarted, *_ = backend_for(api, pending_recreates=saved, history=history, guardrails=SAFE)
    reported = reporting(restarted)
    asyncio.run(restarted.start(NOW + timedelta(seconds=2)))
    assert list(restarted.recreates) == [made.workload.key]
    assert made.workload.key in restarted.guards.in_flight  # no second decision meanwhile
    replacement(api)
    asyncio.run(restarted.reconcile(NOW + timedelta(seconds=10)))
    [done] = reported
    assert (done.outcome, done.stage) == (Outcome.APPLIED, "verified")
    assert (done.node_after, done.gpu_after, done.fraction_after) == ("n2", UUID_B, 0.75)
    assert "chat-0 evicted" in done.detail  # the notes of the run that evicted
    assert saved.records == {}  # forgotten once the final result is out
    assert not restarted.recreates
    assert not restarted.guards.in_flight


def test_a_timed_out_recreate_is_forgotten_after_its_failed_result() -> None:
    api, saved = cluster(), MemoryPendingRecreates()
    backend, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE, verify_timeout_s=60)
    reported = reporting(backend)
    asyncio.run(backend.actuate(grow(0.5, 0.75), dry_run="", now=NOW))
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=61)))
    [failed] = reported
    assert failed.outcome is Outcome.FAILED
    assert saved.records == {}


def test_a_failed_report_keeps_the_record_so_a_restart_publishes_it() -> None:
    api, saved = cluster(), MemoryPendingRecreates()
    backend, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE)
    asyncio.run(backend.actuate(grow(0.5, 0.75), dry_run="", now=NOW))

    async def bus_down(_decision: FractionDecision, _actuation: Actuation) -> None:
        raise ConnectionError("NATS is down")

    backend.report = bus_down
    replacement(api)
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))  # logged, tried again later
    assert list(saved.records) == [grow(0.5, 0.75).workload.key]
    assert backend.recreates  # and in this process too


def test_a_scale_ups_recreate_keeps_its_placeholder_and_is_not_taken_for_a_scale_up() -> None:
    """Its pods were evicted once capacity came; the placeholder holds the new GPU until the
    replacement is bound. A restart must verify it, not plan the scale-up again."""
    api, saved = cluster(), MemoryPendingRecreates()
    made = grow(0.5, 0.75)
    api.pods = [p for p in api.pods if p["metadata"]["name"] != "chat-0"]  # evicted
    placeholder = {
        "metadata": {
            "name": "fracpilot-capacity-abc",
            "namespace": "inference",
            "uid": "uid-placeholder",
            "resourceVersion": "1",
            "labels": {ROLE: CAPACITY_ROLE},
            "annotations": {DECISION: made.model_dump_json(), FOR_POD: "chat-0"},
        },
        "spec": {"nodeName": "n2", "containers": []},
        "status": {"phase": "Running"},
    }
    api.pods.append(placeholder)
    step = ResizePlan(
        kind=PlanKind.SCALE_UP,
        workload=made.workload,
        fraction_before=0.5,
        fraction_after=0.75,
        gpu_before=UUID_A,
        reason="test",
        pod="chat-0",
    )
    left = PendingRecreate(
        decision=made,
        kind=PlanKind.SCALE_UP,
        step=step,
        node_before="n1",
        evicted=1,
        known_uids=frozenset({"uid-chat-0", "uid-chat-1"}),
        started_at=NOW,
        placeholders={"chat-0": ("inference", "fracpilot-capacity-abc")},
        notes=["capacity appeared on n2; chat-0 evicted"],
    )
    saved.records[made.workload.key] = recreate_record(left)
    backend, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE)
    reported = reporting(backend)
    asyncio.run(backend.start(NOW + timedelta(seconds=2)))
    assert not backend.pending  # the placeholder belongs to the waiting recreate
    assert list(backend.recreates) == [made.workload.key]
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=3)))
    assert reported == []
    assert ("delete", "fracpilot-capacity-abc") not in api.writes  # make before break
    replacement(api)
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    [done] = reported
    assert (done.plan, done.outcome, done.node_after) == (PlanKind.SCALE_UP, Outcome.APPLIED, "n2")
    assert ("delete", "fracpilot-capacity-abc") in api.writes
    assert saved.records == {}


def test_a_new_leader_drops_what_it_read_as_a_standby() -> None:
    """A standby read the records at its start; the leader finished that recreate since."""
    api, saved = cluster(), MemoryPendingRecreates()
    made = grow(0.5, 0.75)
    leader, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE)
    standby, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE)
    asyncio.run(leader.actuate(made, dry_run="", now=NOW))
    asyncio.run(standby.start(NOW))
    assert list(standby.recreates) == [made.workload.key]
    reporting(leader)
    replacement(api)
    asyncio.run(leader.reconcile(NOW + timedelta(seconds=10)))
    assert saved.records == {}
    reported = reporting(standby)
    asyncio.run(standby.resume(NOW + timedelta(seconds=20)))  # it leads now
    assert not standby.recreates
    assert not standby.guards.in_flight
    asyncio.run(standby.reconcile(NOW + timedelta(seconds=21)))
    assert reported == []  # the leader's final result is not published twice


def test_an_unreadable_record_is_dropped_and_the_others_are_resumed() -> None:
    api = cluster()
    made = grow(0.5, 0.75)
    first, *_ = backend_for(api, guardrails=SAFE)
    asyncio.run(first.actuate(made, dry_run="", now=NOW))
    record = recreate_record(first.recreates[made.workload.key])
    saved = MemoryPendingRecreates({"broken": json.dumps({"decision": "?"}), "ok": record})
    backend, *_ = backend_for(api, pending_recreates=saved, guardrails=SAFE)
    asyncio.run(backend.start(NOW))
    assert list(backend.recreates) == ["ok"]


def test_a_record_reads_back_as_the_recreate_it_was() -> None:
    api = cluster()
    backend, *_ = backend_for(api, guardrails=SAFE)
    made = grow(0.5, 0.75)
    asyncio.run(backend.actuate(made, dry_run="", now=NOW))
    waiting = backend.recreates[made.workload.key]
    waiting.placeholders["chat-0"] = ("inference", "fracpilot-capacity-abc")
    waiting.corrections = 1
    assert recreate_from_record(recreate_record(waiting)) == waiting


class ScaleAdjustForbidden(PlaceholderApi):
    """The actuator's RBAC: pods in kai-scale-adjust may be read, not deleted."""

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.writes.append(("delete", name))
        if namespace == "kai-scale-adjust":
            raise PermanentKubeError("(403)", status=403, message="pods is forbidden")


def test_a_stuck_scaling_pod_it_may_not_delete_is_left_said_once_and_named() -> None:
    api = ScaleAdjustForbidden(cluster().nodes, cluster().pods)
    backend, *_ = backend_for(api, guardrails=SAFE, verify_timeout_s=60)
    reported = reporting(backend)
    asyncio.run(backend.actuate(grow(0.5, 0.75), dry_run="", now=NOW))
    api.pods.append(kai("chat-0-new", "0.75", group="g2", owner=OWNER, node_name=None))
    stuck = kai("inference-chat-0-new", "1", namespace="kai-scale-adjust", node_name="n2")
    stuck["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    api.pods.append(stuck)
    for second in (1, 2, 3):
        asyncio.run(backend.reconcile(NOW + timedelta(seconds=second)))
    assert api.writes.count(("delete", "inference-chat-0-new")) == 1  # asked once only
    assert reported == []  # still waiting, no exception each poll
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=61)))
    [failed] = reported
    assert failed.outcome is Outcome.FAILED
    assert "kai-scale-adjust/inference-chat-0-new not deleted: forbidden" in failed.detail
