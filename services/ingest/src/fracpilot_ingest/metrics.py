"""Ingest's metrics: what it published, rejected and failed to read (:class:`IngestMetrics`), and
what it tells the dashboard about each workload (:class:`WorkloadUsageMetrics`): the fraction
it holds against the compute and memory it uses, and the GPU-hours and money that fraction
saves against whole GPUs.

Ingest sees every sample, so it is where these numbers are counted. Each sample stands for
one step of its source (the query or scrape interval, the simulator's step) of one pod on
one GPU: a whole GPU would cost that many GPU-hours at the GPU model's price, the pod's
fraction costs its share of them, and the difference is saved. A pod not placed yet (no
fraction known) holds a whole GPU and saves nothing, as the demo's run summary counts it.

Per-workload series are capped (``FRACPILOT_WORKLOAD_METRICS_LIMIT``): workloads beyond the
cap have no gauges, and their counts go to ``namespace="_other", workload="_other"`` so the
totals stay right.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.pricing import GpuPrices

OTHER = "_other"
LABELS = ("namespace", "workload")


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


def sample_cost(sample: UsageSample, step_s: float, prices: GpuPrices) -> SampleCost:
    """What one sample of a source with this step costs (pure)."""
    if step_s < 0:
        raise ValueError(f"step_s must be >= 0, got {step_s}")
    hours = step_s / 3600.0
    fraction = 1.0 if sample.allocated_fraction is None else sample.allocated_fraction
    hourly = prices.hourly(sample.gpu_model)
    return SampleCost(
        whole_gpu_hours=hours,
        allocated_gpu_hours=hours * fraction,
        whole_usd=hours * hourly,
        allocated_usd=hours * fraction * hourly,
    )


class WorkloadUsageMetrics:
    """Per-workload gauges and counters in a service's registry."""

    def __init__(self, registry: CollectorRegistry, prices: GpuPrices, limit: int) -> None:
        self.prices = prices
        self.limit = limit
        self._tracked: set[tuple[str, str]] = set()

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry)

        self.fraction = gauge(
            "fracpilot_workload_allocated_fraction",
            "Fraction of a GPU the workload's pod holds (latest sample)",
        )
        self.compute = gauge(
            "fracpilot_workload_compute_share",
            "Share of a whole GPU's compute the workload's pod uses (latest sample)",
        )
        self.memory = gauge(
            "fracpilot_workload_memory_share",
            "Share of the GPU's memory the workload's pod uses (latest sample)",
        )
        self.whole_hours = counter(
            "fracpilot_gpu_hours_whole_total", "GPU-hours the samples stand for as whole GPUs"
        )
        self.allocated_hours = counter(
            "fracpilot_gpu_hours_allocated_total", "GPU-hours the samples' fractions hold"
        )
        self.saved_hours = counter(
            "fracpilot_gpu_hours_saved_total", "GPU-hours saved: whole minus allocated"
        )
        self.whole_usd = counter(
            "fracpilot_cost_whole_usd_total", "USD the samples would cost as whole GPUs"
        )
        self.allocated_usd = counter(
            "fracpilot_cost_allocated_usd_total", "USD the samples' fractions cost"
        )
        self.saved_usd = counter(
            "fracpilot_cost_saved_usd_total",
            "USD saved: whole GPUs minus fractions, priced by GPU model",
        )
        self.overflow = Counter(
            "fracpilot_workload_metrics_overflow_total",
            "Samples of workloads beyond FRACPILOT_WORKLOAD_METRICS_LIMIT (counted as _other)",
            registry=registry,
        )

    def _labels(self, sample: UsageSample) -> tuple[str, str] | None:
        """The workload's labels, or None when it is beyond the cap."""
        key = (sample.workload.namespace, sample.workload.owner_name)
        if key in self._tracked:
            return key
        if len(self._tracked) < self.limit:
            self._tracked.add(key)
            return key
        return None

    def observe(self, sample: UsageSample, step_s: float) -> SampleCost:
        cost = sample_cost(sample, step_s, self.prices)
        labels = self._labels(sample)
        if labels is None:
            self.overflow.inc()
            labels = (OTHER, OTHER)
        else:
            if sample.allocated_fraction is not None:
                self.fraction.labels(*labels).set(sample.allocated_fraction)
            self.compute.labels(*labels).set(sample.compute)
            self.memory.labels(*labels).set(sample.memory_share)
        self.whole_hours.labels(*labels).inc(cost.whole_gpu_hours)
        self.allocated_hours.labels(*labels).inc(cost.allocated_gpu_hours)
        self.saved_hours.labels(*labels).inc(cost.saved_gpu_hours)
        self.whole_usd.labels(*labels).inc(cost.whole_usd)
        self.allocated_usd.labels(*labels).inc(cost.allocated_usd)
        self.saved_usd.labels(*labels).inc(cost.saved_usd)
        return cost


class IngestMetrics:
    """The service's own series; names and labels as the dashboards and alerts read them."""

    def __init__(self, registry: CollectorRegistry, prices: GpuPrices, workload_limit: int) -> None:
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
        self.usage = WorkloadUsageMetrics(registry, prices, workload_limit)
