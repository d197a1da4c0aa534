"""Ingest's metrics: what it published, rejected and failed to read (:class:`IngestMetrics`), and
what it tells the dashboard about each workload (:class:`WorkloadUsageMetrics`): the fraction
it holds against the compute and memory it uses (ratios, 0..1), and the GPU time (in
GPU-seconds, Prometheus's base unit; the dashboard shows hours) and money that fraction saves
against whole GPUs.

Ingest sees every sample, so it is where these numbers are counted. Each sample stands for
one step of its source (the query or scrape interval, the simulator's step) of one pod on
one GPU: a whole GPU would cost that many GPU-hours at the GPU model's price, the pod's
fraction costs its share of them, and the difference is saved. A pod not placed yet (no
fraction known) holds a whole GPU and saves nothing, as the demo's run summary counts it.

Per-workload series are capped (``FRACPILOT_WORKLOAD_METRICS_LIMIT``): workloads beyond the
cap have no gauges, and their counts go to ``namespace="_other", workload="_other"`` so the
totals stay right. A workload not seen for ``FRACPILOT_WORKLOAD_METRICS_TTL_S`` has its series
removed (:meth:`WorkloadUsageMetrics.expire`), so a deleted workload leaves no frozen gauge.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.series_expiry import LastSeen

OTHER = "_other"
OTHER_LABELS = (OTHER, OTHER)
LABELS = ("namespace", "workload")
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class SampleCost:
    """GPU-hours and USD one sample stands for, as whole GPUs and as allocated."""

    whole_gpu_hours: float
    allocated_gpu_hours: float
    whole_usd: float
    allocated_usd: float

    @property
    def saved_gpu_hours(self) -> float:
        return self.whole_gpu_hours - self.allocated_gpu_hours

    @property
    def saved_usd(self) -> float:
        return self.whole_usd - self.allocated_usd


def sample_cost(
    sample: UsageSample, step_s: float, prices: GpuPrices, hourly: float | None = None
) -> SampleCost:
    """What one sample of a source with this step costs (pure). ``hourly``: the price of its
    GPU model when the caller knows it already (else looked up in ``prices``)."""
    if step_s < 0:
        raise ValueError(f"step_s must be >= 0, got {step_s}")
    hours = step_s / 3600.0
    fraction = 1.0 if sample.allocated_fraction is None else sample.allocated_fraction
    if hourly is None:
        hourly = prices.hourly(sample.gpu_model)
    return SampleCost(
        whole_gpu_hours=hours,
        allocated_gpu_hours=hours * fraction,
        whole_usd=hours * hourly,
        allocated_usd=hours * fraction * hourly,
    )


class _Series:
    """One workload's children of the per-workload metrics (what ``Metric.labels()`` returns:
    it checks and locks on every call, so it is called once per workload, not per sample).
    A gauge's child is made when first set: one never set is not exported."""

    __slots__ = ("allocated", "compute", "counters", "memory")

    def __init__(self, counters: tuple[Counter, ...]) -> None:
        self.counters = counters  # whole, allocated, saved seconds; whole, allocated, saved USD
        self.allocated: Gauge | None = None
        self.compute: Gauge | None = None
        self.memory: Gauge | None = None

    def count(
        self, whole_h: float, allocated_h: float, whole_usd: float, allocated_usd: float
    ) -> None:
        """Add GPU-hours and USD, as whole GPUs and as allocated, to the counters."""
        whole_s, allocated_s, saved_s, whole_c, allocated_c, saved_c = self.counters
        whole_s.inc(whole_h * SECONDS_PER_HOUR)
        allocated_s.inc(allocated_h * SECONDS_PER_HOUR)
        saved_s.inc((whole_h - allocated_h) * SECONDS_PER_HOUR)
        whole_c.inc(whole_usd)
        allocated_c.inc(allocated_usd)
        saved_c.inc(whole_usd - allocated_usd)


