"""Every NATS subject, stream, consumer and KV bucket name, in one place.

Per-workload subjects end in ``<namespace>.<workload>`` so that a later subject mapping can
partition by workload while keeping each workload's messages in order.
"""

from __future__ import annotations

import re

from fracpilot_libs.contracts import WorkloadRef

USAGE_PREFIX = "fracpilot.usage.v1"
DECISION_PREFIX = "fracpilot.decision.v1"
ACTUATION_PREFIX = "fracpilot.actuation.v1"
DEADLETTER_PREFIX = "fracpilot.deadletter.v1"
POLICY_SET = "fracpilot.policy.v1.set"
POLICY_GET = "fracpilot.policy.v1.get"
POLICY_LIST = "fracpilot.policy.v1.list"
POLICY_QUEUE = "decision-policy"  # queue group: decision replicas share the policy requests

USAGE_STREAM = "FRACPILOT_USAGE"
DECISION_STREAM = "FRACPILOT_DECISIONS"
ACTUATION_STREAM = "FRACPILOT_ACTUATIONS"
DEADLETTER_STREAM = "FRACPILOT_DEADLETTERS"

DECISION_CONSUMER = "decision-engine"
ACTUATOR_CONSUMER = "actuator"

POLICY_BUCKET = "fracpilot_policies"  # PolicyScope.key -> Policy
INGEST_STATE_BUCKET = "fracpilot_ingest"  # source cursors (the last instant published)
ALLOCATION_BUCKET = "fracpilot_allocations"  # workload key -> where it runs and its fraction
TARGET_BUCKET = "fracpilot_targets"  # workload key -> WorkloadTarget (read by the webhook)
ACTUATOR_STATE_BUCKET = "fracpilot_actuator"  # applied decision ids, simulated cluster
DECISION_STATE_BUCKET = "fracpilot_decision_state"  # workload key -> engine checkpoint

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(name: str) -> str:
    """A name made safe as one subject token (dots, spaces and wildcards replaced)."""
    return _UNSAFE.sub("_", name) or "_"


def _per_workload(prefix: str, workload: WorkloadRef) -> str:
    return f"{prefix}.{token(workload.namespace)}.{token(workload.owner_name)}"


def usage_subject(workload: WorkloadRef) -> str:
    return _per_workload(USAGE_PREFIX, workload)


def decision_subject(workload: WorkloadRef) -> str:
    return _per_workload(DECISION_PREFIX, workload)


def actuation_subject(workload: WorkloadRef) -> str:
    return _per_workload(ACTUATION_PREFIX, workload)


def deadletter_subject(service: str) -> str:
    return f"{DEADLETTER_PREFIX}.{token(service)}"


def kv_key(workload: WorkloadRef) -> str:
    """KV keys allow ``[-/_=.a-zA-Z0-9]``; the workload key's slashes are fine."""
    return re.sub(r"[^-/_=.A-Za-z0-9]", "_", workload.key)
