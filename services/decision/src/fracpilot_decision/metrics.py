"""Every metric the decision service exports (besides the bus's), by the part that counts it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fracpilot_libs.leases.metrics import LeaseMetrics
from fracpilot_libs.series_expiry import LastSeen

WORKLOAD_LABELS = ("namespace", "workload")  # as ingest's per-workload series


class DecisionMetrics:
    """The hot path: samples decided, decisions published, workloads held, lag."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.samples = Counter(
            "fracpilot_decision_samples_total", "Samples decided on", registry=registry
        )
        self.duplicates = Counter(
            "fracpilot_decision_duplicate_samples_total",
            "Samples delivered again after a hand-over or restart, already in the history",
            registry=registry,
        )
        self.decisions = Counter(
            "fracpilot_decision_decisions_total",
            "Decisions published",
            ["direction", "reason"],
            registry=registry,
        )
        self.workloads = Gauge(
            "fracpilot_decision_workloads",
            "Workloads with history on this replica",
            registry=registry,
        )
        self.lag = Histogram(
            "fracpilot_decision_sample_lag_seconds",
            "From a sample stored in the usage stream to its decision by this replica",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=registry,
        )


class CheckpointMetrics:
    """Checkpoints written, failed, restored and skipped as corrupt."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            "fracpilot_decision_checkpoints_written_total",
            "Workload state checkpoints written",
            registry=registry,
        )
        self.write_failures = Counter(
            "fracpilot_decision_checkpoint_write_failures_total",
            "Checkpoint writes that failed (retried at the next interval)",
            registry=registry,
        )
        self.restored = Counter(
            "fracpilot_decision_checkpoints_restored_total",
            "Workload states restored from checkpoints (on start and on claiming partitions)",
            registry=registry,
        )
        self.corrupt = Counter(
            "fracpilot_decision_checkpoints_corrupt_total",
            "Checkpoints that did not load and were skipped",
            registry=registry,
        )


def ownership_metrics(registry: CollectorRegistry) -> LeaseMetrics:
    """Partitions owned, replicas seen, partition moves."""
    return LeaseMetrics(
        owned=Gauge(
            "fracpilot_decision_partitions_owned",
            "Usage partitions this replica owns and consumes",
            registry=registry,
        ),
        replicas=Gauge(
            "fracpilot_decision_replicas",
            "Decision replicas alive, as this replica last saw them",
            registry=registry,
        ),
        moves=Counter(
            "fracpilot_decision_partition_moves_total",
            "Partitions this replica claimed, handed over, or dropped (its lease lost)",
            ["move"],
            registry=registry,
        ),
    )


class HeapMetrics:
    """The garbage collector kept off the workload states (:mod:`fracpilot_decision.heap`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.full_pause = Histogram(
            "fracpilot_gc_full_collection_seconds",
            "The periodic full garbage collections (everything unfrozen, collected, frozen)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.frozen = Gauge(
            "fracpilot_gc_frozen_objects",
            "Objects in the permanent generation, out of the collector's way",
            registry=registry,
        )


class RecommendationMetrics:
    """Per workload: the fraction the engine recommends and the share of a GPU it would free.

    Set for every workload of a decided batch, whether or not a decision was published (in
    recommend mode nothing is applied; the recommendation is still what platform teams read).
    At most ``limit`` workloads have series (the rest are left out, not summed: a fraction
    does not add up); a workload not decided for ``ttl_s`` (gone, or its partition moved to
    another replica) has its series removed."""

    def __init__(self, registry: CollectorRegistry, limit: int, ttl_s: float) -> None:
        self.limit = limit
        self.seen: LastSeen[tuple[str, str]] = LastSeen(ttl_s)
        self.recommended = Gauge(
            "fracpilot_workload_recommended_ratio",
            "Fraction of one GPU the decision engine recommends for the workload, 0..1",
            WORKLOAD_LABELS,
            registry=registry,
        )
        self.saving = Gauge(
            "fracpilot_workload_recommended_saving_ratio",
            "Share of one GPU the recommendation frees: held minus recommended "
            "(negative when the workload should grow)",
            WORKLOAD_LABELS,
            registry=registry,
        )
        self.left_out = Counter(
            "fracpilot_workload_recommendations_left_out_total",
            "Recommendations of workloads beyond FRACPILOT_WORKLOAD_METRICS_LIMIT (no series)",
            registry=registry,
        )

    def set(
        self, namespace: str, workload: str, held: float, recommended: float, now: float
    ) -> None:
        key = (namespace, workload)
        if key not in self.seen and len(self.seen) >= self.limit:
            self.left_out.inc()
            return
        self.seen.touch(key, now)
        self.recommended.labels(*key).set(recommended)
        self.saving.labels(*key).set(held - recommended)

    def expire(self, now: float) -> list[tuple[str, str]]:
        gone = self.seen.expire(now)
        self._remove(gone)
        return gone

    def _remove(self, keys: Iterable[tuple[str, str]]) -> None:
        for key in keys:
            for gauge in (self.recommended, self.saving):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
