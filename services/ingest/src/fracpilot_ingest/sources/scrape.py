"""The ``scrape`` source: read exporters' ``/metrics`` directly, no Prometheus needed.

The exposition text is parsed with prometheus-client's parser. Each target's series get an
``instance`` label (host:port) as Prometheus would add, and the scrape's time aligned to the
step, so the two sources produce the same samples for the same exporter.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.range_queries import aligned

log = logging.getLogger(__name__)


def parse_exposition(text: str, wanted: set[str], instance: str, at: float) -> list[MetricPoint]:
    points = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name not in wanted:
                continue
            labels = {k: v for k, v in s.labels.items() if v != ""}  # as Prometheus stores
            labels.setdefault("instance", instance)
            points.append(MetricPoint(s.name, labels, float(s.value), at))
    return points


def scrape_targets(targets: str) -> list[str]:
    """``FRACPILOT_SCRAPE_TARGETS``: comma-separated host:port or URLs."""
    return [t.strip() for t in targets.split(",") if t.strip()]


class ScrapeSource:
    """Every target once per interval; one target down never stops the others."""

    name = "scrape"

    def __init__(
        self,
        targets: Sequence[str],
        *,
        interval_s: float,
        context: SourceContext,
        timeout_s: float = 10.0,
    ) -> None:
        self.targets = list(targets)
        self.wanted = set(context.metric_names)
        self.step_s = interval_s
        self.timeout_s = timeout_s
        self.context = context
        self._now = 0.0

    def scrape(self, target: str, now: float) -> list[MetricPoint]:
        """One target's points at ``now`` aligned to the step; raises OSError on failure.

        Blocking HTTP (urllib): call it from a worker thread.
        """
        url = target if "://" in target else f"http://{target}/metrics"
        with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
        instance = urlparse(url).netloc
        return parse_exposition(text, self.wanted, instance, aligned(now, self.step_s))

    async def open(self) -> None:
        return None

    async def read(self) -> Reading:
        self._now = now = time.time()
        metrics = self.context.metrics
        points: list[MetricPoint] = []
        for target in self.targets:
            try:
                with metrics.query_seconds.labels(self.name).time():
                    points.extend(await asyncio.to_thread(self.scrape, target, now))
            except Exception as exc:  # one target down never stops the others
                metrics.source_errors.labels(self.name).inc()
                log.warning("scrape failed", extra={"target": target, "error": str(exc)[:300]})
        return Reading(self.step_s, instants=[points] if points else ())

    async def published(self, reading: Reading) -> None:
        return None

    def next_read_in(self) -> float:
        return max(0.05, aligned(self._now, self.step_s) + self.step_s - time.time())
