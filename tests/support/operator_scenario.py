"""A recorded fleet for the operator commands' tests: what the services would have published.

Each workload's usage is a function of the minute; the real decision engine (the pure
``decide``) sizes it sample by sample with the recorded policy, and a decision is answered by
the result the spec says (applied decisions change the fraction from the next sample on, as
the simulated cluster does). The recording keeps every sample, decision and result, the final
allocation and the engine's state of each workload, and the actuator's consolidation in auto
mode (:func:`consolidation_history`: a node freed, a node given up, the plan left, all "today"
by the wall clock); :func:`publish` puts them on a real NATS where the services would have: the
usage, decisions, actuations and consolidation streams, the allocations, decision-state and
policies buckets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from factories import v1_policy
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    ConsolidationMode,
    ConsolidationMove,
    ConsolidationRefusal,
    ConsolidationReport,
    FractionDecision,
    MoveState,
    Outcome,
    PlanKind,
    PlannedMove,
    Policy,
    PolicyLevel,
    PolicyScope,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.usage_batch import encode_samples
from fracpilot_libs.sizing.checkpoint_groups import dump_group, group_key
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState, dump_state

GIB = 1024**3
DEVICE = 80 * GIB
GPU_MODEL = "NVIDIA A100-SXM4-80GB"  # priced 3.40 USD per hour by the built-in table
T0 = datetime(2026, 3, 2, tzinfo=UTC)  # the samples' clock, as in the demo: not the wall clock

Usage = Callable[[int], tuple[float, float]]  # minute -> (compute, memory share)
# The actuator's answer to the n-th decision: (plan, outcome, detail, error), one per stage
Answer = Callable[[int, FractionDecision], list[tuple[PlanKind, Outcome, str, str | None]]]


def applied_in_place(
    _n: int, d: FractionDecision
) -> list[tuple[PlanKind, Outcome, str, str | None]]:
    return [
        (
            PlanKind.IN_PLACE,
            Outcome.APPLIED,
            f"fits on its GPU; {d.pod} resized in place to {d.new_fraction:g}",
            None,
        )
    ]


@dataclass
class WorkloadSpec:
    name: str
    namespace: str
    initial: float
    minutes: int
    usage: Usage
    answer: Answer = applied_in_place
    engine: bool = True  # False: the engine has no state for it (a sample and allocation only)

    @property
    def ref(self) -> WorkloadRef:
        return WorkloadRef(cluster="test", namespace=self.namespace, owner_name=self.name)


@dataclass
class Recording:
    policy: Policy
    samples: list[UsageSample] = field(default_factory=list)
    decisions: list[FractionDecision] = field(default_factory=list)
    results: list[ActuationResult] = field(default_factory=list)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    states: dict[str, WorkloadState] = field(default_factory=dict)
    consolidation: list[ConsolidationReport | ConsolidationMove] = field(default_factory=list)

    def of(
        self, name: str
    ) -> tuple[list[UsageSample], list[FractionDecision], list[ActuationResult]]:
        return (
            [s for s in self.samples if s.workload.owner_name == name],
            [d for d in self.decisions if d.workload.owner_name == name],
            [r for r in self.results if r.workload.owner_name == name],
        )


def record(specs: list[WorkloadSpec], policy: Policy) -> Recording:
    rec = Recording(policy)
    for spec in specs:
        ref, held, state = spec.ref, spec.initial, WorkloadState()
        pod = f"{spec.name}-0"
        for minute in range(spec.minutes):
            at = T0 + timedelta(minutes=minute)
            compute, memory = spec.usage(minute)
            sample = UsageSample(
                sample_id=f"rec|{ref.key}|{minute}",
                workload=ref,
                pod=pod,
                node="node-a",
                gpu_uuid="GPU-a-0",
                gpu_model=GPU_MODEL,
                timestamp=at,
                compute=compute,
                memory_used_bytes=int(memory * DEVICE),
                memory_total_bytes=DEVICE,
                allocated_fraction=held,
                source="recording",
            )
            rec.samples.append(sample)
            if not spec.engine:
                continue
            state, decision = decide(state, sample, policy)
            if decision is None:
                continue
            n = sum(d.workload == ref for d in rec.decisions)
            rec.decisions.append(decision)
            for stage, (plan, outcome, detail, error) in enumerate(spec.answer(n, decision)):
                applied = outcome is Outcome.APPLIED
                rec.results.append(
                    ActuationResult(
                        decision_id=decision.decision_id,
                        workload=ref,
                        plan=plan,
                        outcome=outcome,
                        fraction_before=held,
                        fraction_after=decision.new_fraction if applied else held,
                        node_before="node-a",
                        node_after="node-b" if plan is PlanKind.SCALE_UP else "node-a",
                        gpu_before="GPU-a-0",
                        gpu_after="GPU-b-0" if plan is PlanKind.SCALE_UP else "GPU-a-0",
                        detail=detail,
                        error=error,
                        finished_at=at + timedelta(seconds=5 + stage),
                    )
                )
            if any(o is Outcome.APPLIED for _, o, _, _ in spec.answer(n, decision)):
                held = decision.new_fraction
        rec.allocations[subjects.kv_key(ref)] = Allocation(
            workload=ref,
            pod=pod,
            node="node-a",
            gpu_uuid="GPU-a-0",
            fraction=held,
            device_memory_bytes=DEVICE,
            updated_at=T0 + timedelta(minutes=spec.minutes),
        )
        if spec.engine:
            rec.states[subjects.kv_key(ref)] = state
    rec.consolidation = consolidation_history(datetime.now(UTC))
    return rec


def _planned(name: str, fraction: float, source: str, target: str, frees: str) -> PlannedMove:
    return PlannedMove(
        pod=f"inference/{name}-0",
        workload=WorkloadRef(cluster="test", namespace="inference", owner_name=name),
        fraction=fraction,
        from_node=source.split("/")[0],
        from_gpu=source.split("/")[1],
        to_node=target.split("/")[0],
        to_gpu=target.split("/")[1],
        frees="node" if frees.startswith("node") else "gpu",
        frees_name=frees,
    )


def consolidation_history(now: datetime) -> list[ConsolidationReport | ConsolidationMove]:
    """The actuator's consolidation in auto mode, in publishing order, in the last minute (not
    before midnight: "today"): a plan to empty node-a (chat and embed to node-b, node-c refused
    by a PDB); both moves verified and node-a freed (2 GPUs); a move off node-c that failed and
    node-c given up; then the plan left: translate within node-b, freeing one card."""
    start = max(now - timedelta(seconds=60), now.replace(hour=0, minute=0, second=0, microsecond=0))
    chat = _planned("chat", 0.25, "node-a/GPU-a-0", "node-b/GPU-b-0", "node-a")
    embed = _planned("embed", 0.5, "node-a/GPU-a-1", "node-b/GPU-b-0", "node-a")
    search = _planned("search", 0.5, "node-c/GPU-c-0", "node-b/GPU-b-1", "node-c")
    translate = _planned("translate", 0.5, "node-b/GPU-b-1", "node-b/GPU-b-0", "GPU-b-1")

    def at(second: int) -> datetime:
        return start + timedelta(seconds=second)

    def moved(second: int, state: MoveState, node: str, **more: object) -> ConsolidationMove:
        return ConsolidationMove.model_validate(
            {"cluster": "test", "state": state, "node": node, "at": at(second), **more}
        )

    return [
        ConsolidationReport(
            cluster="test",
            mode=ConsolidationMode.AUTO,
            would_free_gpus=2,
            would_free_nodes=1,
            gpus_on_freed_nodes=2,
            freed_nodes=("node-a",),
            move_count=2,
            moves=(chat, embed),
            refused_count=1,
            refused=(ConsolidationRefusal(candidate="node", name="node-c", reason="a PDB"),),
            node="node-a",
            reported_at=at(0),
        ),
        moved(1, MoveState.STARTED, "node-a", move=chat),
        moved(2, MoveState.VERIFIED, "node-a", move=chat, new_pod="chat-1", to_node="node-b"),
        moved(3, MoveState.STARTED, "node-a", move=embed),
        moved(4, MoveState.VERIFIED, "node-a", move=embed, new_pod="embed-1", to_node="node-b"),
        moved(5, MoveState.FREED, "node-a", freed_node="node-a", freed_gpus=2),
        moved(6, MoveState.STARTED, "node-c", move=search),
        moved(7, MoveState.FAILED, "node-c", move=search, detail="not bound within 300 s"),
        moved(8, MoveState.ABANDONED, "node-c", detail="not bound within 300 s"),
        ConsolidationReport(
            cluster="test",
            mode=ConsolidationMode.AUTO,
            would_free_gpus=1,
            would_free_nodes=0,
            move_count=1,
            moves=(translate,),
            reported_at=at(9),
        ),
    ]


def namespace_policy(namespace: str, revision: int) -> Policy:
    """A namespace's stored policy (as the policy store keeps it), with the engine's rules
    before issue 20 (``v1_policy``): the operator tests' expected rows were worked out with
    them, and they test the CLI's reading, not the sizing defaults."""
    return v1_policy(
        scope=PolicyScope(level=PolicyLevel.NAMESPACE, namespace=namespace), revision=revision
    )