class WorkloadUsageMetrics:
    """Per-workload gauges and counters in a service's registry.

    A workload not seen for ``ttl_s`` (deleted, scaled to zero, no longer measured) has its
    series removed (:meth:`expire`), and its place under the cap is free again."""

    def __init__(
        self, registry: CollectorRegistry, prices: GpuPrices, limit: int, ttl_s: float = 600.0
    ) -> None:
        self.prices = prices
        self.limit = limit
        self.seen: LastSeen[tuple[str, str]] = LastSeen(ttl_s)
        self.allocated_ratio = Gauge(
            "fracpilot_workload_allocated_ratio",
            "Fraction of one GPU the workload's pod holds, 0..1 (latest sample)",
            LABELS,
            registry=registry,
        )
        self.compute_ratio = Gauge(
            "fracpilot_workload_compute_ratio",
            "Share of a whole GPU's compute the workload's pod uses, 0..1 (latest sample)",
            LABELS,
            registry=registry,
        )
        self.memory_ratio = Gauge(
            "fracpilot_workload_memory_ratio",
            "Share of the GPU's memory the workload's pod uses, 0..1 (latest sample)",
            LABELS,
            registry=registry,
        )
        self.whole_seconds = Counter(
            "fracpilot_gpu_whole_seconds_total",
            "GPU-seconds the samples stand for as whole GPUs",
            LABELS,
            registry=registry,
        )
        self.allocated_seconds = Counter(
            "fracpilot_gpu_allocated_seconds_total",
            "GPU-seconds the samples' fractions hold",
            LABELS,
            registry=registry,
        )
        self.saved_seconds = Counter(
            "fracpilot_gpu_saved_seconds_total",
            "GPU-seconds saved: whole minus allocated",
            LABELS,
            registry=registry,
        )
        self.whole_usd = Counter(
            "fracpilot_cost_whole_usd_total",
            "USD the samples would cost as whole GPUs",
            LABELS,
            registry=registry,
        )
        self.allocated_usd = Counter(
            "fracpilot_cost_allocated_usd_total",
            "USD the samples' fractions cost",
            LABELS,
            registry=registry,
        )
        self.saved_usd = Counter(
            "fracpilot_cost_saved_usd_total",
            "USD saved: whole GPUs minus fractions, priced by GPU model",
            LABELS,
            registry=registry,
        )
        self.overflow = Counter(
            "fracpilot_workload_metrics_overflow_total",
            "Samples of workloads beyond FRACPILOT_WORKLOAD_METRICS_LIMIT (counted as _other)",
            registry=registry,
        )
        self.expired = Counter(
            "fracpilot_workload_metrics_expired_total",
            "Workloads whose series were removed, not seen for FRACPILOT_WORKLOAD_METRICS_TTL_S",
            registry=registry,
        )
        self._per_workload: tuple[Gauge | Counter, ...] = (
            self.allocated_ratio,
            self.compute_ratio,
            self.memory_ratio,
            self.whole_seconds,
            self.allocated_seconds,
            self.saved_seconds,
            self.whole_usd,
            self.allocated_usd,
            self.saved_usd,
        )
        self._counters = self._per_workload[3:]  # the seconds and USD counters
        self._series: dict[tuple[str, str], _Series] = {}  # by workload labels
        self._hourly: dict[str, float] = {}  # USD per hour by GPU model (few models)

    def observe(self, sample: UsageSample, step_s: float, now: float) -> None:
        """Count one sample, seen at ``now`` (wall-clock seconds, for the TTL)."""
        self.observe_all((sample,), step_s, now)

    def observe_all(self, samples: Iterable[UsageSample], step_s: float, now: float) -> None:
        """Count samples (a batch's), seen at ``now``: the arithmetic of :func:`sample_cost`
        inline, each workload's children at hand, and the samples beyond the cap summed into
        ``_other`` once (with the default cap of 500, nearly every sample of a large cluster:
        seven counter increments each took 4 µs of a cycle's ~50 per sample)."""
        if step_s < 0:
            raise ValueError(f"step_s must be >= 0, got {step_s}")
        hours = step_s / SECONDS_PER_HOUR
        seen, limit, prices = self.seen, self.limit, self._hourly
        # Whether the cap is reached, and the workloads seen (a live view): read per sample
        # without a Python call; ``full`` changes only when a workload is touched.
        known, full = seen.keys(), len(seen) >= limit
        beyond = 0  # samples beyond the cap, and what they add up to
        other_whole_h = other_allocated_h = other_whole_usd = other_allocated_usd = 0.0
        for sample in samples:
            # The price lookup parses the model name: once per model, not per sample.
            model = sample.gpu_model
            if (hourly := prices.get(model)) is None:
                if len(prices) >= 1024:  # labels are the exporters': bounded all the same
                    prices.clear()
                hourly = prices[model] = self.prices.hourly(model)
            fraction = sample.allocated_fraction
            allocated_hours = hours if fraction is None else hours * fraction
            workload = sample.workload
            labels = (workload.namespace, workload.owner_name)
            if full and labels not in known:  # beyond the cap
                beyond += 1
                other_whole_h += hours
                other_allocated_h += allocated_hours
                other_whole_usd += hours * hourly
                other_allocated_usd += allocated_hours * hourly
                continue
            seen.touch(labels, now)
            full = len(known) >= limit
            if (series := self._series.get(labels)) is None:
                series = self._series[labels] = self._new_series(labels)
            if fraction is not None:
                if series.allocated is None:
                    series.allocated = self.allocated_ratio.labels(*labels)
                series.allocated.set(fraction)
            if series.compute is None:
                series.compute = self.compute_ratio.labels(*labels)
                series.memory = self.memory_ratio.labels(*labels)
            series.compute.set(sample.compute)
            assert series.memory is not None
            series.memory.set(sample.memory_share)
            series.count(hours, allocated_hours, hours * hourly, allocated_hours * hourly)
        if beyond:
            self.overflow.inc(beyond)
            if (series := self._series.get(OTHER_LABELS)) is None:
                series = self._series[OTHER_LABELS] = self._new_series(OTHER_LABELS)
            series.count(other_whole_h, other_allocated_h, other_whole_usd, other_allocated_usd)

    def _new_series(self, labels: tuple[str, str]) -> _Series:
        return _Series(tuple(metric.labels(*labels) for metric in self._counters))

    def expire(self, now: float) -> list[tuple[str, str]]:
        """Remove the series of workloads not seen for the TTL; returns their labels.

        Counters of a removed workload start again from 0 if it comes back: ``rate`` and
        ``increase`` read that as a counter reset."""
        gone = self.seen.expire(now)
        for labels in gone:
            self._remove(labels)
        self.expired.inc(len(gone))
        return gone

    def forget(self, namespace: str, workload: str) -> bool:
        """Remove a workload's series now (it was deleted); False if it had none."""
        labels = (namespace, workload)
        if not self.seen.forget(labels):
            return False
        self._remove(labels)
        self.expired.inc()
        return True

    def _remove(self, labels: tuple[str, str]) -> None:
        self._series.pop(labels, None)
        for metric in self._per_workload:
            with contextlib.suppress(KeyError):  # a gauge never set (no fraction known)
                metric.remove(*labels)


