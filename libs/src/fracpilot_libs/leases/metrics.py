"""The metrics of a replica's leases: parts owned, replicas seen, moves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LeaseMetrics:
    """``fracpilot_<service>_<part>s_owned``, ``fracpilot_<service>_replicas`` and
    ``fracpilot_<service>_<part>_moves_total``."""

    def __init__(
        self, registry: CollectorRegistry, *, service: str, part: str, owned_help: str
    ) -> None:
        self.owned = Gauge(f"fracpilot_{service}_{part}s_owned", owned_help, registry=registry)
        self.replicas = Gauge(
            f"fracpilot_{service}_replicas",
            f"{service.capitalize()} replicas alive, as this replica last saw them",
            registry=registry,
        )
        self.moves = Counter(
            f"fracpilot_{service}_{part}_moves_total",
            f"{part.capitalize()}s this replica claimed, handed over, or dropped (its lease lost)",
            ["move"],
            registry=registry,
        )
