"""A recorded fleet for the operator commands' tests: what the services would have published.

Each workload's usage is a function of the minute; the real decision engine (the pure
``decide``) sizes it sample by sample with the recorded policy, and a decision is answered by
the result the spec says (applied decisions change the fraction from the next sample on, as
the simulated cluster does). The recording keeps every sample, decision and result, the final
allocation and the engine's state of each workload; :func:`publish` puts them on a real NATS
where the services would have: the usage, decisions and actuations streams, the allocations,
decision-state and policies buckets.
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
    FractionDecision,
    Outcome,
    PlanKind,
    Policy,
    PolicyLevel,
    PolicyScope,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.usage_batch import encode_samples
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
    return rec


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
        for key, state in rec.states.items():
            await states.put(key, dump_state(state))
        for key, raw in (extra_states or {}).items():
            await states.put(key, raw)
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
