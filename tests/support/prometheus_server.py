"""A real Prometheus server for tests: generated config, temporary data dir, loopback port.

The binary is Debian's ``prometheus`` package (``scripts/install-servers.sh`` installs it, and
``make test`` runs that first); ``FRACPILOT_PROMETHEUS_BIN`` points at another one.

    exporter = GpuTestExporter()
    with PrometheusServer([ScrapeTarget("dcgm", exporter.address)]) as prom:
        prom.wait_for_series('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-..."}', timeout=10)
        prom.stop()   # a gap: nothing is scraped
        prom.start()  # same data dir, same port, same config
        prom.query_range("DCGM_FI_DEV_GPU_UTIL", start, end, step=1)

Every scrape job is written with ``honor_labels: false`` (Prometheus' default and the
dcgm-exporter Helm ServiceMonitor's), so a target label that the exporter also emits is renamed
to ``exported_<name>`` on the scraped series, as in a real cluster. An exporter label with an
empty value counts as absent and is not renamed.

Timing: ready in well under a second, but Prometheus 2.x applies scrape targets on a fixed 5 s
tick, so the first scrape comes about 5 s after each (re)start (and after a config reload);
``wait_for_series`` / ``wait_for_targets_up`` cover it, and their default timeouts allow for it.

TLS: with ``tls=TlsFiles`` (:mod:`support.tls_proxy`) the server serves HTTPS through a
``--web.config.file`` with ``tls_server_config``; ``url`` is then ``https://…`` and this
helper's own requests verify it against the CA.

Only the standard library is used (``urllib`` for HTTP), and ``support.tls_proxy`` for TLS.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import ssl

    from support.tls_proxy import TlsFiles

__all__ = [
    "PrometheusError",
    "PrometheusNotInstalledError",
    "PrometheusServer",
    "ScrapeTarget",
    "find_prometheus",
    "format_duration",
    "sample_value",
    "values_by",
]

INSTALL_HINT = (
    "run `bash scripts/install-servers.sh` (or `make test`), or set FRACPILOT_PROMETHEUS_BIN"
)

#: One JSON object from the HTTP API's ``data.result`` list:
#: ``{"metric": {...}, "value": [t, "v"]}`` for an instant vector,
#: ``{"metric": {...}, "values": [[t, "v"], ...]}`` for a range.
Series = dict[str, Any]


class PrometheusError(RuntimeError):
    """Prometheus did not start, answered with an error, or a wait timed out."""


class PrometheusNotInstalledError(PrometheusError):
    """No usable ``prometheus`` binary."""


def find_prometheus() -> str:
    """The prometheus binary: ``$FRACPILOT_PROMETHEUS_BIN``, then ``prometheus`` on PATH."""
    candidates = [
        os.environ.get("FRACPILOT_PROMETHEUS_BIN", ""),
        shutil.which("prometheus") or "",
        "/usr/bin/prometheus",
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise PrometheusNotInstalledError(f"no prometheus binary found: {INSTALL_HINT}")


def format_duration(seconds: float) -> str:
    """A Prometheus duration string: ``1s``, ``250ms``, ``2m``."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"duration must be positive, got {seconds}")
    if millis % 60_000 == 0:
        return f"{millis // 60_000}m"
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"


@dataclass(frozen=True)
class ScrapeTarget:
    """One scrape job with one static target.

    ``labels`` are static target labels (e.g. ``pod``/``namespace``/``container`` of the
    exporter's own pod, as a ServiceMonitor would attach). ``honor_labels`` stays ``False``
    unless a test deliberately wants the other behaviour.
    """

    job: str
    address: str  # host:port
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)
    honor_labels: bool = False
    scrape_interval: float | None = None  # seconds; None = the global interval