async def publish(
    url: str,
    rec: Recording,
    extra_states: dict[str, bytes] | None = None,
    wire: str = "sample",
    batch_samples: int = 2,
) -> None:
    """Put the recording where the services would have (streams in publishing order). ``wire``:
    ingest's usage format, one sample per message or batches of each instant's samples per
    partition (cut every ``batch_samples``, so an instant takes several batches)."""
    bus = Bus("recording", ServiceSettings(nats={"url": url}), CollectorRegistry())
    await bus.connect(retry_for_s=10)
    try:
        await bus.ensure_streams()
        if wire == "batch":
            partitions = await bus.usage_partitions()
            for instant in sorted({s.timestamp for s in rec.samples}):
                now = [s for s in rec.samples if s.timestamp == instant]
                for b in encode_samples(now, partitions, max_samples=batch_samples):
                    await bus.publish_bytes(b.subject, b.payload, b.batch_id)
        else:
            for s in rec.samples:
                await bus.publish(subjects.usage_subject(s.workload), s)
        # Decisions and their results interleave as the services publish them.
        results = {r.decision_id: [] for r in rec.results}  # type: dict[str, list[ActuationResult]]
        for r in rec.results:
            results[r.decision_id].append(r)
        for d in rec.decisions:
            await bus.publish(subjects.decision_subject(d.workload), d)
            for r in results.get(d.decision_id, []):
                await bus.publish(subjects.actuation_subject(r.workload), r)
        allocations = await bus.kv(subjects.ALLOCATION_BUCKET)
        for key, a in rec.allocations.items():
            await allocations.put(key, a.to_json())
        states = await bus.kv(subjects.DECISION_STATE_BUCKET)
        groups: dict[str, list[tuple[str, WorkloadState]]] = {}  # as the decision service
        for key, state in rec.states.items():
            group = group_key(key)
            if group is None:  # not a workload's key: on its own, as before groups
                await states.put(key, dump_state(state))
            else:
                groups.setdefault(group, []).append((key, state))
        for group, members in groups.items():
            await states.put(group, dump_group(members))
        for key, raw in (extra_states or {}).items():
            await states.put(key, raw)
        for event in rec.consolidation:
            if isinstance(event, ConsolidationReport):
                await bus.publish(subjects.consolidation_report_subject(event.cluster), event)
            else:
                await bus.publish(subjects.consolidation_move_subject(event.cluster), event)
        if rec.policy.scope.level is not PolicyLevel.CLUSTER:
            policies = await bus.kv(subjects.POLICY_BUCKET)
            await policies.put(rec.policy.scope.key, rec.policy.to_json())
    finally:
        await bus.close()


