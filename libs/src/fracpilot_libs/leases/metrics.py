"""The metrics of a replica's leases: parts owned, replicas seen, moves."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge


@dataclass(frozen=True)
class LeaseMetrics:
    """What :class:`~fracpilot_libs.leases.ownership.Ownership` sets: the parts this replica
    owns, the replicas it saw, and the parts it claimed, handed over or dropped (label
    ``move``). Each service makes them with names of its own, written out as literals (the
    metric-name rules read them: tests/unit/test_metric_names.py)."""

    owned: Gauge
    replicas: Gauge
    moves: Counter
