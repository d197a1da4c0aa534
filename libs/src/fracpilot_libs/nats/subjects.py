"""Every NATS subject, stream, consumer and KV bucket name, in one place.

Per-workload subjects end in ``<namespace>.<workload>``. Usage samples carry one more token,
the workload's slot (a fixed hash): ``fracpilot.usage.v1.<slot>.<ns>.<workload>``.
Each usage partition is a stream of its own (:func:`usage_stream`) holding a share of the
slots, so that decision replicas can share the partitions while each workload's samples stay
in order on one of them.
"""

from __future__ import annotations

import functools
import re

from fracpilot_libs.contracts import USAGE_BATCH_FORMAT, WorkloadRef

USAGE_PREFIX = "fracpilot.usage.v1"
DECISION_PREFIX = "fracpilot.decision.v1"
ACTUATION_PREFIX = "fracpilot.actuation.v1"
DEADLETTER_PREFIX = "fracpilot.deadletter.v1"
# The actuator's consolidation: ``<prefix>.report.<cluster>`` (ConsolidationReport, the plan as
# it stands) and ``<prefix>.move.<cluster>`` (ConsolidationMove, what auto mode did).
CONSOLIDATION_PREFIX = "fracpilot.consolidation.v1"
POLICY_SET = "fracpilot.policy.v1.set"
POLICY_GET = "fracpilot.policy.v1.get"
POLICY_LIST = "fracpilot.policy.v1.list"
POLICY_QUEUE = "decision-policy"  # queue group: decision replicas share the policy requests

DECISION_STREAM = "FRACPILOT_DECISIONS"
ACTUATION_STREAM = "FRACPILOT_ACTUATIONS"
DEADLETTER_STREAM = "FRACPILOT_DEADLETTERS"
CONSOLIDATION_STREAM = "FRACPILOT_CONSOLIDATION"

DECISION_CONSUMER_PREFIX = "decision-p"  # the durable consumer of each usage partition
ACTUATOR_CONSUMER = "actuator"

POLICY_BUCKET = "fracpilot_policies"  # PolicyScope.key -> Policy
INGEST_STATE_BUCKET = "fracpilot_ingest"  # source cursors (the last instant published)
ALLOCATION_BUCKET = "fracpilot_allocations"  # workload key -> where it runs and its fraction
TARGET_BUCKET = "fracpilot_targets"  # workload key -> WorkloadTarget (read by the webhook)
ACTUATOR_STATE_BUCKET = "fracpilot_actuator"  # applied decision ids, simulated cluster
DECISION_STATE_BUCKET = "fracpilot_decision_state"  # workload key -> engine checkpoint
DECISION_PARTITION_BUCKET = "fracpilot_decision_partitions"  # replicas and partition leases
INGEST_SHARD_BUCKET = "fracpilot_ingest_shards"  # ingest replicas and their GPU-shard leases

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(name: str) -> str:
    """A name made safe as one subject token (dots, spaces and wildcards replaced)."""
    return _UNSAFE.sub("_", name) or "_"


def _per_workload(prefix: str, workload: WorkloadRef) -> str:
    return f"{prefix}.{token(workload.namespace)}.{token(workload.owner_name)}"


def decision_subject(workload: WorkloadRef) -> str:
    return _per_workload(DECISION_PREFIX, workload)


def actuation_subject(workload: WorkloadRef) -> str:
    return _per_workload(ACTUATION_PREFIX, workload)


def deadletter_subject(service: str) -> str:
    return f"{DEADLETTER_PREFIX}.{token(service)}"


def consolidation_report_subject(cluster: str) -> str:
    return f"{CONSOLIDATION_PREFIX}.report.{token(cluster)}"


def consolidation_move_subject(cluster: str) -> str:
    return f"{CONSOLIDATION_PREFIX}.move.{token(cluster)}"


CONSOLIDATION_REPORTS = f"{CONSOLIDATION_PREFIX}.report.*"  # every cluster's reports
CONSOLIDATION_MOVES = f"{CONSOLIDATION_PREFIX}.move.*"


_KV_UNSAFE = re.compile(r"[^-/_=.A-Za-z0-9]")


