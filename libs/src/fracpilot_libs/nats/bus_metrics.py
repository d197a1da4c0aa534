"""The metrics every service exposes about its NATS traffic (see :mod:`fracpilot_libs.nats.bus`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


def subject_prefix(subject: str) -> str:
    """A low-cardinality label for a subject: ``fracpilot.usage.v1`` or ``$KV.<bucket>``."""
    return ".".join(subject.split(".")[: 2 if subject.startswith("$KV.") else 3])


class BusMetrics:
    """Counters every service exposes about its traffic."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "fracpilot_bus_published_total",
            "Messages published",
            ["subject_prefix"],
            registry=registry,
        )
        self.duplicates = Counter(
            "fracpilot_bus_duplicates_total",
            "Publishes the server recognised as duplicates (same Nats-Msg-Id)",
            ["subject_prefix"],
            registry=registry,
        )
        self.publish_retries = Counter(
            "fracpilot_bus_publish_retries_total",
            "Publishes sent again (same Nats-Msg-Id) after no ack: a leader election, a restart",
            ["subject_prefix", "reason"],
            registry=registry,
        )
        self.publish_retry_seconds = Histogram(
            "fracpilot_bus_publish_retry_seconds",
            "Time from the first attempt of a publish that needed retries to its ack or its end",
            ["subject_prefix", "outcome"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            registry=registry,
        )
        self.consumed = Counter(
            "fracpilot_bus_consumed_total",
            "Messages handled and acknowledged",
            ["consumer"],
            registry=registry,
        )
        self.retried = Counter(
            "fracpilot_bus_retried_total",
            "Messages negatively acknowledged for a retry",
            ["consumer"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "fracpilot_dead_letters_total",
            "Messages dead-lettered, by reason kind",
            ["subject_prefix", "kind"],
            registry=registry,
        )
        self.requests = Counter(
            "fracpilot_bus_requests_total",
            "Requests served, by outcome (replied, or failed: the handler raised)",
            ["subject", "outcome"],
            registry=registry,
        )
        self.consumer_pending = Gauge(
            "fracpilot_consumer_pending_messages",
            "Messages in the stream not yet delivered to this consumer (its lag)",
            ["stream", "consumer"],
            registry=registry,
        )
        self.consumer_ack_pending = Gauge(
            "fracpilot_consumer_ack_pending_messages",
            "Messages delivered to this consumer and not yet acknowledged",
            ["stream", "consumer"],
            registry=registry,
        )
        self.handle_seconds = Histogram(
            "fracpilot_bus_handle_seconds",
            "Time to handle one message",
            ["consumer"],
            registry=registry,
        )
