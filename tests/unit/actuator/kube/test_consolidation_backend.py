"""Consolidation's imperative part in the backend's reconcile, on a recording API (no server):
the mark, the eviction, make before break, and the mark taken off when done or given up.

(The real thing, with KAI and cluster-autoscaler: tests/integration/gpu_stack/
test_consolidation_on_kai.py.)
"""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any, cast

from prometheus_client import CollectorRegistry

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.consolidation_round import MARK_REASON, MARK_TAINT
from fracpilot_actuator.kube.errors import PermanentKubeError, TransientKubeError
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.metrics import ConsolidationMetrics
from fracpilot_actuator.settings import ConsolidationSettings, EvictionSettings
from fracpilot_actuator.stores.memory import MemoryConsolidationProgress, MemoryTargetStore
from fracpilot_libs.contracts import (
    CardForecast,
    ConsolidationMode,
    ConsolidationMove,
    ConsolidationReport,
    FractionDecision,
    MoveState,
    WireModel,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from support.kube_objects import node, pod, reservation
from support.recording_kube import AUTO, NOW, RecordingApi

UUID_A, UUID_B = "GPU-a", "GPU-b"


def chat(name: str, node_name: str, group: str) -> dict[str, Any]:
    return pod(
        name,
        node_name=node_name,
        annotations={"gpu-fraction": "0.25"},
        labels={"runai-gpu-group": group, "app": "chat"},
        owner=("ReplicaSet", "chat-rs"),
    )


class ClusterApi(RecordingApi):
    """RecordingApi with the calls consolidation adds: PDBs, and node patches applied."""

    def __init__(self, allowed: int = 1) -> None:
        super().__init__(
            [node("n1"), node("n2")],
            [
                reservation("g1", UUID_A, "n1"),
                reservation("g2", UUID_B, "n2"),
                chat("chat-0", "n1", "g1"),
                chat("chat-1", "n2", "g2"),
            ],
        )
        self.pdbs = [
            {
                "metadata": {"name": "chat", "namespace": "inference"},
                "spec": {"selector": {"matchLabels": {"app": "chat"}}},
                "status": {"disruptionsAllowed": allowed},
            }
        ]
        self.node_events: list[str] = []
        self.node_lists = 0

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.node_lists += 1
        return copy.deepcopy(self.nodes)

    async def list_disruption_budgets(self) -> list[dict[str, Any]]:
        return self.pdbs

    async def patch_node(self, name: str, patch: dict[str, Any]) -> int | None:
        self.writes.append(("patch_node", name))
        [stored] = [n for n in self.nodes if n["metadata"]["name"] == name]
        notes = stored["metadata"].setdefault("annotations", {})
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        stored.setdefault("spec", {})["taints"] = patch["spec"]["taints"]
        return None

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        await super().create_event(namespace, body)
        if body["involvedObject"]["kind"] == "Node":
            self.node_events.append(f"{body['reason']}: {body['message']}")

    def taints(self, name: str) -> list[str]:
        [stored] = [n for n in self.nodes if n["metadata"]["name"] == name]
        return [t["key"] for t in (stored.get("spec") or {}).get("taints") or ()]


class Published(list[tuple[str, WireModel]]):
    """What consolidation published, in order (the bus's publish as the backend calls it)."""

    async def __call__(self, subject: str, message: WireModel) -> bool:
        self.append((subject, message))
        return True

    def moves(self) -> list[ConsolidationMove]:
        return [m for _, m in self if isinstance(m, ConsolidationMove)]

    def reports(self) -> list[ConsolidationReport]:
        return [m for _, m in self if isinstance(m, ConsolidationReport)]


def backend_on(
    api: ClusterApi,
    mode: str = "auto",
    published: Published | None = None,
    progress: MemoryConsolidationProgress | None = None,
    **limits: Any,
) -> tuple[KubernetesBackend, CollectorRegistry]:
    async def report(_decision: FractionDecision, _actuation: Actuation) -> None:
        return None

    registry = CollectorRegistry()
    settings = KubeBackendSettings(
        cluster="test",
        inventory_cache=False,
        opt_in=AUTO,
        eviction=EvictionSettings(attempts=1, backoff_s=0.01, backoff_max_s=0.01),
        guardrails=GuardrailSettings(),
        consolidation=ConsolidationSettings(
            mode=mode,  # type: ignore[arg-type]
            interval_s=1,
            move_timeout_s=60,
            **limits,
        ),
    )
    backend = KubernetesBackend(
        cast(KubeApi, api),
        MemoryTargetStore(),
        settings,
        report,
        instance="unit",
        consolidation_metrics=ConsolidationMetrics(registry),
        consolidation_events=published,
        consolidation_progress=progress,
    )
    return backend, registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_recommend_mode_publishes_what_it_would_free_and_writes_nothing() -> None:
    api = ClusterApi()
    backend, registry = backend_on(api, mode="recommend")
    asyncio.run(backend.reconcile(NOW))
    assert value(registry, "fracpilot_consolidation_would_free_gpus") == 1
    assert value(registry, "fracpilot_consolidation_would_free_nodes") == 1
    assert api.writes == []
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=0.5)))  # within interval_s
    assert api.node_lists == 1  # no node being emptied: the cluster is read once an interval
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=1)))
    assert api.node_lists == 2


