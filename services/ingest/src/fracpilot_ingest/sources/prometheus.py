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
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from fracpilot_ingest.settings import PrometheusSettings
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_ingest.sources.http_auth import prometheus_session
from fracpilot_libs.gc_pause import gc_paused
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.range_queries import aligned, chunks, points_by_instant, selector

log = logging.getLogger(__name__)
CURSOR_KEY = "prometheus.cursor"


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
        # The response parsed (in the client) and made points: a burst without cycles.
        with gc_paused():
            grid = chunks(aligned(start, self.step_s), aligned(end, self.step_s), self.step_s)
            for lo, hi in grid:
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