def kv_key(workload: WorkloadRef) -> str:
    """KV keys allow ``[-/_=.a-zA-Z0-9]``; the workload key's slashes are fine. (Once per
    sample decided: a key with nothing to replace, the usual one, is returned as it is.)"""
    key = workload.key
    return key if _KV_UNSAFE.search(key) is None else _KV_UNSAFE.sub("_", key)


# --- usage partitions -----------------------------------------------------------------------
#
# A workload's samples are published on ``fracpilot.usage.v1.<slot>.<ns>.<workload>``: the slot
# (0..USAGE_SLOTS-1) is a hash of the namespace and workload tokens, fixed forever, so that a
# publisher needs no configuration. The partitions are streams, ``FRACPILOT_USAGE_<k>`` for k
# in 0..partitions-1, and stream k stores the slots with ``slot % partitions == k``: each
# decision consumer reads a stream of its own, whole, with no filter. (One stream filtered per
# partition made nats-server scan past every other partition's samples for each one it
# delivered: the largest share of its CPU once samples were acknowledged in batches.)

USAGE_SLOTS = 1024
USAGE_STREAM_PREFIX = "FRACPILOT_USAGE_"
USAGE_PARTITIONS_METADATA = "fracpilot_partitions"  # stream metadata: the partition count
LEGACY_USAGE_STREAM = "FRACPILOT_USAGE"  # the earlier layout: one stream, a partitioning transform
LEGACY_USAGE_SUBJECTS = f"{USAGE_PREFIX}.*.*"  # what the previous version's publishers send


def slot_of(namespace_token: str, workload_token: str) -> int:
    """The usage slot of ``<ns>.<workload>``: FNV-1a (32 bit) of the two tokens written one
    after the other, modulo :data:`USAGE_SLOTS` (nats-server's ``partition`` mapping function
    hashes the same way)."""
    h = 0x811C9DC5
    for byte in (namespace_token + workload_token).encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % USAGE_SLOTS


def usage_slot(workload: WorkloadRef) -> int:
    return workload_slot(workload.namespace, workload.owner_name)


@functools.lru_cache(maxsize=1 << 18)
def workload_slot(namespace: str, owner_name: str) -> int:
    """The hash is a loop over bytes in Python, run for every sample published or decided:
    each workload's slot is worked out once (up to 262,144 workloads remembered)."""
    return slot_of(token(namespace), token(owner_name))


def usage_subject(workload: WorkloadRef) -> str:
    """Where a workload's samples are published (and stored, in its partition's stream)."""
    ns, name = token(workload.namespace), token(workload.owner_name)
    return f"{USAGE_PREFIX}.{slot_of(ns, name)}.{ns}.{name}"


# Batches (:mod:`fracpilot_libs.nats.usage_batch`): the samples of one partition from one
# scrape instant in one message, on ``fracpilot.usage.v1.batch.<partition>.<format>``, stored
# in the partition's stream beside the per-workload subjects (which the previous version's
# publishers still use during an upgrade). Six tokens with a literal fourth: they overlap
# neither ``fracpilot.usage.v1.<slot>.*.*`` nor the earlier layout's ``fracpilot.usage.v1.*.*``,
# and stay inside the ingest identity's ``fracpilot.usage.v1.>`` permission.
USAGE_BATCH_PREFIX = f"{USAGE_PREFIX}.batch"
# The per-workload view of the samples, for integrations: core NATS (not stored: no stream
# takes it), one sample per message, on ``fracpilot.usage.v1.view.<ns>.<workload>``.
USAGE_VIEW_PREFIX = f"{USAGE_PREFIX}.view"


def usage_batch_subject(partition: int, batch_format: int = USAGE_BATCH_FORMAT) -> str:
    """Where a batch of usage partition ``partition`` is published."""
    return f"{USAGE_BATCH_PREFIX}.{partition}.{batch_format}"


def is_usage_batch(subject: str) -> bool:
    return subject.startswith(_batch_start)


_batch_start = f"{USAGE_BATCH_PREFIX}."


def usage_view_subject(workload: WorkloadRef) -> str:
    """Where ingest publishes a workload's samples one by one for integrations (core NATS)."""
    return f"{USAGE_VIEW_PREFIX}.{token(workload.namespace)}.{token(workload.owner_name)}"


