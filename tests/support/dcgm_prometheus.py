"""dcgm-exporter's pod as Prometheus's Kubernetes discovery labels its targets, and a real
Prometheus scraping a test exporter that serves GPUs as dcgm-exporter does (the ingest tests'
source)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

from support.gpu_exporter import GpuState, GpuTestExporter, dcgm_metrics
from support.prometheus_server import PrometheusServer, ScrapeTarget

DCGM_POD = {"namespace": "gpu-operator", "pod": "dcgm-exporter-x7k2p", "container": "exporter"}


@contextlib.contextmanager
def dcgm_prometheus(
    gpus: Sequence[GpuState], step: float, *, history_s: float = 0.0
) -> Iterator[PrometheusServer]:
    """``gpus`` served as dcgm-exporter with per-process series at ``/dcgm``, scraped every
    ``step`` s as job ``dcgm`` with :data:`DCGM_POD`'s labels; yielded once the series are in
    and, with ``history_s``, once Prometheus holds that much history (a back-fill reads it)."""
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_metrics(gpus, per_process=True), "/dcgm")
        target = ScrapeTarget("dcgm", exporter.address, "/dcgm", labels=DCGM_POD)
        with PrometheusServer([target], scrape_interval=step) as server:
            server.wait_for_targets_up(timeout=30)
            server.wait_for_series('DCGM_FI_DEV_FB_USED{job="dcgm"}', timeout=30)
            deadline = time.monotonic() + 30
            while history_s:
                start = time.time() - history_s
                if server.query_range("DCGM_FI_DEV_FB_USED", start, start + 2 * step, step=step):
                    break
                assert time.monotonic() < deadline, "Prometheus gathered no history"
                time.sleep(0.5)
            yield server