def test_a_node_is_marked_its_pod_moved_make_before_break_then_the_mark_comes_off() -> None:
    api = ClusterApi()
    backend, registry = backend_on(api)
    asyncio.run(backend.reconcile(NOW))
    assert api.taints("n1") == [MARK_TAINT]
    assert "autoscaler can remove it" in api.nodes[0]["metadata"]["annotations"][MARK_REASON]
    assert api.writes == [
        ("patch_node", "n1"),
        ("event:ConsolidationStarted", "n1"),
        ("event:ConsolidationMove", "chat-0"),
        ("evict", "chat-0"),
    ]
    assert backend.guards.in_flight  # the workload is busy until the replacement is bound
    # no replacement yet: nothing else happens (the next move would wait for it)
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=5)))
    assert len(api.writes) == 4
    lists = api.node_lists
    asyncio.run(
        backend.reconcile(NOW + timedelta(seconds=5.1))
    )  # a move in flight: checked at every call
    assert api.node_lists == lists + 1
    api.pods.append(chat("chat-2", "n2", "g2"))  # the ReplicaSet's new pod, bound by KAI
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    assert api.writes[4:] == [
        ("event:ConsolidationMoveVerified", "chat-2"),
        ("patch_node", "n1"),
        ("event:ConsolidationDone", "n1"),
    ]
    assert api.taints("n1") == []
    assert MARK_REASON not in api.nodes[0]["metadata"]["annotations"]
    assert value(registry, "fracpilot_consolidation_moves_total", result="verified") == 1
    assert value(registry, "fracpilot_consolidation_freed_nodes_total") == 1
    assert value(registry, "fracpilot_consolidation_freed_gpus_total") == 2
    assert not backend.guards.in_flight
    assert len(backend.guards.recent) == 1  # the move counted in the disruption budget


def test_a_refused_eviction_gives_the_node_up_and_takes_the_mark_off() -> None:
    api = ClusterApi()
    api.refuse_evictions = True
    api.refusal = TransientKubeError("(429)", status=429, message="disruption budget")
    backend, registry = backend_on(api)
    asyncio.run(backend.reconcile(NOW))
    assert ("evict", "chat-0") in api.writes
    assert api.taints("n1") == []
    assert api.node_events[-1].startswith("ConsolidationAbandoned: ")
    assert "eviction of inference/chat-0 refused" in api.node_events[-1]
    assert value(registry, "fracpilot_consolidation_moves_total", result="failed") == 1


def test_a_replacement_not_bound_in_time_gives_the_node_up() -> None:
    api = ClusterApi()
    backend, registry = backend_on(api)
    asyncio.run(backend.reconcile(NOW))
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=61)))
    assert api.taints("n1") == []
    assert "no replacement of inference/chat-0 bound within 60 s" in api.node_events[-1]
    assert value(registry, "fracpilot_consolidation_moves_total", result="failed") == 1
    assert not backend.guards.in_flight