# --- the fleet the operator tests record -------------------------------------------------------


def _failed_eviction(
    _n: int, d: FractionDecision
) -> list[tuple[PlanKind, Outcome, str, str | None]]:
    error = f"eviction of {d.workload.namespace}/{d.pod} refused 8 times (429); not forced"
    return [(PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED, f"fits on GPU-b-0; {error}", error)]


def _translate_answer(
    n: int, d: FractionDecision
) -> list[tuple[PlanKind, Outcome, str, str | None]]:
    if n == 0:
        return applied_in_place(n, d)
    return [  # a scale-up reports twice: capacity asked for, then the pod moved
        (PlanKind.SCALE_UP, Outcome.APPLIED, "capacity requested for translate-0", None),
        (PlanKind.SCALE_UP, Outcome.APPLIED, "capacity appeared on node-b; evicted", None),
    ]


def operator_fleet() -> list[WorkloadSpec]:
    """Five workloads, one of each kind a status table must tell apart:

    - inference/chat: memory 0.3 on 0.25; the upsize to 0.5 failed (a PDB): memory over,
      upsizing (asked 0.5)
    - inference/embed: 0.1 used of 0.5 for 40 minutes: waiting to downsize (to 0.25), 21 min left
    - inference/search: compute 0.36 of 0.5: stable
    - inference/translate: downsized 0.5 -> 0.25 at minute 60, memory jumps to 0.3 at minute 70:
      upsized to 0.5 by a scale-up (two results)
    - jobs/batch: no engine state, compute 0.7 of 0.75: near
    """
    return [
        WorkloadSpec("chat", "inference", 0.25, 30, lambda m: (0.1, 0.3), _failed_eviction),
        WorkloadSpec("embed", "inference", 0.5, 40, lambda m: (0.1, 0.1)),
        WorkloadSpec("search", "inference", 0.5, 40, lambda m: (0.36, 0.2)),
        WorkloadSpec(
            "translate",
            "inference",
            0.5,
            75,
            lambda m: (0.1, 0.3 if m >= 70 else 0.1),
            _translate_answer,
        ),
        WorkloadSpec("batch", "jobs", 0.75, 5, lambda m: (0.7, 0.5), engine=False),
    ]
