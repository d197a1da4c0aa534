"""Reading history from a Prometheus for ``fracpilot recommend``: the HTTP API through the
standard library, with the access ingest has (:class:`PrometheusAccess`: a CA bundle or no
verification, a bearer token file, extra headers).

The query and its answer are ingest's (:mod:`fracpilot_libs.usage.range_queries`): one selector
for every mapped metric, instants aligned to the step, a long range cut into chunks (a day of
steps at most, so a progress bar moves and no answer is huge), each answer made into the
points of each instant. Every failure is a :class:`PrometheusReadError` that says what went
wrong in words: the server cannot be reached, its certificate is not trusted, it is not a
Prometheus, or it refused the query.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from fracpilot_libs.prometheus_access import BearerTokenFile, PrometheusAccess
from fracpilot_libs.usage.attribution import MetricPoint
from fracpilot_libs.usage.range_queries import (
    MAX_POINTS_PER_QUERY,
    aligned,
    points_by_instant,
    selector,
)

CHUNK_S = 86_400.0  # at most a day per query (and never more steps than Prometheus allows)


class PrometheusReadError(RuntimeError):
    """Prometheus could not be read; the message says why."""


def _context(access: PrometheusAccess) -> ssl.SSLContext | None:
    if not access.url.startswith("https:"):
        return None
    if not access.verify_tls:
        return ssl._create_unverified_context()  # asked for with verify_tls=false
    try:
        return ssl.create_default_context(cafile=access.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise PrometheusReadError(f"cannot read the CA bundle {access.ca_file}: {exc}") from exc


class PrometheusHistory:
    """Blocking reads of one Prometheus's HTTP API."""

    def __init__(self, access: PrometheusAccess, timeout_s: float = 60.0) -> None:
        self.access = access
        self.base = access.url.rstrip("/")
        self.timeout_s = timeout_s
        self._context = _context(access)
        self._token = (
            BearerTokenFile(access.bearer_token_file) if access.bearer_token_file else None
        )

    def get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> Any:
        """``data`` of ``GET /api/v1/<path>``; a failure raises a readable error."""
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(list(params))
        headers = dict(self.access.headers)
        if self._token is not None:
            try:
                headers["Authorization"] = self._token.header()
            except OSError as exc:
                raise PrometheusReadError(f"cannot read the bearer token file: {exc}") from exc
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self._context
            ) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as exc:
            raise PrometheusReadError(self._refused(url, exc)) from exc
        except urllib.error.URLError as exc:
            raise PrometheusReadError(self._unreachable(exc.reason)) from exc
        except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
            raise PrometheusReadError(self._unreachable(exc)) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PrometheusReadError(
                f"{self.base} answered {path} with something that is not JSON: is it a "
                "Prometheus (or a Prometheus-compatible API such as Thanos or Mimir)?"
            ) from exc
        if not isinstance(payload, dict) or payload.get("status") != "success":
            raise PrometheusReadError(f"{self.base} refused {path}: {payload!r:.300}")
        return payload.get("data")

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return (
                f"TLS failure with {self.base}: the server's certificate is not trusted "
                f"({reason.verify_message}); give its CA with --ca-file, or --insecure-skip-verify"
            )
        if isinstance(reason, ssl.SSLError):
            return f"TLS failure with {self.base}: {reason}"
        return f"cannot reach Prometheus at {self.base}: {reason}"

    def _refused(self, url: str, exc: urllib.error.HTTPError) -> str:
        detail = exc.read().decode(errors="replace")[:300]
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        if exc.code == 404:
            return f"{url} not found (404): is {self.base} a Prometheus (its API under /api/v1)?"
        if exc.code in (401, 403):
            return f"Prometheus at {self.base} refused the request ({exc.code}): {detail}"
        return f"Prometheus at {self.base} answered {exc.code}: {detail}"

    def check(self) -> None:
        """One cheap request, so a wrong address fails before any work."""
        self.get("status/buildinfo")

    def present(self, metric_names: Sequence[str], start: float, end: float) -> set[str]:
        """Which of ``metric_names`` have series in [start, end]."""
        names = self.get(
            "label/__name__/values",
            [
                ("match[]", selector(metric_names, self.access.matchers)),
                ("start", f"{start:.3f}"),
                ("end", f"{end:.3f}"),
            ],
        )
        return set(names or ()) & set(metric_names)

    def ranges(self, start: float, end: float, step_s: float) -> list[tuple[float, float]]:
        """[start, end] on the step grid, cut into the chunks :meth:`read` asks for."""
        lo, hi = aligned(start, step_s), aligned(end, step_s)
        span = max(step_s, min(CHUNK_S, MAX_POINTS_PER_QUERY * step_s))
        out = []
        while lo <= hi:
            stop = min(hi, lo + span - step_s)
            out.append((lo, stop))
            lo = stop + step_s
        return out

    def read(
        self, metric_names: Sequence[str], chunk: tuple[float, float], step_s: float
    ) -> Iterator[list[MetricPoint]]:
        """The points of each instant of one chunk, in time order."""
        lo, hi = chunk
        data = self.get(
            "query_range",
            [
                ("query", selector(metric_names, self.access.matchers)),
                ("start", f"{lo:.3f}"),
                ("end", f"{hi:.3f}"),
                ("step", f"{step_s:g}s"),
                ("timeout", f"{int(self.timeout_s)}s"),
            ],
        )
        result = data.get("result", []) if isinstance(data, dict) else []
        instants = points_by_instant(result)
        for at in sorted(instants):
            yield instants[at]
