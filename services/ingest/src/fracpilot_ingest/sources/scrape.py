"""The ``scrape`` source: read exporters' ``/metrics`` directly, no Prometheus needed.

The exposition text is parsed with prometheus-client's parser. Each target's series get an
``instance`` label (host:port) as Prometheus would add, and the scrape's time aligned to the
step, so the two sources produce the same samples for the same exporter.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

from fracpilot_ingest.attribution import MetricPoint
from fracpilot_ingest.sources.prometheus import aligned


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


class ScrapeSource:
    """Blocking HTTP (urllib): call it from a worker thread."""

    def __init__(
        self,
        targets: Sequence[str],
        metric_names: Sequence[str],
        step_s: float,
        timeout_s: float = 10.0,
    ) -> None:
        self.targets = list(targets)
        self.wanted = set(metric_names)
        self.step_s = step_s
        self.timeout_s = timeout_s

    def scrape(self, target: str, now: float) -> list[MetricPoint]:
        """One target's points at ``now`` aligned to the step; raises OSError on failure."""
        url = target if "://" in target else f"http://{target}/metrics"
        with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
        instance = urlparse(url).netloc
        return parse_exposition(text, self.wanted, instance, aligned(now, self.step_s))
