"""Every wire model's decoder, fuzzed: any payload decodes or is refused with a reason.

The services decode every message they consume and every KV value they read with
:func:`fracpilot_libs.nats.bus.decode` (usage samples in decision, decisions in the actuator,
policies and scopes at the policy endpoint, allocations in ingest, targets in the webhook,
results in the CLI); a refusal is a :class:`DecodeError` whose kind and reason go into the
dead letter. Nothing else may escape, and what decodes must be a message the service can write
back (finite numbers, UTC timestamps).
"""

from __future__ import annotations

import math
from datetime import UTC

import pytest
from pydantic import BaseModel

from factories import T0, decision, sample, workload
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    DeadLetter,
    FractionDecision,
    GpuSharing,
    Outcome,
    PlanKind,
    Policy,
    PolicyLevel,
    PolicyReply,
    PolicyScope,
    UsageSample,
    WorkloadRef,
    WorkloadTarget,
)
from fracpilot_libs.nats.bus import DecodeError, decode
from support.fuzzing import examples_per_subject, junk_payloads, run_property

VALID: dict[type[BaseModel], BaseModel] = {
    UsageSample: sample(compute=0.4, memory_share=0.3),
    FractionDecision: decision(),
    ActuationResult: ActuationResult(
        decision_id="d-1",
        workload=workload(),
        plan=PlanKind.IN_PLACE,
        outcome=Outcome.APPLIED,
        fraction_before=0.5,
        fraction_after=0.75,
        finished_at=T0,
    ),
    Policy: Policy(
        scope=PolicyScope(level=PolicyLevel.WORKLOAD, namespace="inference", workload="chat"),
        max_fraction=0.75,
    ),
    PolicyScope: PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference"),
    WorkloadRef: workload(),
    Allocation: Allocation(
        workload=workload(),
        pod="chat-0",
        node="node-a",
        gpu_uuid="GPU-a-0",
        fraction=0.5,
        device_memory_bytes=80 * 1024**3,
        updated_at=T0,
    ),
    WorkloadTarget: WorkloadTarget(
        workload=workload(),
        fraction=0.5,
        memory_mib=40960,
        backend=GpuSharing.KAI,
        decision_id="d-1",
        updated_at=T0,
    ),
    PolicyReply: PolicyReply(ok=True, policy=Policy()),
    DeadLetter: DeadLetter(
        service="decision",
        subject="fracpilot.usage.v1.inference.chat",
        reason="not valid JSON",
        error_kind="decode",
        raw_payload="{",
        received_at=T0,
    ),
}


def _finite_everywhere(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_everywhere(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite_everywhere(v) for v in value)
    return True


@pytest.mark.parametrize("model", list(VALID), ids=lambda m: m.__name__)
def test_decoder_refuses_junk_with_a_reason_and_nothing_else(model: type[BaseModel]) -> None:
    outcomes = {"decoded": 0, "decode": 0, "validation": 0}

    def check(data: bytes) -> None:
        refusal: DecodeError | None = None
        try:
            message = decode(model, data)
        except DecodeError as exc:
            refusal = exc
        if refusal is not None:
            assert refusal.kind in ("decode", "validation")
            assert refusal.reason.strip(), "a refusal must say why"
            outcomes[refusal.kind] += 1
            return
        outcomes["decoded"] += 1
        # What decodes is a message the service can act on and write back unchanged.
        assert _finite_everywhere(message.model_dump())
        for field in ("timestamp", "decided_at", "finished_at", "updated_at", "received_at"):
            if (at := getattr(message, field, None)) is not None:
                assert at.tzinfo is UTC
        assert decode(model, message.model_dump_json().encode()) == message

    runs = run_property(junk_payloads(VALID[model]), check)
    assert runs >= examples_per_subject()
    assert outcomes["decode"] > 0
    assert outcomes["validation"] > 0
