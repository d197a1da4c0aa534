"""Every Prometheus metric of the actuator (names unchanged), by the component that counts:

- :class:`ActuatorMetrics`: decisions handled, resumed, Kubernetes API retries;
- :class:`LeaderMetrics`: leader election (:mod:`fracpilot_actuator.election.elector`);
- :class:`WebhookMetrics`: the admission webhook (:mod:`fracpilot_actuator.webhook`);
- :class:`PolicySyncMetrics`: the policy sync (FractionPolicy objects -> the policy bucket);
- :class:`ConsolidationMetrics`: emptying nodes (:mod:`fracpilot_actuator.kube.consolidation`).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fracpilot_actuator.admission import Admission, AdmissionOutcome

OnRetry = Callable[[str, str], None]


class ActuatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.actions = Counter(
            "fracpilot_actuator_actions_total",
            "Decisions handled",
            ["plan", "outcome"],
            registry=registry,
        )
        self.resumed = Counter(
            "fracpilot_actuator_resumed_total",
            "Decisions taken up again after an attempt that stopped before it finished",
            registry=registry,
        )
        self.held_back = Counter(
            "fracpilot_actuator_held_back_total",
            "Decisions not applied (recorded as recommendations, or skipped), by why: policy "
            "(its mode is recommend), not_opted_in (no fracpilot.io/mode=auto on the namespace "
            "or pod), off (fracpilot.io/mode=off, opted out or excluded), dry_run, multi_device "
            "(a KAI multi-device fraction pod), queue_limit (an upsize past a KAI queue's limit)",
            ["reason"],
            registry=registry,
        )
        for reason in ("policy", "not_opted_in", "off", "dry_run", "multi_device", "queue_limit"):
            self.held_back.labels(reason)
        self.kube_retries: Counter | None = None

    def track_kube_retries(self) -> OnRetry:
        """Register the Kubernetes API retry counter (backend=kubernetes) and count into it."""
        retries = self.kube_retries = Counter(
            "fracpilot_actuator_kube_retries_total",
            "Kubernetes API calls tried again (429, 5xx, no answer, 409 on a patch)",
            ["call", "reason"],
            registry=self.registry,
        )
        return lambda call, reason: retries.labels(call, reason).inc()


class LeaderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge(
            "fracpilot_actuator_leader",
            "1 while this actuator holds the leader Lease and may act, else 0",
            registry=registry,
        )
        self.transitions = Counter(
            "fracpilot_actuator_leader_transitions_total",
            "Times this actuator started or stopped leading",
            ["to"],
            registry=registry,
        )
        self.rounds = Counter(
            "fracpilot_actuator_lease_rounds_total",
            "Lease rounds (read, decide, write) by outcome",
            ["outcome"],
            registry=registry,
        )


_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.admissions = Counter(
            "fracpilot_webhook_admissions_total",
            "AdmissionReviews answered, by outcome (error: malformed, or failed: admitted as is)",
            ["outcome"],
            registry=registry,
        )
        for outcome in AdmissionOutcome:
            self.admissions.labels(outcome.value)
        self.malformed = Counter(
            "fracpilot_webhook_malformed_requests_total",
            "Requests to /mutate refused with a 4xx (not an AdmissionReview, not application/json, "
            "too large, too slow); also counted as error",
            registry=registry,
        )
        self.seconds = Histogram(
            "fracpilot_webhook_admission_seconds",
            "Time to answer one AdmissionReview, from the request headers to the response sent",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.targets = Gauge(
            "fracpilot_webhook_targets", "Workload targets held in memory", registry=registry
        )
        self.tls_reloads = Counter(
            "fracpilot_webhook_tls_reloads_total",
            "Serving certificate reloads, by result",
            ["result"],
            registry=registry,
        )
        self.llm_flags = Counter(
            "fracpilot_webhook_llm_server_flags_total",
            "Pods running a preallocating LLM server (vllm, sglang, tgi) given a target, by what "
            "became of its memory flag: rewritten, unchanged (already within the fraction), "
            "untouched (a form or value not read with certainty)",
            ["server", "result"],
            registry=registry,
        )
        self.llm_flag_above_fraction = Counter(
            "fracpilot_webhook_llm_flags_too_large_total",
            "Pods whose LLM server's memory flag asks for more than the pod's fraction "
            "(an Event with reason LlmServerFlagAboveFraction), by server and rewritten",
            ["server", "rewritten"],
            registry=registry,
        )

    def count_llm_server(self, admission: Admission) -> None:
        """Count an admission's LLM server flag (nothing when the pod runs none)."""
        rewrite = admission.llm
        if rewrite is None or rewrite.reading.server is None:
            return
        server = rewrite.reading.server.value
        result = (
            "untouched"
            if not rewrite.applies
            else "rewritten"
            if rewrite.changes
            else ("unchanged")
        )
        self.llm_flags.labels(server, result).inc()
        if admission.llm_warning and rewrite.reading.readable:
            rewritten = "true" if rewrite.changes else "false"
            self.llm_flag_above_fraction.labels(server, rewritten).inc()


class PolicySyncMetrics:
    """The policy sync (:mod:`fracpilot_actuator.policy_sync.controller`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.objects = Gauge(
            "fracpilot_actuator_policy_objects",
            "Policy objects by kind and state (ready, shadowed, invalid) after the last pass",
            ["kind", "state"],
            registry=registry,
        )
        self.invalid = Counter(
            "fracpilot_actuator_policy_invalid_total",
            "Policy objects found invalid (each generation once; also dead-lettered)",
            ["kind"],
            registry=registry,
        )
        self.writes = Counter(
            "fracpilot_actuator_policy_writes_total",
            "Policy bucket writes of the sync (put, delete) and status patches (status)",
            ["op"],
            registry=registry,
        )
        self.errors = Counter(
            "fracpilot_actuator_policy_sync_errors_total",
            "Sync passes or status patches that failed (tried again on the next pass)",
            ["stage"],
            registry=registry,
        )
        self.duration = Histogram(
            "fracpilot_actuator_policy_sync_duration_seconds",
            "Time of one sync pass",
            registry=registry,
        )


class ConsolidationMetrics:
    """Consolidation (backend=kubernetes): what it would free, what it moved and freed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.would_free_gpus = Gauge(
            "fracpilot_consolidation_would_free_gpus",
            "GPUs in use that the last consolidation plan would free (every pod not off "
            "counted as movable, in recommend and auto mode alike)",
            registry=registry,
        )
        self.would_free_nodes = Gauge(
            "fracpilot_consolidation_would_free_nodes",
            "Nodes the last consolidation plan would empty of GPU pods, for the autoscaler",
            registry=registry,
        )
        self.moves = Counter(
            "fracpilot_consolidation_moves_total",
            "Pods moved to empty a node, by result: verified (the replacement bound), "
            "failed (the eviction refused, or no replacement bound in time)",
            ["result"],
            registry=registry,
        )
        for result in ("verified", "failed"):
            self.moves.labels(result)
        self.freed_nodes = Counter(
            "fracpilot_consolidation_freed_nodes_total",
            "Nodes emptied of GPU pods by consolidation",
            registry=registry,
        )
        self.freed_gpus = Counter(
            "fracpilot_consolidation_freed_gpus_total",
            "GPUs of the nodes emptied by consolidation",
            registry=registry,
        )