def test_the_disruption_budget_holds_a_move_back() -> None:
    api = ClusterApi()
    backend, _ = backend_on(api)
    backend.settings = KubeBackendSettings(
        **{**backend.settings.__dict__, "guardrails": GuardrailSettings(max_disruptions=0)}
    )
    asyncio.run(backend.reconcile(NOW))
    assert ("evict", "chat-0") not in api.writes
    assert api.taints("n1") == [MARK_TAINT]  # marked; the move waits for the budget


def test_recommend_mode_reports_its_plan_once_until_it_changes() -> None:
    api = ClusterApi()
    published = Published()
    backend, _ = backend_on(api, mode="recommend", published=published)
    asyncio.run(backend.reconcile(NOW))
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=1)))  # the same plan: not again
    [(subject, report)] = published
    assert subject == subjects.consolidation_report_subject("test")
    assert isinstance(report, ConsolidationReport)
    assert report.mode is ConsolidationMode.RECOMMEND
    assert (report.would_free_gpus, report.would_free_nodes, report.move_count) == (1, 1, 1)
    [move] = report.moves
    assert (move.pod, move.from_node, move.to_node, move.fraction) == (
        "inference/chat-0",
        "n1",
        "n2",
        0.25,
    )
    assert (move.from_gpu, move.to_gpu) == (UUID_A, UUID_B)
    api.pdbs[0]["status"]["disruptionsAllowed"] = 0  # now nothing may move: a new summary
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=2)))
    last = published.reports()[-1]
    assert (len(published), last.would_free_nodes, last.refused_count) == (
        2,
        0,
        4,
    )  # 2 nodes, 2 cards
    assert "disruption" in last.refused[0].reason.lower()


def test_auto_mode_publishes_each_move_and_the_node_freed() -> None:
    api = ClusterApi()
    published = Published()
    backend, _ = backend_on(api, published=published)
    asyncio.run(backend.reconcile(NOW))
    [report] = published.reports()
    assert (report.mode, report.node) == (ConsolidationMode.AUTO, "n1")
    api.pods.append(chat("chat-2", "n2", "g2"))  # the ReplicaSet's new pod, bound by KAI
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    moves = published.moves()
    assert [m.state for m in moves] == [MoveState.STARTED, MoveState.VERIFIED, MoveState.FREED]
    started, verified, freed = moves
    assert started.move is not None
    assert started.move.pod == "inference/chat-0"
    assert (verified.new_pod, verified.to_node) == ("chat-2", "n2")
    assert (freed.freed_node, freed.freed_gpus, freed.move) == ("n1", 2, None)
    assert all(s == subjects.consolidation_move_subject("test") for s, m in published if m in moves)


def test_a_refused_eviction_is_published_as_failed_then_abandoned() -> None:
    api = ClusterApi()
    api.refuse_evictions = True
    api.refusal = TransientKubeError("(429)", status=429, message="disruption budget")
    published = Published()
    backend, _ = backend_on(api, published=published)
    asyncio.run(backend.reconcile(NOW))
    assert [m.state for m in published.moves()] == [
        MoveState.STARTED,  # announced before the eviction (written ahead for a new leader)
        MoveState.FAILED,
        MoveState.ABANDONED,
    ]
    assert "refused" in published.moves()[1].detail


# --- a single card: node n1 keeps a pod, its GPU A is emptied onto GPU B -----------------------


class OneNodeApi(ClusterApi):
    def __init__(self) -> None:
        super().__init__()
        self.nodes = [node("n1")]
        self.pods = [
            reservation("g1", UUID_A, "n1"),
            reservation("g2", UUID_B, "n1"),
            chat("chat-0", "n1", "g1"),
            chat("chat-1", "n1", "g2"),
        ]


