"""Builders of valid wire messages for tests; each test changes only what it is about."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fracpilot_libs.contracts import (
    Direction,
    FractionDecision,
    Policy,
    ReasonCode,
    UsageSample,
    WorkloadRef,
)

GIB = 1024**3
T0 = datetime(2026, 3, 2, tzinfo=UTC)


# The engine's rules as they were before issue 20 (a 1/8 grid, compute by its p95, one-step
# hysteresis, 1 h holds): tests of those rules pin them, whatever the defaults are now.
V1_POLICY: dict[str, Any] = {
    "grid": "steps",
    "grid_steps": 8,
    "min_fraction": 0.125,
    "compute_sizing": "percentile",
    "downsize_min_change": 0.0,
    "downsize_hold_s": 3600.0,
    "cooldown_s": 1800.0,
    "min_history_s": 3600.0,
}


def v1_policy(**changes: Any) -> Policy:
    """A policy with the engine's rules before issue 20, with ``changes``."""
    return Policy(**{**V1_POLICY, **changes})


def workload(name: str = "chat", namespace: str = "inference") -> WorkloadRef:
    return WorkloadRef(cluster="test", namespace=namespace, owner_name=name)


def sample(
    compute: float = 0.1,
    memory_share: float = 0.1,
    at: datetime | None = None,
    minute: int = 0,
    name: str = "chat",
    allocated: float | None = 0.5,
    **overrides: Any,
) -> UsageSample:
    at = at or T0 + timedelta(minutes=minute)
    wl = workload(name)
    fields: dict[str, Any] = {
        "sample_id": f"t|{wl.key}|{int(at.timestamp())}",
        "workload": wl,
        "pod": f"{name}-0",
        "node": "node-a",
        "gpu_uuid": "GPU-a-0",
        "timestamp": at,
        "compute": compute,
        "memory_used_bytes": int(memory_share * 80 * GIB),
        "memory_total_bytes": 80 * GIB,
        "allocated_fraction": allocated,
        "source": "test",
    }
    fields.update(overrides)
    return UsageSample(**fields)


def decision(
    current: float = 0.5,
    new: float = 0.75,
    name: str = "chat",
    decision_id: str = "d-1",
    **overrides: Any,
) -> FractionDecision:
    fields: dict[str, Any] = {
        "decision_id": decision_id,
        "workload": workload(name),
        "decided_at": T0,
        "pod": f"{name}-0",
        "current_fraction": current,
        "new_fraction": new,
        "device_memory_bytes": 80 * GIB,
        "current_memory_mib": int(current * 80 * 1024),
        "new_memory_mib": int(new * 80 * 1024),
        # As the engine sizes: its memory floor under the new fraction (a downsize in place
        # needs it there); None for a decision from an engine that did not say.
        "memory_need_mib": int(min(current, new) * 80 * 1024) // 2,
        "direction": Direction.UP if new > current else Direction.DOWN,
        "reason": ReasonCode.COMPUTE_HIGH if new > current else ReasonCode.UNDERUSED,
        "explanation": "test decision",
        "policy_revision": 0,
    }
    fields.update(overrides)
    return FractionDecision(**fields)


def as_json_with(model: UsageSample | FractionDecision, **changes: Any) -> bytes:
    """The model's JSON with top-level fields changed or added, bypassing validation."""
    body = json.loads(model.model_dump_json())
    body.update(changes)
    return json.dumps(body).encode()


def malformed_payloads(
    valid: UsageSample | FractionDecision, number_field: str
) -> dict[str, bytes]:
    """The bad inputs every subject must survive, keyed by what is wrong with them."""
    return {
        "bad_json": b'{"schema_version": 1, "oops',
        "binary": b"\xff\xfe\x00garbage",
        "wrong_type": as_json_with(valid, **{number_field: "abc"}),
        "nan": as_json_with(valid, **{number_field: float("nan")}),
        "negative": as_json_with(valid, **{number_field: -0.25}),
        "above_one": as_json_with(valid, **{number_field: 1.5}),
        "unknown_field": as_json_with(valid, surprise=True),
        "wrong_schema_version": as_json_with(valid, schema_version=99),
        "not_an_object": b"[1, 2, 3]",
    }