class IngestMetrics:
    """The service's own series; names and labels as the dashboards and alerts read them."""

    def __init__(
        self,
        registry: CollectorRegistry,
        prices: GpuPrices,
        workload_limit: int,
        workload_ttl_s: float = 600.0,
    ) -> None:
        self.published = Counter(
            "fracpilot_ingest_samples_published_total",
            "Samples published",
            ["source", "attribution"],
            registry=registry,
        )
        self.rejected = Counter(
            "fracpilot_ingest_samples_rejected_total",
            "Points or samples rejected, by reason",
            ["source", "reason"],
            registry=registry,
        )
        self.source_errors = Counter(
            "fracpilot_ingest_source_errors_total",
            "Failed queries or scrapes",
            ["source"],
            registry=registry,
        )
        self.source_crashes = Counter(
            "fracpilot_ingest_source_crashes_total",
            "Usage source tasks that raised (each restarted after a pause)",
            ["source"],
            registry=registry,
        )
        self.query_seconds = Histogram(
            "fracpilot_ingest_query_seconds",
            "Time to query or scrape a source",
            ["source"],
            registry=registry,
        )
        self.lag = Gauge(
            "fracpilot_ingest_lag_seconds",
            "How far the newest published sample is behind now",
            ["source"],
            registry=registry,
        )
        self.sim_time = Gauge(
            "fracpilot_ingest_sim_time_seconds",
            "Simulated time of the last sample (unix seconds)",
            registry=registry,
        )
        self.usage = WorkloadUsageMetrics(registry, prices, workload_limit, workload_ttl_s)
