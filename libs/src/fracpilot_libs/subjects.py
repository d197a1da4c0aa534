"""Every NATS subject, stream, consumer and KV bucket name, in one place.

Per-workload subjects end in ``<namespace>.<workload>``. Usage samples are published on
``fracpilot.usage.v1.<ns>.<workload>`` and the usage stream stores them partitioned by workload
(a subject transform: :func:`usage_partition_transform`) as
``fracpilot.usage.v1.p.<partition>.<ns>.<workload>``, so that decision replicas can share the
partitions while each workload's samples stay in order on one of them. Readers of the stream
filter on ``USAGE_STORED_ALL`` (every sample) or :func:`usage_workload_filter` (one workload).
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

DECISION_CONSUMER_PREFIX = "decision-p"  # one durable consumer per usage partition
ACTUATOR_CONSUMER = "actuator"

POLICY_BUCKET = "fracpilot_policies"  # PolicyScope.key -> Policy
INGEST_STATE_BUCKET = "fracpilot_ingest"  # source cursors (the last instant published)
ALLOCATION_BUCKET = "fracpilot_allocations"  # workload key -> where it runs and its fraction
TARGET_BUCKET = "fracpilot_targets"  # workload key -> WorkloadTarget (read by the webhook)
ACTUATOR_STATE_BUCKET = "fracpilot_actuator"  # applied decision ids, simulated cluster
DECISION_STATE_BUCKET = "fracpilot_decision_state"  # workload key -> engine checkpoint
DECISION_PARTITION_BUCKET = "fracpilot_decision_partitions"  # replicas and partition leases

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


# --- usage partitions -----------------------------------------------------------------------

USAGE_PARTITION_TOKEN = "p"
USAGE_STORED_ALL = f"{USAGE_PREFIX}.>"  # every stored sample, whatever its partition


def usage_partition_transform(partitions: int) -> tuple[str, str]:
    """The usage stream's subject transform (source, destination): nats-server hashes the
    namespace and workload tokens into one of ``partitions`` (its ``partition`` mapping
    function, which :func:`partition_of` reproduces)."""
    return (
        f"{USAGE_PREFIX}.*.*",
        f"{USAGE_PREFIX}.{USAGE_PARTITION_TOKEN}.{{{{partition({partitions},1,2)}}}}"
        ".{{wildcard(1)}}.{{wildcard(2)}}",
    )


_PARTITIONS_IN = re.compile(r"\{\{\s*partition\(\s*(\d+)\s*,")


def partitions_of_transform(destination: str) -> int | None:
    """The partition count a usage stream transform destination names (None: not one)."""
    found = _PARTITIONS_IN.search(destination)
    return int(found.group(1)) if found else None


def partition_of(namespace_token: str, workload_token: str, partitions: int) -> int:
    """The partition nats-server stores ``<ns>.<workload>`` in: FNV-1a (32 bit) of the two
    tokens written one after the other, modulo the partition count."""
    h = 0x811C9DC5
    for byte in (namespace_token + workload_token).encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def usage_partition(workload: WorkloadRef, partitions: int) -> int:
    return partition_of(token(workload.namespace), token(workload.owner_name), partitions)


def usage_partition_filter(partition: int) -> str:
    """Every stored sample of one partition."""
    return f"{USAGE_PREFIX}.{USAGE_PARTITION_TOKEN}.{partition}.>"


def usage_workload_filter(workload: WorkloadRef) -> str:
    """Every stored sample of one workload, whatever the partition count."""
    return (
        f"{USAGE_PREFIX}.{USAGE_PARTITION_TOKEN}.*."
        f"{token(workload.namespace)}.{token(workload.owner_name)}"
    )


def decision_consumer(partition: int) -> str:
    """The durable consumer of one usage partition (whichever decision replica owns it)."""
    return f"{DECISION_CONSUMER_PREFIX}{partition}"
