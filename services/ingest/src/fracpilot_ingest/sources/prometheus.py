"""The ``prometheus`` source: range queries (Prometheus' HTTP API, through requests), on an
interval, from a cursor kept in NATS KV, so a restart or an outage of Prometheus is caught up
(the missed range, once) and a first start back-fills.

One query fetches every mapped metric (``{__name__=~"a|b|..."}``) over a time range at a fixed
step; timestamps are aligned to the step so that a restart or a catch-up asks for exactly the
same instants again (and the de-duplication downstream recognises them). A long range is
fetched in chunks that stay under Prometheus' 11,000 points per series.

Sharded (:mod:`fracpilot_ingest.shards`), each cycle reads from the earliest cursor of the
shards this replica holds, publishes each shard's instants past its own cursor and moves the
cursors of those shards; the unsharded cursor is then the floor, the earliest of the shards'
(where a shard without a cursor starts, and where an unsharded ingest goes on from).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from fracpilot_ingest.settings import PrometheusSettings
from fracpilot_ingest.shard_plan import CURSOR_PREFIX, CyclePlan, LabelGroup
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_ingest.sources.http_auth import prometheus_session
from fracpilot_libs.gc_pause import gc_paused
from fracpilot_libs.nats.kv import KvBucket
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.range_queries import (
    aligned,
    chunks,
    gpu_selector,
    points_by_instant,
    selector,
)

log = logging.getLogger(__name__)
CURSOR_KEY = CURSOR_PREFIX  # the unsharded cursor (shard_plan: a shard's adds .<N>.<k>)


class PrometheusQueryError(Exception):
    """Prometheus answered a range query with an error status or a body that is not its JSON."""


def range_result(body: bytes) -> Any:
    """A ``query_range`` response body decoded, its ``data.result``; anything else a clear
    :class:`PrometheusQueryError`.

    Decoded by pydantic-core's parser (jiter, already a dependency through pydantic), not the
    stdlib's ``json`` that requests' ``.json()`` uses: 4.4 against 5.5 µs per GPU on the
    100,000-GPU body of bench/ingest.py, with the same values (repeated strings, the label
    names and values, one object each). As prometheus-api-client read it, ``data.result`` is
    all that is asked of the answer (not its ``status``: Prometheus sends an error with an
    error status, and an API that copies Prometheus' may leave it out)."""
    try:
        decoded = from_json(body)
    except ValueError as exc:
        raise PrometheusQueryError(f"the answer is not JSON ({exc}): {body[:200]!r}") from None
    data = decoded.get("data") if type(decoded) is dict else None
    if type(data) is not dict or "result" not in data:
        raise PrometheusQueryError(f"the answer holds no data.result: {_error_of(decoded, body)}")
    return data["result"]


def _error_of(decoded: Any, body: bytes) -> str:
    """Prometheus' own ``errorType: error`` when the body says it, else the body's start."""
    if type(decoded) is dict and "error" in decoded:
        return f"{decoded.get('errorType', '')}: {decoded['error']}"[:300]
    return repr(body[:200])


class RangeQueryClient:
    """Blocking client (requests underneath): call it from a worker thread.

    TLS is verified (``ca_file`` or the system's CAs) unless ``verify_tls`` is off; a bearer
    token file and extra headers are sent with every request (:mod:`.http_auth`).

    The request is the one prometheus-api-client 0.7.2 sends (``custom_query_range`` in
    prometheus_api_client/prometheus_connect.py: GET ``/api/v1/query_range`` with ``query``,
    ``start`` and ``end`` rounded to whole seconds, ``step``; the session's ``verify`` and
    ``cert`` passed on the request, so that ``REQUESTS_CA_BUNDLE`` never replaces a
    ``ca_file``; the retry mounted on the URL); only the body is decoded here, from its bytes
    (:func:`range_result`)."""

    def __init__(
        self,
        settings: PrometheusSettings,
        metric_names: Sequence[str],
        step_s: float,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = settings.url
        self.metric_names, self.matchers = tuple(metric_names), settings.matchers
        self.query = selector(metric_names, settings.matchers)
        self.step_s = step_s
        self.timeout_s = timeout_s
        self._session, self._auth = prometheus_session(settings)
        if not settings.verify_tls and settings.url.startswith("https:"):
            log.warning("Prometheus' certificate is not verified", extra={"url": settings.url})
        # One quick retry: the polling loop itself retries on the next interval, from its
        # cursor, so a long client-side backoff would only delay noticing an outage.
        self._session.mount(
            settings.url, HTTPAdapter(max_retries=Retry(total=1, backoff_factor=0.1))
        )

    def query_range(self, start: float, end: float, query: str | None = None) -> Any:
        """One range query's ``data.result``, decoded (:func:`range_result`); ``query``: in
        place of every mapped metric's selector."""
        session = self._session
        params: dict[str, str | int] = {
            "query": self.query if query is None else query,
            "start": round(start),
            "end": round(end),
            "step": f"{self.step_s:g}s",
        }
        response = session.get(
            f"{self.url}/api/v1/query_range",
            params=params,
            verify=session.verify,
            auth=self._auth,
            cert=session.cert,
            timeout=int(self.timeout_s),
        )
        body = response.content
        if response.status_code != 200:
            try:
                error = _error_of(from_json(body), body)
            except ValueError:
                error = repr(body[:200])
            raise PrometheusQueryError(f"HTTP status {response.status_code}: {error}")
        return range_result(body)

    def shard_query(self, label_groups: Sequence[LabelGroup], uuid_regex: str) -> str:
        """The query of a sharded cycle: the series of the GPUs whose UUID matches
        ``uuid_regex`` (:func:`fracpilot_ingest.shard_plan.shard_regex`), and those naming no
        GPU, which every replica reads (:func:`gpu_selector`), each group of metrics by its
        rows' GPU labels (:func:`fracpilot_ingest.shard_plan.gpu_label_groups`)."""
        return " or ".join(
            gpu_selector(metrics, self.matchers, labels, uuid_regex)
            for labels, metrics in label_groups
        )

    def fetch(
        self, start: float, end: float, query: str | None = None
    ) -> dict[float, list[MetricPoint]]:
        """Every instant on the step grid in [start, end], in order; ``query``: in place of
        every mapped metric's selector (sharded: the series of this replica's GPUs)."""
        merged: dict[float, list[MetricPoint]] = {}
        # The response decoded and made points: a burst without cycles.
        with gc_paused():
            grid = chunks(aligned(start, self.step_s), aligned(end, self.step_s), self.step_s)
            for lo, hi in grid:
                # The response's own label dicts handed over: this call made them.
                merged.update(points_by_instant(self.query_range(lo, hi, query), owned=True))
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
        self._first = 0.0  # sharded: where a shard with no cursor yet starts
        self._plan: CyclePlan | None = None  # sharded: the cycle in flight

    async def open(self) -> None:
        self._kv = await self.context.state()
        cursor = await _read_cursor(self._kv)
        if cursor is None:
            cursor = aligned(time.time() - self.backfill_s, self.interval_s) - self.interval_s
            log.info("first start: back-filling", extra={"seconds": self.backfill_s})
        self.cursor = self._first = cursor

    async def read(self) -> Reading:
        step = self.interval_s
        self._end = end = aligned(time.time() - self.delay_s, step)
        keep, query = None, None
        if (shards := self.context.shards) is not None and self._kv is not None:
            self._plan = plan = await shards.begin_cycle(self._kv, self._first)
            if (start := plan.start) is None:
                return Reading(step)  # no shard held (yet)
            self.cursor, keep = start, plan.kept
            if not plan.holds_all:  # only this replica's GPUs (and series naming none)
                query = self.client.shard_query(shards.label_groups, plan.uuid_regex())
        if end <= self.cursor:
            return Reading(step)
        metrics = self.context.metrics
        try:
            with metrics.query_seconds.labels(self.name).time():
                instants = await asyncio.to_thread(
                    self.client.fetch, self.cursor + step, end, query
                )
        except Exception as exc:  # Prometheus down or broken: keep the cursor
            metrics.source_errors.labels(self.name).inc()
            log.warning(
                "prometheus query failed; will catch up",
                extra={"error": str(exc)[:300], "since": self.cursor},
            )
            return Reading(step)
        return Reading(step, instants=list(instants.values()), until=end, keep=keep)

    async def published(self, reading: Reading) -> None:
        if self._plan is not None and self._kv is not None and self.context.shards is not None:
            plan, self._plan = self._plan, None
            await self.context.shards.end_cycle(self._kv, plan, reading.until)
        if reading.until is None or self._kv is None:
            return
        end = reading.until
        if end - self.cursor > 2 * self.interval_s:
            log.info(
                "caught up",
                extra={"from": self.cursor, "to": end, "instants": len(reading.instants)},
            )
        self.cursor = end
        if self.context.shards is None:  # sharded: the shards' cursors were moved
            await self._kv.put(CURSOR_KEY, f"{end:.3f}".encode())
        self.context.published_series.forget_before(end - 2 * self.backfill_s - 3600)

    def next_read_in(self) -> float:
        # The next instant is asked for once it is delay_s old (without the delay this polled
        # every 50 ms while delay_s > 0).
        return max(0.05, self._end + self.interval_s + self.delay_s - time.time())


async def _read_cursor(kv: KvBucket) -> float | None:
    entry = await kv.get(CURSOR_KEY)
    if entry is None:
        return None
    try:
        return float(entry.value.decode())
    except ValueError:
        log.error("ingest cursor is corrupt; back-filling again")
        return None