def test_a_card_is_emptied_without_a_taint_and_its_move_verified_on_the_predicted_gpu() -> None:
    api = OneNodeApi()
    published = Published()
    backend, registry = backend_on(api, published=published)
    asyncio.run(backend.reconcile(NOW))
    assert api.taints("n1") == []  # a card carries no mark
    assert api.writes == [
        ("event:ConsolidationCardStarted", "n1"),
        ("event:ConsolidationMove", "chat-0"),
        ("evict", "chat-0"),
    ]
    assert "empties GPU GPU-a on node n1" in api.node_events[0]
    api.pods.append(chat("chat-2", "n1", "g2"))  # KAI binds the replacement on GPU B
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    assert api.writes[3:] == [
        ("event:ConsolidationMoveVerified", "chat-2"),
        ("event:ConsolidationCardDone", "n1"),
    ]
    moves = published.moves()
    assert [m.state for m in moves] == [MoveState.STARTED, MoveState.VERIFIED, MoveState.FREED]
    assert "bound on n1, GPU GPU-b (as predicted)" in moves[1].detail
    assert (moves[2].node, moves[2].freed_node, moves[2].freed_gpus) == ("n1", "", 1)
    assert value(registry, "fracpilot_consolidation_freed_gpus_total") == 1
    assert value(registry, "fracpilot_consolidation_freed_nodes_total") == 0
    assert backend.consolidation.card == ""


def test_a_card_move_that_kai_did_not_place_as_predicted_gives_the_card_up() -> None:
    api = OneNodeApi()
    published = Published()
    backend, _ = backend_on(api, published=published)
    asyncio.run(backend.reconcile(NOW))
    api.pods.append(chat("chat-2", "n1", "g1"))  # back onto GPU A, the card being emptied
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=10)))
    assert [m.state for m in published.moves()] == [
        MoveState.STARTED,
        MoveState.VERIFIED,
        MoveState.ABANDONED,
    ]
    assert api.node_events[-1].startswith("ConsolidationCardAbandoned: ")
    assert "not GPU-b as predicted" in api.node_events[-1]
    assert backend.consolidation.card == ""


def test_a_new_leader_resumes_the_card_and_verifies_the_move_in_flight() -> None:
    api = OneNodeApi()
    store = MemoryConsolidationProgress()
    published = Published()
    first, _ = backend_on(api, published=published, progress=store)
    asyncio.run(first.reconcile(NOW))
    assert '"card": "GPU-a"' in store.text
    assert '"move": {' in store.text
    second, _ = backend_on(api, published=published, progress=store)
    asyncio.run(second.resume(NOW + timedelta(seconds=5)))
    assert second.consolidation.card == UUID_A
    assert second.consolidation.move is not None
    assert len(second.consolidation.moves) == 1  # the rate limit's count goes on
    assert second.guards.in_flight  # the moving workload stays busy under the new leader
    api.pods.append(chat("chat-2", "n1", "g2"))
    asyncio.run(second.reconcile(NOW + timedelta(seconds=10)))
    assert [m.state for m in published.moves()] == [
        MoveState.STARTED,
        MoveState.VERIFIED,
        MoveState.FREED,
    ]
    assert api.writes.count(("evict", "chat-0")) == 1  # not re-planned: nothing evicted twice
    assert store.text == ""  # nothing in flight any more


def test_a_new_leader_gives_up_what_no_longer_matches_the_cluster() -> None:
    api = ClusterApi()
    store = MemoryConsolidationProgress()
    first, _ = backend_on(api, progress=store)
    asyncio.run(first.reconcile(NOW))  # n1 marked, chat-0 evicted
    api.nodes[0]["spec"]["taints"] = []  # someone takes the mark off
    published = Published()
    second, _ = backend_on(api, published=published, progress=store)
    asyncio.run(second.resume(NOW + timedelta(seconds=5)))
    assert (second.consolidation.marked, second.consolidation.move) == ("", None)
    [abandoned] = published.moves()
    assert abandoned.state is MoveState.ABANDONED
    assert "no longer carries the mark" in abandoned.detail
    assert store.text == ""


def big(fraction: str, owner: tuple[str, str] = ("ReplicaSet", "big-rs")) -> dict[str, Any]:
    """big-0, a tenant of GPU B (group g2) on n1."""
    return pod(
        "big-0",
        node_name="n1",
        annotations={"gpu-fraction": fraction},
        labels={"runai-gpu-group": "g2", "app": "big"},
        owner=owner,
    )


