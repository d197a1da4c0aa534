"""The prometheus source's range query over HTTP: the request prometheus-api-client sent, the
body decoded from its bytes (pydantic-core, as ``json`` did), a clear error for anything that
is not a success, counted as a source error.

A real HTTP server on loopback (the stdlib's) answers with what each test sets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_api_client import PrometheusConnect
from prometheus_client import CollectorRegistry

from fracpilot_ingest.metrics import IngestMetrics
from fracpilot_ingest.settings import PrometheusSettings
from fracpilot_ingest.sources.base import Reading, SourceContext
from fracpilot_ingest.sources.prometheus import (
    PrometheusQueryError,
    PrometheusSource,
    RangeQueryClient,
    range_result,
)
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.usage.samples import PublishedSeries
from support.serving_thread import QuietHandler, ServingThread

RESULT = [
    {
        "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1", "exported_pod": "p-0"},
        "values": [[1_772_409_600, "45"], [1_772_409_615.5, "NaN"]],
    }
]
SUCCESS = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": RESULT}})


class Answers:
    """What the server answers (status, body) and the requests it got (path, headers)."""

    def __init__(self) -> None:
        self.status = 200
        self.body = SUCCESS.encode()
        self.requests: list[tuple[str, dict[str, str]]] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Answers]]:
    answers = Answers()

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            answers.requests.append((self.path, dict(self.headers)))
            self.answer(answers.status, answers.body, "application/json")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with ServingThread(httpd, "prometheus-answers"):
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers


def client(url: str, step_s: float = 15.0) -> RangeQueryClient:
    settings = PrometheusSettings(url=url, headers={"X-Scope-OrgID": "team-a"})
    return RangeQueryClient(settings, ["DCGM_FI_DEV_GPU_UTIL"], step_s)


def test_the_request_is_the_one_prometheus_api_client_sent(server: tuple[str, Answers]) -> None:
    url, answers = server
    ours = client(url, step_s=7.5)
    theirs = PrometheusConnect(url=url, session=ours._session, auth=ours._auth)
    for start, end in ((1_772_409_600.0, 1_772_409_607.5), (1_772_409_622.5, 1_772_409_652.5)):
        assert ours.query_range(start, end) == RESULT
        result = theirs.custom_query_range(
            ours.query,
            start_time=datetime.fromtimestamp(start, UTC),
            end_time=datetime.fromtimestamp(end, UTC),
            step="7.5s",
            timeout=30,
        )
        assert result == RESULT
    assert len(answers.requests) == 4
    assert answers.requests[0] == answers.requests[1]
    assert answers.requests[2] == answers.requests[3]
    path, headers = answers.requests[2]
    assert path.startswith("/api/v1/query_range?query=")
    assert "&start=1772409622&end=1772409652&step=7.5s" in path  # whole seconds, as it sent
    assert headers["X-Scope-OrgID"] == "team-a"


def test_an_error_status_is_a_clear_error_with_prometheus_own_message(
    server: tuple[str, Answers],
) -> None:
    url, answers = server
    answers.status = 400
    answers.body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
    with pytest.raises(PrometheusQueryError, match="HTTP status 400: bad_data: parse error at"):
        client(url).query_range(1_772_409_600.0, 1_772_409_615.0)
    answers.status = 503
    answers.body = b"<html>Service Unavailable</html>"
    with pytest.raises(PrometheusQueryError, match="HTTP status 503: b'<html>Service"):
        client(url).query_range(1_772_409_600.0, 1_772_409_615.0)


def test_a_body_that_is_not_json_is_a_clear_error(server: tuple[str, Answers]) -> None:
    url, answers = server
    answers.body = b"<html>a proxy's login page</html>"
    with pytest.raises(PrometheusQueryError, match=r"not JSON.*a proxy's login page"):
        client(url).query_range(1_772_409_600.0, 1_772_409_615.0)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "not JSON"),
        (b'{"status": "success", "data": ', "not JSON"),
        (b'{"status":"error","errorType":"timeout","error":"query timed out"}', "timeout: query"),
        (b"[1, 2]", r"no data.result: b'\[1, 2\]'"),
        (b'{"status": "success", "data": {"resultType": "matrix"}}', "no data.result"),
        (b'{"status": "success", "data": [1]}', "no data.result"),
    ],
)
def test_an_answer_without_a_result_says_why(body: bytes, says: str) -> None:
    with pytest.raises(PrometheusQueryError, match=says):
        range_result(body)


def test_the_result_is_read_as_prometheus_api_client_read_it() -> None:
    """``data.result``, whatever ``status`` says or whether it is there (it asked no more)."""
    for status in (b'"status": "success", ', b""):
        body = b"{" + status + b'"data": {"resultType": "matrix", "result": []}}'
        assert range_result(body) == []


async def test_an_error_answer_is_counted_as_a_source_error_and_keeps_the_cursor(
    server: tuple[str, Answers],
) -> None:
    url, answers = server
    answers.body = b"not json"
    kv: dict[str, bytes] = {}

    class Kv:
        async def get(self, key: str) -> None:
            return None

        async def put(self, key: str, value: bytes) -> int:
            kv[key] = value
            return 1

    async def state() -> Any:
        return Kv()

    metrics = IngestMetrics(CollectorRegistry(), GpuPrices.with_overrides({}, None), 10)
    context = SourceContext(
        metrics=metrics,
        metric_names=("DCGM_FI_DEV_GPU_UTIL",),
        published_series=PublishedSeries(),
        allocations={},
        state=state,
    )
    source = PrometheusSource(
        PrometheusSettings(url=url, delay_s=0), interval_s=15, backfill_s=60, context=context
    )
    await source.open()
    cursor = source.cursor
    assert await source.read() == Reading(15)
    assert metrics.source_errors.labels("prometheus")._value.get() == 1
    assert source.cursor == cursor
    assert not kv
    answers.body = SUCCESS.encode()
    assert (await source.read()).until is not None  # the same source reads once it is JSON


# JSON as Prometheus writes it and beyond: any nesting, unicode and escapes, ints of any size,
# floats (finite: Prometheus writes NaN and the infinities as strings).
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(_JSON, st.booleans())
def test_the_body_decodes_to_what_json_decoded(result: Any, ascii_only: bool) -> None:
    body = json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}},
        ensure_ascii=ascii_only,
    ).encode()
    decoded = range_result(body)
    assert decoded == json.loads(body)["data"]["result"]
    assert json.dumps(decoded) == json.dumps(result)  # the same types (an int stays an int)
