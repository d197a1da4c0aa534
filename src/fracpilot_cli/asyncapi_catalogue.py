"""What ``fracpilot asyncapi`` documents: every name in :mod:`fracpilot_libs.nats.subjects`
described
(streams, consumers, KV buckets, the other names), the wire models, the channels and who sends
and receives on each. :mod:`fracpilot_cli.asyncapi` turns this table into the document;
generation fails when a name in subjects.py is not described here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    ConsolidationMove,
    ConsolidationReport,
    DeadLetter,
    FractionDecision,
    Policy,
    PolicyReply,
    PolicyScope,
    UsageBatchHeader,
    UsageSample,
    WorkloadRef,
    WorkloadTarget,
)
from fracpilot_libs.nats import subjects

MODELS: tuple[type[BaseModel], ...] = (
    UsageSample,
    UsageBatchHeader,
    FractionDecision,
    ActuationResult,
    DeadLetter,
    Policy,
    PolicyScope,
    WorkloadRef,
    PolicyReply,
    Allocation,
    WorkloadTarget,
    ConsolidationReport,
    ConsolidationMove,
)
TOKEN = (
    "one subject token: the name with every character other than letters, digits, '-' and "
    "'_' replaced by '_' (subjects.token)"
)
PARAMETERS = {
    "slot": "The workload's usage slot: FNV-1a (32 bit) of the namespace and workload tokens "
    "written one after the other, modulo 1024 (fracpilot_libs.nats.subjects.usage_slot).",
    "namespace": f"The workload's Kubernetes namespace as {TOKEN}.",
    "workload": f"The workload's owner name (Deployment, StatefulSet, ...) as {TOKEN}.",
    "service": f"The service that refused the message as {TOKEN}.",
    "cluster": f"The cluster's name (the actuator's FRACPILOT_CLUSTER) as {TOKEN}.",
    "key": "The KV key (see the bucket's description).",
    "partition": "The usage partition of every sample in the batch (slot mod partitions).",
    "format": "The batch wire format's version (UsageBatchHeader.batch_format).",
}

# Every name in subjects.py, described; a new name fails generation until it is described here.
STREAMS = {
    "LEGACY_USAGE_STREAM": "usage samples of the previous layout (one stream, partitioned by a "
    "subject transform): narrowed to its publishers' subjects on upgrade, left to age out",
    "DECISION_STREAM": "fraction decisions, kept for audit and replay",
    "ACTUATION_STREAM": "actuation results, kept for audit",
    "DEADLETTER_STREAM": "dead letters, kept with the reason and the raw payload",
    "CONSOLIDATION_STREAM": "consolidation's plans and moves, kept for status and report "
    "(the results' limits, FRACPILOT_STREAMS_RESULTS_*)",
}
CONSUMERS = {
    "DECISION_CONSUMER_PREFIX": "decision's durable consumers, one per usage partition "
    "(the name followed by the partition number)",
    "ACTUATOR_CONSUMER": "the actuator's durable consumer (only the Lease holder consumes)",
}
OTHER_NAMES = {
    "USAGE_STREAM_PREFIX": "usage samples, one stream per partition (the name followed by the "
    "partition number), bounded in age (FRACPILOT_USAGE_MAX_AGE_S, default 24 h)",
    "USAGE_PARTITIONS_METADATA": "the usage streams' metadata key holding the partition count",
    "LEGACY_USAGE_SUBJECTS": "the subjects the previous layout's usage stream keeps",
    "POLICY_QUEUE": "the queue group decision replicas answer policy requests in",
    "CONSOLIDATION_REPORTS": "every cluster's consolidation reports (a filter subject)",
    "CONSOLIDATION_MOVES": "every cluster's consolidation moves (a filter subject)",
}


@dataclass(frozen=True)
class Bucket:
    description: str
    model: type[BaseModel] | None = None  # None: not a wire model (described in words)
    value: str = ""  # what a value is, when it is not a wire model


BUCKETS = {
    "POLICY_BUCKET": Bucket(
        "Stored policies by scope key (`cluster`, `namespace.<ns>`, `workload.<ns>.<name>`), "
        "written by the decision service on a policy set request and followed live by every "
        "decision replica.",
        Policy,
    ),
    "ALLOCATION_BUCKET": Bucket(
        "Where each workload's pod runs and the fraction it holds, by `subjects.kv_key` of the "
        "workload. Written by the actuator (both backends) after each change; read by ingest "
        "(attribution of shared GPUs, and the workload a placed pod belongs to), the CLI and the "
        "Compose stack's dcgm-exporter simulator.",
        Allocation,
    ),
    "TARGET_BUCKET": Bucket(
        "The fraction a workload's next pods get, by `subjects.kv_key`. Written by the "
        "actuator (Kubernetes backend); read by its admission webhook.",
        WorkloadTarget,
    ),
    "INGEST_STATE_BUCKET": Bucket(
        "Ingest's source cursors: key `prometheus.cursor`, the unix time of the last instant "
        "published, so a restart or an outage is caught up once; sharded, each GPU shard's "
        "(`prometheus.cursor.<shards>.<shard>`), and `prometheus.cursor` their floor.",
        value="a decimal number of seconds, UTF-8",
    ),
    "ACTUATOR_STATE_BUCKET": Bucket(
        "The actuator's claims (key `decision.<decision_id>`: `started`, then "
        "`done:<outcome>`) that make each decision applied at most once, and the simulated "
        "cluster's state (key `simulated-cluster`).",
        value="`started` / `done:<outcome>` text, or the simulated cluster as JSON",
    ),
    "DECISION_STATE_BUCKET": Bucket(
        "Checkpoints of the decision engine's per-workload history, restored on start and "
        "when a partition moves to another replica: several workloads' states in a group "
        "(key `groups/<usage slot>/<0..3>`); one workload's under its `subjects.kv_key` as "
        "written before groups (still read); each partition's mark (`marks/<usage stream>`).",
        value="a group: zlib-compressed, a header line, then each state's KV key and binary "
        "state (fracpilot_libs.sizing.checkpoint_groups.dump_group; the first version, lines "
        "of KV key, space, state as JSON, still read); before groups, one state as "
        "zlib-compressed or plain JSON (fracpilot_libs.sizing.state.dump_state); a mark: JSON",
    ),
    "DECISION_PARTITION_BUCKET": Bucket(
        "Decision replicas and their leases on usage partitions.",
        value="replica and lease records as JSON (owned by the decision service)",
    ),
    "INGEST_SHARD_BUCKET": Bucket(
        "Ingest replicas sharing one Prometheus source (FRACPILOT_INGEST_SHARDS) and their "
        "leases on GPU shards (key `member.<replica>`, `partition.<shard>`); the shards' "
        "cursors are in the ingest state bucket.",
        value="the replica's name, or a member record as JSON (owned by the ingest service)",
    ),
}


@dataclass(frozen=True)
class Channel:
    address: str | None
    messages: tuple[str, ...]
    description: str
    parameters: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    action: str  # send | receive
    channel: str
    services: tuple[str, ...]
    summary: str
    reply: str | None = None


def _per_workload(prefix: str) -> str:
    return f"{prefix}.{{namespace}}.{{workload}}"


def _usage_storage() -> str:
    partitions = ServiceSettings.model_fields["decision_partitions"].default
    first = subjects.usage_stream_subjects(0, partitions)[:2]
    return (
        f"Each usage partition is a stream, `{subjects.usage_stream(0)}` to "
        f"`{subjects.usage_stream(partitions - 1)}` (FRACPILOT_DECISION_PARTITIONS, default "
        f"{partitions}); stream k stores the slots s with s mod partitions = k "
        f"(`{first[0]}`, `{first[1]}`, ...), so decision replicas share the partitions and "
        "each workload's samples stay in order on one of them."
    )


def channels() -> dict[str, Channel]:
    s = subjects
    found = {
        "usage": Channel(
            _per_workload(f"{s.USAGE_PREFIX}.{{slot}}"),
            ("UsageSample",),
            "One observation of one workload's pod on one GPU in a message of its own, with "
            f"`Nats-Msg-Id` = `sample_id` (re-read instants are dropped by the server): the "
            "previous version's format, published by ingest with FRACPILOT_USAGE_WIRE=sample "
            "(during an upgrade from a version before batches) and always read by the decision "
            f"service and the CLI. {_usage_storage()}",
            ("slot", "namespace", "workload"),
        ),
        "usageBatches": Channel(
            f"{s.USAGE_BATCH_PREFIX}.{{partition}}.{{format}}",
            ("UsageBatch",),
            "The samples of one usage partition from one scrape instant (at most 500 a "
            "message), what ingest publishes by default, with `Nats-Msg-Id` = `batch_id` (a "
            "digest of the partition and the sample ids: an instant read again is dropped by "
            "the server). Stored in the partition's stream beside the per-workload subjects. "
            "The decision service decides each sample as if it came alone, in order; a "
            "sample that does not decode is dead-lettered alone with the headers "
            "`Fracpilot-Batch-Id` and `Fracpilot-Batch-Index`.",
            ("partition", "format"),
        ),
        "usageView": Channel(
            _per_workload(s.USAGE_VIEW_PREFIX),
            ("UsageSample",),
            "The per-workload view of the samples for integrations: each sample of a stored "
            "batch, once, on core NATS (not stored: read the usage streams for history; "
            "FRACPILOT_USAGE_VIEW=false turns it off). Decisions and results stay one "
            "message per workload.",
            ("namespace", "workload"),
        ),
        "decisions": Channel(
            _per_workload(s.DECISION_PREFIX),
            ("FractionDecision",),
            f"The engine's verdicts, stored in `{s.DECISION_STREAM}`; `Nats-Msg-Id` = "
            "`decision_id`, deterministic, so a redelivered sample cannot make a second one.",
            ("namespace", "workload"),
        ),
        "actuations": Channel(
            _per_workload(s.ACTUATION_PREFIX),
            ("ActuationResult",),
            f"What the actuator did with each decision and why, stored in "
            f"`{s.ACTUATION_STREAM}`; `Nats-Msg-Id` = `<decision_id>:result[:<stage>]`.",
            ("namespace", "workload"),
        ),
        "consolidationReports": Channel(
            f"{s.CONSOLIDATION_PREFIX}.report.{{cluster}}",
            ("ConsolidationReport",),
            "The actuator's consolidation plan as it stands (recommend and auto mode): what it "
            "would free (GPUs, nodes) and the moves that would do it, the candidates refused "
            "and why; published when the plan's summary changes, not every round. Stored in "
            f"`{s.CONSOLIDATION_STREAM}`; the last one is what `fracpilot status` shows.",
            ("cluster",),
        ),
        "consolidationMoves": Channel(
            f"{s.CONSOLIDATION_PREFIX}.move.{{cluster}}",
            ("ConsolidationMove",),
            "What consolidation did in auto mode: each move's start (the pod evicted), its "
            "result (verified: the replacement bound where it says; failed), a node's plan "
            "given up (abandoned), and a node freed of GPU pods (freed: the node and its GPUs, "
            f"for the autoscaler to remove). Stored in `{s.CONSOLIDATION_STREAM}`; "
            "`fracpilot report` sums them.",
            ("cluster",),
        ),
        "deadLetters": Channel(
            f"{s.DEADLETTER_PREFIX}.{{service}}",
            ("DeadLetter",),
            f"Messages a service could not accept, with the reason and the raw payload, stored "
            f"in `{s.DEADLETTER_STREAM}` and counted in `fracpilot_dead_letters_total`.",
            ("service",),
        ),
        "policySet": Channel(
            s.POLICY_SET,
            ("Policy",),
            f"Request: store a policy under its scope (core NATS, queue group "
            f"`{s.POLICY_QUEUE}`). The revision is set by the store; an invalid policy is "
            "refused with the reason and dead-lettered.",
        ),
        "policyGet": Channel(
            s.POLICY_GET,
            ("PolicyScope", "WorkloadRef"),
            f"Request: the effective policy of a scope, or of a workload (core NATS, queue group "
            f"`{s.POLICY_QUEUE}`); the reply's policy scope says whose it is.",
        ),
        "policyList": Channel(
            s.POLICY_LIST,
            ("AnyRequest",),
            f"Request: every stored policy, ordered by scope key (core NATS, queue group "
            f"`{s.POLICY_QUEUE}`).",
        ),
        "policyReply": Channel(
            None,
            ("PolicyReply",),
            "The reply to a policy request, on the requester's inbox (the request's reply "
            "subject).",
        ),
    }
    for name, bucket in described(BUCKETS, "_BUCKET").items():
        value = getattr(s, name)
        message = bucket.model.__name__ if bucket.model else raw_message_name(name)
        found[camel(value)] = Channel(
            f"$KV.{value}.{{key}}",
            (message,),
            f"KV bucket `{value}`. {bucket.description}",
            ("key",),
            {"x-kv-bucket": value},
        )
    return found


def operations() -> dict[str, Operation]:
    s = subjects
    ops = {
        "ingestSendsUsage": Operation(
            "send",
            "usage",
            ("ingest",),
            "Ingest publishes each validated sample alone (FRACPILOT_USAGE_WIRE=sample).",
        ),
        "ingestSendsUsageBatches": Operation(
            "send",
            "usageBatches",
            ("ingest",),
            "Ingest publishes each partition's samples of an instant, without waiting for each "
            "acknowledgement (FRACPILOT_PUBLISH_WINDOW outstanding at most, one per partition "
            "at a time, retried with the same id).",
        ),
        "decisionReceivesUsageBatches": Operation(
            "receive",
            "usageBatches",
            ("decision",),
            f"The same consumers `{s.DECISION_CONSUMER_PREFIX}<partition>` as the per-sample "
            "messages: the partition stream holds both.",
        ),
        "ingestSendsUsageView": Operation(
            "send", "usageView", ("ingest",), "Each sample of a batch once it is stored."
        ),
        "integrationsReceiveUsageView": Operation(
            "receive", "usageView", ("integrations",), "Subscribe to a workload or to all."
        ),
        "decisionReceivesUsage": Operation(
            "receive",
            "usage",
            ("decision",),
            f"Durable pull consumers `{s.DECISION_CONSUMER_PREFIX}<partition>` "
            "(explicit acks, redelivery, dead letter after FRACPILOT_MAX_DELIVER).",
        ),
        "decisionSendsDecisions": Operation(
            "send", "decisions", ("decision",), "A decision when the engine changes a fraction."
        ),
        "actuatorReceivesDecisions": Operation(
            "receive",
            "decisions",
            ("actuator",),
            f"Durable pull consumer `{s.ACTUATOR_CONSUMER}`; each decision is claimed in KV "
            "before it is acted on.",
        ),
        "actuatorSendsActuations": Operation(
            "send", "actuations", ("actuator",), "One result per decision (and per later stage)."
        ),
        "cliReceivesActuations": Operation(
            "receive",
            "actuations",
            ("cli",),
            "`fracpilot demo`, `status`, `explain` and `report` read the results.",
        ),
        "actuatorSendsConsolidationReports": Operation(
            "send",
            "consolidationReports",
            ("actuator",),
            "The leader, when its consolidation plan's summary changes (the simulated cluster "
            "too, for the demo).",
        ),
        "cliReceivesConsolidationReports": Operation(
            "receive",
            "consolidationReports",
            ("cli",),
            "`fracpilot status` (the latest: would free N GPUs / M nodes) and `report`.",
        ),
        "actuatorSendsConsolidationMoves": Operation(
            "send", "consolidationMoves", ("actuator",), "Auto mode: each move and node freed."
        ),
        "cliReceivesConsolidationMoves": Operation(
            "receive",
            "consolidationMoves",
            ("cli",),
            "`fracpilot status` (freed today), `report` (over its window) and `demo`.",
        ),
        "servicesSendDeadLetters": Operation(
            "send",
            "deadLetters",
            ("ingest", "decision", "actuator", "dcgm-exporter-simulator"),
            "Every service dead-letters what it cannot accept and keeps going.",
        ),
    }
    for verb in ("Set", "Get", "List"):
        ops[f"cliRequestsPolicy{verb}"] = Operation(
            "send", f"policy{verb}", ("cli",), f"`fracpilot policy {verb.lower()}`.", "policyReply"
        )
        ops[f"decisionRepliesPolicy{verb}"] = Operation(
            "receive",
            f"policy{verb}",
            ("decision",),
            "Answered by one decision replica of the queue group.",
            "policyReply",
        )
    kv_ops = {
        "POLICY_BUCKET": (("decision",), ("decision",)),
        "ALLOCATION_BUCKET": (("actuator",), ("ingest", "cli", "dcgm-exporter-simulator")),
        "TARGET_BUCKET": (("actuator",), ("actuator",)),
        "INGEST_STATE_BUCKET": (("ingest",), ("ingest",)),
        "ACTUATOR_STATE_BUCKET": (("actuator",), ("actuator",)),
        "DECISION_STATE_BUCKET": (("decision",), ("decision",)),
        "DECISION_PARTITION_BUCKET": (("decision",), ("decision",)),
        "INGEST_SHARD_BUCKET": (("ingest",), ("ingest",)),
    }
    for name in described(BUCKETS, "_BUCKET"):
        writers, readers = kv_ops[name]
        channel = camel(getattr(s, name))
        ops[f"{channel}Put"] = Operation(
            "send", channel, writers, f"{', '.join(writers)} write(s) the bucket."
        )
        ops[f"{channel}Watch"] = Operation(
            "receive", channel, readers, f"{', '.join(readers)} read(s) or watch(es) it."
        )
    return ops


def described(table: dict[str, Any], suffix: str) -> dict[str, Any]:
    """The table's entries, checked against every name in subjects.py with this suffix."""
    names = {n for n in vars(subjects) if n.isupper() and n.endswith(suffix)}
    missing = names - set(table)
    if missing:
        raise ValueError(
            f"subjects.py names {sorted(missing)}: describe them in {__name__} "
            "(BUCKETS, STREAMS, CONSUMERS or OTHER_NAMES), then run `fracpilot asyncapi`"
        )
    return {name: table[name] for name in sorted(table) if name in names}


def check_names_described() -> None:
    described = {*STREAMS, *CONSUMERS, *OTHER_NAMES, *BUCKETS}
    described |= {"POLICY_SET", "POLICY_GET", "POLICY_LIST"}
    for name, value in vars(subjects).items():
        if not name.isupper() or not isinstance(value, str):
            continue
        if name.endswith("_PREFIX") and value.startswith("fracpilot."):
            continue  # subject prefixes: the channels' addresses
        if name not in described:
            raise ValueError(
                f"subjects.{name} = {value!r} is not described in {__name__}: add it, then run "
                "`fracpilot asyncapi`"
            )


def camel(bucket: str) -> str:
    head, *rest = bucket.split("_")
    return head + "".join(part.capitalize() for part in rest)


def raw_message_name(constant: str) -> str:
    return "".join(p.capitalize() for p in constant.removesuffix("_BUCKET").split("_")) + "Value"
