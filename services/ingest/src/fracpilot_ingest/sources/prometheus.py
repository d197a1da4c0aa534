"""The ``prometheus`` source: range queries through prometheus-api-client.

One query fetches every mapped metric (``{__name__=~"a|b|..."}``) over a time range at a fixed
step; timestamps are aligned to the step so that a restart or a catch-up asks for exactly the
same instants again (and the de-duplication downstream recognises them). A long range is
fetched in chunks that stay under Prometheus' 11,000 points per series.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from fracpilot_ingest.attribution import MetricPoint

log = logging.getLogger(__name__)
MAX_POINTS_PER_QUERY = 10_000


def selector(metric_names: Sequence[str], matchers: str = "") -> str:
    """One PromQL selector for every mapped metric, plus optional label matchers."""
    names = "|".join(re.escape(n) for n in metric_names)
    # Inside a PromQL double-quoted string a backslash starts an escape, and `\.` is a parse
    # error: the regex's backslashes (and any quote) are escaped once more.
    names = names.replace("\\", "\\\\").replace('"', '\\"')
    extra = f", {matchers.strip()}" if matchers.strip() else ""
    return f'{{__name__=~"{names}"{extra}}}'


def aligned(ts: float, step_s: float) -> float:
    return math.floor(ts / step_s) * step_s


def chunks(start: float, end: float, step_s: float) -> list[tuple[float, float]]:
    """[start, end] cut into pieces of at most MAX_POINTS_PER_QUERY steps."""
    span = MAX_POINTS_PER_QUERY * step_s
    out = []
    while start <= end:
        stop = min(end, start + span - step_s)
        out.append((start, stop))
        start = stop + step_s
    return out


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return float(raw)
    except (ValueError, OverflowError):
        return None


def points_by_instant(result: Any) -> dict[float, list[MetricPoint]]:
    """A range-query result as metric points grouped by their timestamp.

    Whatever the response holds, this never raises: a series or point of the wrong shape (labels
    that are not strings, a point that is not ``[time, value]``, a time that is not a finite
    number) is left out and logged, so one bad series never stops the others; a value that is
    not a number becomes NaN, which attribution rejects with a reason.
    """
    instants: dict[float, list[MetricPoint]] = defaultdict(list)
    malformed = 0
    for series in result if isinstance(result, list) else [result]:
        metric = series.get("metric", {}) if isinstance(series, dict) else None
        values = series.get("values", []) if isinstance(series, dict) else None
        if (
            not isinstance(metric, dict)
            or not isinstance(values, list)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
        ):
            malformed += 1
            continue
        labels = dict(metric)
        name = labels.pop("__name__", "")
        for point in values:
            ts = _number(point[0]) if isinstance(point, list) and len(point) == 2 else None
            if ts is None or not math.isfinite(ts):
                malformed += 1
                continue
            value = _number(point[1])
            instants[ts].append(MetricPoint(name, labels, math.nan if value is None else value, ts))
    if malformed:
        log.warning("malformed parts of a range-query result left out", extra={"parts": malformed})
    return dict(instants)


class PrometheusSource:
    """Blocking client (requests underneath): call it from a worker thread."""

    def __init__(
        self,
        url: str,
        metric_names: Sequence[str],
        step_s: float,
        timeout_s: float = 30.0,
        matchers: str = "",
    ) -> None:
        self.url = url
        self.query = selector(metric_names, matchers)
        self.step_s = step_s
        self.timeout_s = timeout_s
        # One quick retry: the polling loop itself retries on the next interval, from its
        # cursor, so a long client-side backoff would only delay noticing an outage.
        self._client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1)
        )

    def fetch(self, start: float, end: float) -> dict[float, list[MetricPoint]]:
        """Every instant on the step grid in [start, end], in order."""
        merged: dict[float, list[MetricPoint]] = {}
        for lo, hi in chunks(aligned(start, self.step_s), aligned(end, self.step_s), self.step_s):
            result = self._client.custom_query_range(
                self.query,
                start_time=datetime.fromtimestamp(lo, UTC),
                end_time=datetime.fromtimestamp(hi, UTC),
                step=f"{self.step_s:g}s",
                timeout=int(self.timeout_s),
            )
            merged.update(points_by_instant(result))
        return dict(sorted(merged.items()))