def usage_partition(workload: WorkloadRef, partitions: int) -> int:
    return usage_slot(workload) % partitions


def usage_stream(partition: int) -> str:
    """The stream of one usage partition."""
    return f"{USAGE_STREAM_PREFIX}{partition}"


def usage_stream_partition(stream: str) -> int | None:
    """The partition a usage stream name stands for (None: not a usage partition stream)."""
    tail = stream.removeprefix(USAGE_STREAM_PREFIX)
    return int(tail) if tail != stream and tail.isdigit() else None


def usage_stream_subjects(partition: int, partitions: int) -> tuple[str, ...]:
    """The subjects stream ``partition`` stores when there are ``partitions``: its slots'
    per-workload subjects and its batches'."""
    slots = (f"{USAGE_PREFIX}.{slot}.*.*" for slot in range(partition, USAGE_SLOTS, partitions))
    return (*slots, f"{USAGE_BATCH_PREFIX}.{partition}.*")


def retired_usage_subjects(partition: int) -> tuple[str, ...]:
    """The subject of a usage stream past the partition count (after the count was lowered):
    nothing is published there; what it holds ages out. Outside the usage subjects, so that
    it overlaps no other stream's (the earlier layout's keeps ``fracpilot.usage.v1.*.*``)."""
    return (f"fracpilot.retired.usage.{partition}",)


def decision_consumer(partition: int) -> str:
    """The durable consumer of one usage partition (whichever decision replica owns it)."""
    return f"{DECISION_CONSUMER_PREFIX}{partition}"


# --- parsing what the server hands back ---------------------------------------------------


def stream_position(reply: str) -> tuple[int, int]:
    """Stream sequence and stored time (ns) of a JetStream message, from its reply subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<cseq>.<ns>.<pending>``, or the form
    with domain and account hash, 12 tokens); the cheap part of nats-py's ``Msg.metadata``.
    A message read with ``get_last_msg`` carries ``|<seq>|<ns>`` instead."""
    if reply.startswith("|"):
        _, seq, ns = reply.split("|")
        return int(seq), int(ns)
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7])
    return int(tokens[7]), int(tokens[9])


def on_own_subject(subject: str, namespace: str, name: str, *, slot_too: bool) -> bool:
    """Whether a stored sample's subject ends in its own workload's tokens, and (``slot_too``)
    its slot is theirs: the partition was chosen from the slot. Names that are tokens already
    skip the escaping; the slot, a hash, is checked on a workload's first sample in the
    partition only (a sample on another slot of the same workload lands in a partition where
    the workload is new, or in this one, where its order is kept)."""
    _, slot, ns_token, name_token = subject.rsplit(".", 3)
    if ns_token != namespace and ns_token != token(namespace):
        return False
    if name_token != name and name_token != token(name):
        return False
    return not slot_too or slot == str(slot_of(ns_token, name_token))


def of_another_partition(subject: str, partitions: int, partition: int) -> bool:
    """Whether a stored sample's slot belongs to another partition now: stored before the
    partition count changed and not consumed since. Decided there, from an empty history, it
    would overwrite its workload's checkpoint, which its new partition's owner carries on."""
    slot = subject.rsplit(".", 3)[1]
    return not slot.isdigit() or int(slot) % partitions != partition


def kv_key_parts(key: str) -> tuple[str, str, str, str] | None:
    """``(cluster, namespace, kind, name)`` of a workload's KV key (``cluster/ns/kind/name``,
    see :func:`kv_key`); None for a key of another shape."""
    parts = key.split("/")
    if len(parts) != 4 or not all(parts):
        return None
    return parts[0], parts[1], parts[2], parts[3]


def partition_of_kv_key(key: str, partitions: int) -> int | None:
    """The usage partition of the workload a KV key names; None for a key of another shape.
    (Only the namespace and the name matter: a cluster name may hold a slash.)"""
    parts = key.rsplit("/", 3)
    if len(parts) != 4 or not parts[1] or not parts[3]:
        return None
    return slot_of(token(parts[1]), token(parts[3])) % partitions
