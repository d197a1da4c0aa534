"""A stretch of history read back from Prometheus, made into ``UsageSample``s instant by
instant, through the same steps as ingest's live path: :func:`observe_points` (mappings and
attribution), the signals tracker (vLLM preemptions become contention events), and
:func:`to_sample` (validation). ``fracpilot recommend`` uses it; nothing here talks to a server.

Pure and incremental: feed it the instants of each chunk in time order (:meth:`add`), so that a
long range never sits in memory as raw points. Time is the instant's own (history is never
stale), and a re-read instant is a duplicate here as it is in ingest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fracpilot_libs.contracts import UsageSample, WorkloadRef
from fracpilot_libs.usage.attribution import (
    GpuInventory,
    MetricPoint,
    Observation,
    PodKey,
    Rejection,
    observe_points,
)
from fracpilot_libs.usage.mappings import Level, MappingTable
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from fracpilot_libs.usage.signals import SignalTracker

OwnerOf = Callable[[str, str], WorkloadRef]  # (namespace, pod) -> the pod's workload


@dataclass
class History:
    """Samples built so far, per workload key in time order, and what was left out."""

    table: MappingTable
    owner_of: OwnerOf
    source: str = "prometheus"
    inventory: GpuInventory = field(default_factory=GpuInventory)
    samples: dict[str, list[UsageSample]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    first_rejection: dict[str, str] = field(default_factory=dict)  # reason -> one example
    families: set[str] = field(default_factory=set)  # the mapping families seen
    # pods with a container's own numbers (HAMi-core: a memory limit it enforces)
    enforced_pods: set[tuple[str, str]] = field(default_factory=set)
    _published: PublishedSeries = field(default_factory=PublishedSeries)
    _signals: SignalTracker = field(default_factory=SignalTracker)
    _owners: dict[tuple[str, str], WorkloadRef] = field(default_factory=dict)

    def add(self, points: list[MetricPoint]) -> None:
        """The points of one instant (instants in time order)."""
        self._note_families(points)
        observations, rejections = observe_points(points, self.table, self.inventory)
        # In UUID order, as attribution gave them before it kept the source's order: a
        # workload's samples of one instant are weighed, sized and summed in this order
        # (analysis.accounting), so a report does not move with Prometheus' series order.
        observations.sort(key=_gpu_uuid)
        for obs in observations:
            now = obs.timestamp
            obs = self._signals.mark(obs)
            workload = self._owner(obs.pod)
            fraction = self.inventory.fractions.get(obs.gpu_uuid, {}).get(
                PodKey(obs.pod.namespace, obs.pod.pod)
            )
            result = to_sample(obs, workload, self.source, now, math.inf, self._published, fraction)
            if isinstance(result, Rejection):
                rejections.append(result)
                continue
            self._signals.published(obs, now)
            self.samples.setdefault(workload.key, []).append(result)
        self._reject(rejections)

    def add_all(self, instants: Iterable[list[MetricPoint]]) -> None:
        for points in instants:
            self.add(points)

    @property
    def sample_count(self) -> int:
        return sum(len(s) for s in self.samples.values())

    def _owner(self, pod: PodKey) -> WorkloadRef:
        key = (pod.namespace, pod.pod)
        owner = self._owners.get(key)
        if owner is None:
            owner = self._owners[key] = self.owner_of(*key)
        return owner

    def _note_families(self, points: list[MetricPoint]) -> None:
        for point in points:
            row = self.table.match(point.metric, dict(point.labels))
            if row is None:
                continue
            self.families.add(row.family)
            if row.level is Level.CONTAINER:
                labels = point.labels
                ns = next((labels[n] for n in row.roles.namespace if labels.get(n)), "")
                pod = next((labels[n] for n in row.roles.pod if labels.get(n)), "")
                if ns and pod:
                    self.enforced_pods.add((ns, pod))

    def _reject(self, rejections: list[Rejection]) -> None:
        for r in rejections:
            self.rejected[r.reason] += 1
            self.first_rejection.setdefault(r.reason, r.detail)


def _gpu_uuid(obs: Observation) -> str:
    return obs.gpu_uuid
