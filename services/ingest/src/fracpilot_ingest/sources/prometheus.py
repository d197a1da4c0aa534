"""The ``prometheus`` source: range queries through prometheus-api-client, on an interval, from
a cursor kept in NATS KV, so a restart or an outage of Prometheus is caught up (the missed
range, once) and a first start back-fills.

One query fetches every mapped metric (``{__name__=~"a|b|..."}``) over a time range at a fixed
step; timestamps are aligned to the step so that a restart or a catch-up asks for exactly the
same instants again (and the de-duplication downstream recognises them). A long range is
fetched in chunks that stay under Prometheus' 11,000 points per series.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from fracpilot_ingest.attribution import MetricPoint
from fracpilot_ingest.settings import PrometheusSettings
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_ingest.sources.http_auth import prometheus_session
from fracpilot_libs.nats.kv import KvBucket

log = logging.getLogger(__name__)
MAX_POINTS_PER_QUERY = 10_000
CURSOR_KEY = "prometheus.cursor"


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


class RangeQueryClient:
    """Blocking client (requests underneath): call it from a worker thread.

    TLS is verified (``ca_file`` or the system's CAs) unless ``verify_tls`` is off; a bearer
    token file and extra headers are sent with every request (:mod:`.http_auth`)."""

    def __init__(
        self,
        settings: PrometheusSettings,
        metric_names: Sequence[str],
        step_s: float,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = settings.url
        self.query = selector(metric_names, settings.matchers)
        self.step_s = step_s
        self.timeout_s = timeout_s
        session, auth = prometheus_session(settings)
        if not settings.verify_tls and settings.url.startswith("https:"):
            log.warning("Prometheus' certificate is not verified", extra={"url": settings.url})
        # One quick retry: the polling loop itself retries on the next interval, from its
        # cursor, so a long client-side backoff would only delay noticing an outage.
        self._client = PrometheusConnect(
            url=settings.url,
            session=session,
            auth=auth,  # any requests auth, despite its tuple hint
            retry=Retry(total=1, backoff_factor=0.1),
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


class PrometheusSource:
    """The source: one range query per interval, from the cursor to now (minus the delay)."""

    name = "prometheus"

    def __init__(
        self,
        settings: PrometheusSettings,
        *,
        interval_s: float,
        backfill_s: float,
        context: SourceContext,
    ) -> None:
        self.interval_s = interval_s
        self.backfill_s = backfill_s
        self.delay_s = settings.delay_s
        self.context = context
        self.client = RangeQueryClient(settings, context.metric_names, interval_s)
        self.cursor = 0.0  # the last instant published
        self._end = 0.0  # the last instant asked for
        self._kv: KvBucket | None = None

    async def open(self) -> None:
        self._kv = await self.context.state()
        cursor = await _read_cursor(self._kv)
        if cursor is None:
            cursor = aligned(time.time() - self.backfill_s, self.interval_s) - self.interval_s
            log.info("first start: back-filling", extra={"seconds": self.backfill_s})
        self.cursor = cursor

    async def read(self) -> Reading:
        step = self.interval_s
        self._end = end = aligned(time.time() - self.delay_s, step)
        if end <= self.cursor:
            return Reading(step)
        metrics = self.context.metrics
        try:
            with metrics.query_seconds.labels(self.name).time():
                instants = await asyncio.to_thread(self.client.fetch, self.cursor + step, end)
        except Exception as exc:  # Prometheus down or broken: keep the cursor
            metrics.source_errors.labels(self.name).inc()
            log.warning(
                "prometheus query failed; will catch up",
                extra={"error": str(exc)[:300], "since": self.cursor},
            )
            return Reading(step)
        return Reading(step, instants=list(instants.values()), until=end)

    async def published(self, reading: Reading) -> None:
        if reading.until is None or self._kv is None:
            return
        end = reading.until
        if end - self.cursor > 2 * self.interval_s:
            log.info(
                "caught up",
                extra={"from": self.cursor, "to": end, "instants": len(reading.instants)},
            )
        self.cursor = end
        await self._kv.put(CURSOR_KEY, f"{end:.3f}".encode())
        self.context.published_series.forget_before(end - 2 * self.backfill_s - 3600)

    def next_read_in(self) -> float:
        return max(0.05, self._end + self.interval_s - time.time())


async def _read_cursor(kv: KvBucket) -> float | None:
    entry = await kv.get(CURSOR_KEY)
    if entry is None:
        return None
    try:
        return float(entry.value.decode())
    except ValueError:
        log.error("ingest cursor is corrupt; back-filling again")
        return None