def _yaml_str(value: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar.
    return json.dumps(value)


def render_config(
    targets: Sequence[ScrapeTarget], *, scrape_interval: float, scrape_timeout: float | None = None
) -> str:
    """The prometheus.yml text for ``targets`` (one job each)."""
    jobs = [t.job for t in targets]
    if len(set(jobs)) != len(jobs):
        raise ValueError(f"job names must be unique: {jobs}")
    timeout = scrape_timeout if scrape_timeout is not None else min(scrape_interval, 10.0)
    lines = [
        "# Generated by tests/support/prometheus_server.py",
        "global:",
        f"  scrape_interval: {format_duration(scrape_interval)}",
        f"  scrape_timeout: {format_duration(timeout)}",
        f"  evaluation_interval: {format_duration(scrape_interval)}",
        "scrape_configs:",
    ]
    if not targets:
        lines[-1] = "scrape_configs: []"
    for target in targets:
        lines += [
            f"  - job_name: {_yaml_str(target.job)}",
            f"    honor_labels: {'true' if target.honor_labels else 'false'}",
            f"    metrics_path: {_yaml_str(target.metrics_path)}",
        ]
        if target.scrape_interval is not None:
            interval = target.scrape_interval
            lines.append(f"    scrape_interval: {format_duration(interval)}")
            lines.append(f"    scrape_timeout: {format_duration(min(interval, timeout))}")
        lines += ["    static_configs:", f"      - targets: [{_yaml_str(target.address)}]"]
        if target.labels:
            lines.append("        labels:")
            lines += [f"          {_yaml_str(k)}: {_yaml_str(v)}" for k, v in target.labels.items()]
    return "\n".join(lines) + "\n"


def sample_value(series: Series) -> float:
    """The float value of one instant-vector result (``NaN``/``+Inf`` included)."""
    return float(series["value"][1])


def values_by(result: Iterable[Series], *labels: str) -> dict[tuple[str, ...], float]:
    """Instant-vector result keyed by the given label values ("" when a label is absent)."""
    out: dict[tuple[str, ...], float] = {}
    for series in result:
        key = tuple(series["metric"].get(label, "") for label in labels)
        if key in out:
            raise AssertionError(f"labels {labels} do not identify one series: {key} twice")
        out[key] = sample_value(series)
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_LIVE: weakref.WeakSet[PrometheusServer] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop(timeout=5)


class PrometheusServer:
    """A ``prometheus`` process owned by a test.

    The port, data dir and config survive :meth:`stop`, so :meth:`start` brings back the same
    server with its stored samples (tests use this for a scrape gap). :meth:`cleanup` stops it
    and deletes its temp dir. The server's log (stdout and stderr, across restarts) is
    ``log_path`` inside that dir.
    """

    def __init__(
        self,
        targets: Sequence[ScrapeTarget] = (),
        *,
        scrape_interval: float = 1.0,
        scrape_timeout: float | None = None,
        binary: str | None = None,
        base_dir: Path | str | None = None,
        extra_args: Sequence[str] = (),
        tls: TlsFiles | None = None,
        log_level: str = "warn",
        startup_timeout: float = 30.0,
        start: bool = False,
    ) -> None:
        self.binary = binary or find_prometheus()
        self.scrape_interval = scrape_interval
        self.scrape_timeout = scrape_timeout
        self.extra_args = list(extra_args)
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="fracpilot-prometheus-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "prometheus.yml"
        self.log_path = self.base_dir / "prometheus.log"
        self.port = _free_port()
        self.tls = tls
        self.web_config_path = self.base_dir / "web-config.yml"
        self._context: ssl.SSLContext | None = tls.client_context() if tls else None
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        if tls is not None:
            self.web_config_path.write_text(
                "tls_server_config:\n"
                f"  cert_file: {_yaml_str(str(tls.cert_file))}\n"
                f"  key_file: {_yaml_str(str(tls.key_file))}\n"
            )
        self._targets: list[ScrapeTarget] = list(targets)
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_config()
        if start:
            self.start()

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def targets_config(self) -> tuple[ScrapeTarget, ...]:
        return tuple(self._targets)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--web.enable-admin-api",
            f"--log.level={self.log_level}",
            # Debian's defaults point at /usr/share/prometheus/...; they are not needed.
            f"--web.console.templates={self.base_dir}",
            f"--web.console.libraries={self.base_dir}",
            *([f"--web.config.file={self.web_config_path}"] if self.tls else []),
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start (or start again) and wait until ``/-/ready`` answers 200."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}: {self.command()}\n".encode())
            log.flush()
            in_main = threading.current_thread() is threading.main_thread()
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                preexec_fn=_die_with_parent if in_main else None,
            )
        _LIVE.add(self)
        try:
            self.wait_ready(self.startup_timeout)
        except BaseException:
            self.stop(timeout=5)
            raise

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise PrometheusError(
                    f"prometheus exited with {code} before it was ready:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(
                    f"{self.url}/-/ready", timeout=2, context=self._context
                ) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"prometheus not ready after {timeout}s at {self.url}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop (SIGTERM: the head is kept in the WAL for the next start)."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop and delete the temp dir (data, config, log)."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- configuration ---------------------------------------------------------------------

    def _write_config(self) -> None:
        text = render_config(
            self._targets, scrape_interval=self.scrape_interval, scrape_timeout=self.scrape_timeout
        )
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config_path)

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Rewrite the config; a running server reloads it (``POST /-/reload``)."""
        self._targets = list(targets)
        self._write_config()
        if self.running:
            self.reload()

    def reload(self) -> None:
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10, context=self._context):
                pass
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            raise PrometheusError(f"reload failed ({err.code}): {body}") from err

    # ---- HTTP API ---------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str | float] | None = None) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data`` (raises on ``status != success``)."""
        query = urllib.parse.urlencode({k: str(v) for k, v in (params or {}).items()})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10, context=self._context) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            raise PrometheusError(f"GET {url} -> {err.code}: {body}") from err
        if payload.get("status") != "success":
            raise PrometheusError(f"GET {url}: {payload}")
        return payload["data"]

    def query(self, promql: str, at: float | None = None) -> list[Series]:
        """Instant query; the ``result`` list (vector) or ``[{"value": ...}]`` for a scalar."""
        params: dict[str, str | float] = {"query": promql}
        if at is not None:
            params["time"] = at
        data = self.api("query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[Series] = data["result"]
        return result

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        data = self.api("query_range", {"query": promql, "start": start, "end": end, "step": step})
        result: list[Series] = data["result"]
        return result

    def series(self, match: str, start: float | None = None, end: float | None = None) -> list[Any]:
        params: dict[str, str | float] = {"match[]": match}
        if start is not None:
            params["start"] = start
        if end is not None:
            params["end"] = end
        result: list[Any] = self.api("series", params)
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        data = self.api("targets", {"state": "active"})
        targets: list[dict[str, Any]] = data["activeTargets"]
        return targets

    # ---- waiting ----------------------------------------------------------------------------

    def wait_until(
        self,
        check: Callable[[], bool],
        timeout: float,
        what: str,
        interval: float = 0.1,
    ) -> None:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            try:
                if check():
                    return
                last_error = None
            except (PrometheusError, urllib.error.URLError, ConnectionError) as err:
                last_error = err
            if time.monotonic() > deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                raise PrometheusError(f"timed out after {timeout}s waiting for {what}{detail}")
            time.sleep(interval)

    def wait_for_series(
        self,
        promql: str,
        timeout: float = 15.0,
        *,
        min_series: int = 1,
        predicate: Callable[[list[Series]], bool] | None = None,
    ) -> list[Series]:
        """Poll an instant query until it returns at least ``min_series`` series (and, when
        given, ``predicate(result)`` is true); return that result."""
        found: list[Series] = []

        def check() -> bool:
            nonlocal found
            found = self.query(promql)
            if len(found) < min_series:
                return False
            return predicate is None or predicate(found)

        self.wait_until(check, timeout, f"{promql!r} to return data")
        return found

    def wait_for_targets_up(self, timeout: float = 15.0) -> None:
        """Wait until every configured target was scraped successfully at least once."""
        jobs = {t.job for t in self._targets}

        def check() -> bool:
            healthy = {t["labels"].get("job") for t in self.active_targets() if t["health"] == "up"}
            return jobs <= healthy

        self.wait_until(check, timeout, f"targets {sorted(jobs)} to be up")

    def wait_for_scrape_after(self, moment: float, job: str, timeout: float = 15.0) -> None:
        """Wait until ``job``'s target was scraped (successfully) after unix time ``moment``."""

        def check() -> bool:
            for target in self.active_targets():
                if target["labels"].get("job") != job or target["health"] != "up":
                    continue
                last = target.get("lastScrape", "")
                if last and _parse_rfc3339(last) > moment:
                    return True
            return False

        self.wait_until(check, timeout, f"a scrape of job {job!r} after {moment}")


def _parse_rfc3339(text: str) -> float:
    # e.g. 2026-08-21T10:11:12.123456789Z or with +02:00; Python wants at most 6 fraction digits.
    main, _, rest = text.partition(".")
    if rest:
        digits = "".join(ch for ch in rest if ch.isdigit())
        zone = rest[len(digits) :]
        text = f"{main}.{digits[:6]}{zone}"
    text = text.replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()