def decide_on(replica_set: str, forecast: CardForecast) -> FractionDecision:
    """A decision for the pods of a ReplicaSet with no Deployment above it, with a forecast."""
    ref = WorkloadRef(
        cluster="test", namespace="inference", owner_kind="ReplicaSet", owner_name=replica_set
    )
    return decision(0.8, 0.4, workload=ref, forecast=forecast, decided_at=NOW)


def test_a_shrink_is_patched_in_place_read_back_and_explained_before_the_move() -> None:
    api = OneNodeApi()  # GPU B: chat-1 (0.25) and big-0 (0.6); 0.15 free, chat-0 needs 0.25
    api.pods.append(big("0.6"))
    backend, registry = backend_on(api)
    backend.cards.book.record(
        decide_on("big-rs", CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3))
    )
    asyncio.run(backend.reconcile(NOW))
    assert api.writes == [
        ("event:ConsolidationCardStarted", "n1"),
        ("patch", "big-0"),
        ("event:FractionRedivided", "big-0"),
    ]
    [stored] = [p for p in api.pods if p["metadata"]["name"] == "big-0"]
    shrunk = float(stored["metadata"]["annotations"]["gpu-fraction"])
    assert 0.3 <= shrunk <= 0.5  # its predicted need at least; room for chat-0
    assert ("evict", "chat-0") not in api.writes  # the move waits for the next round
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=1)))
    assert api.writes[3:] == [("event:ConsolidationMove", "chat-0"), ("evict", "chat-0")]
    assert value(registry, "fracpilot_consolidation_moves_total", result="verified") == 0


def test_a_shrink_refused_gives_the_card_up() -> None:
    api = OneNodeApi()
    api.pods[3] = big("0.8")
    api.refuse_patches = PermanentKubeError("(403)", status=403, message="forbidden")
    backend, _ = backend_on(api)
    backend.cards.book.record(
        decide_on("big-rs", CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3))
    )
    asyncio.run(backend.reconcile(NOW))
    assert ("evict", "chat-0") not in api.writes
    assert api.node_events[-1].startswith("ConsolidationCardAbandoned: ")
    assert "consolidation shrink of " in api.node_events[-1]
    assert backend.consolidation.card == ""


class CronJobApi(OneNodeApi):
    """OneNodeApi with a CronJob's pod (big-0 of Job big-29001) sharing GPU B, and the owner
    lists counted."""

    def __init__(self) -> None:
        super().__init__()
        self.pods.append(big("0.6", owner=("Job", "big-29001")))
        self.owner_lists: list[str] = []

    async def list_owners(self, namespace: str) -> tuple[list[Any], list[Any]]:
        self.owner_lists.append(namespace)
        job = {
            "metadata": {
                "name": "big-29001",
                "namespace": namespace,
                "ownerReferences": [{"kind": "CronJob", "name": "big", "controller": True}],
            }
        }
        return [], [job]


def test_a_job_owned_pod_gets_its_cronjobs_forecast_from_one_owner_read_a_round() -> None:
    """The forecast of CronJob big's decision reaches its Job's pod (it shrinks in place to
    make room); without the inventory cache the owners are listed once a round, per namespace
    (with it, not at all: tests/integration/k8s/test_kube_backend.py)."""
    api = CronJobApi()
    backend, _ = backend_on(api)
    ref = WorkloadRef(cluster="test", namespace="inference", owner_kind="CronJob", owner_name="big")
    forecast = CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3)
    backend.cards.book.record(decision(0.6, 0.4, workload=ref, forecast=forecast, decided_at=NOW))
    asyncio.run(backend.reconcile(NOW))
    assert ("patch", "big-0") in api.writes  # shrunk: it had its forecast
    assert api.owner_lists == ["inference"]
    asyncio.run(backend.reconcile(NOW + timedelta(seconds=1)))
    assert api.writes[-2:] == [("event:ConsolidationMove", "chat-0"), ("evict", "chat-0")]
    assert api.owner_lists == ["inference", "inference"]  # the forecasts and the move: one read
