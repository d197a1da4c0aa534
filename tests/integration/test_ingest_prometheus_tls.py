"""Ingest against a real Prometheus served over TLS, behind a bearer-token check.

Prometheus (Debian's binary) serves HTTPS with a test CA's certificate (``--web.config.file``);
it cannot check bearer tokens, so a loopback proxy does (``support.tls_proxy``), as
kube-rbac-proxy or a managed Prometheus' gateway would. Ingest verifies the certificate
against ``FRACPILOT_PROMETHEUS_CA_FILE`` (and refuses it without), sends the token from
``FRACPILOT_PROMETHEUS_BEARER_TOKEN_FILE`` (re-read when the file is rotated) and the extra
headers of ``FRACPILOT_PROMETHEUS_HEADERS``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from helpers import reset_nats, running, wait_for
from support.gpu_exporter import GpuState, GpuTestExporter, PodOnGpu, dcgm_device_metrics
from support.prometheus_server import PrometheusServer, ScrapeTarget
from support.tls_proxy import BearerTokenProxy, TlsFiles, make_tls_files

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

STEP = 1.0
POD = PodOnGpu("team-s", "secure-0", "server", util_pct=20, memory_used_mib=1_000)
GPU = GpuState("GPU-5ec0e000-0000-4000-8000-0000000000tl", "n1", "Tesla T4", 15_360, 20, [POD])


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def prom(tls: TlsFiles) -> Iterator[PrometheusServer]:
    with GpuTestExporter() as exporter:
        exporter.set_metrics(dcgm_device_metrics([GPU]), "/metrics")
        with PrometheusServer(
            [ScrapeTarget("dcgm", exporter.address)], scrape_interval=STEP, tls=tls
        ) as server:
            server.wait_for_series("DCGM_FI_DEV_FB_USED", timeout=30)
            yield server


@pytest.fixture
def proxy(prom: PrometheusServer, tls: TlsFiles) -> Iterator[BearerTokenProxy]:
    with BearerTokenProxy(prom.url, tls, token="token-1") as proxy:
        yield proxy


def _settings(nats_url: str, prometheus: dict[str, object]) -> IngestSettings:
    return IngestSettings(
        nats={"url": nats_url},
        interval_s=STEP,
        backfill_s=3.0,
        cluster="test",
        sources="prometheus",
        prometheus=prometheus,  # type: ignore[arg-type]
    )


def _count(service: IngestService, name: str) -> float:
    metric = getattr(service.metrics, name)
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_total"))


async def test_tls_verified_with_the_ca_file_token_and_headers_sent(
    nats_url: str, prom: PrometheusServer, proxy: BearerTokenProxy, tls: TlsFiles, tmp_path: Path
) -> None:
    assert prom.url.startswith("https://")
    token = tmp_path / "token"
    token.write_text("token-1\n")
    await reset_nats(nats_url)
    service = IngestService(
        _settings(
            nats_url,
            {
                "url": proxy.url,
                "ca_file": str(tls.ca_file),
                "bearer_token_file": str(token),
                "headers": {"X-Scope-OrgID": "team-s"},
            },
        )
    )
    async with running(service):
        await wait_for(lambda: _count(service, "published") >= 1, timeout=30)
        assert proxy.refused == 0
        assert proxy.last_headers["X-Scope-OrgID"] == "team-s"
        # Rotation: the proxy wants a new token; the old one is refused until the file has it.
        proxy.token = "token-2"
        await wait_for(lambda: proxy.refused >= 1, timeout=15)
        # counted once the client has read the refusal, a moment after the proxy sent it
        await wait_for(lambda: _count(service, "source_errors") >= 1, timeout=10)
        published = _count(service, "published")
        token.write_text("token-2\n")
        await wait_for(lambda: _count(service, "published") > published, timeout=15)


async def test_certificate_is_verified_by_default(
    nats_url: str, proxy: BearerTokenProxy, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("token-1")
    await reset_nats(nats_url)
    # No CA file: the system's CAs do not know the test CA, so nothing is read.
    service = IngestService(
        _settings(nats_url, {"url": proxy.url, "bearer_token_file": str(token)})
    )
    async with running(service):
        await wait_for(lambda: _count(service, "source_errors") >= 2, timeout=30)
    assert _count(service, "published") == 0
    assert proxy.accepted == 0  # the handshake failed: no request reached the proxy's check


async def test_verification_can_be_turned_off(
    nats_url: str, proxy: BearerTokenProxy, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("token-1")
    await reset_nats(nats_url)
    service = IngestService(
        _settings(
            nats_url, {"url": proxy.url, "bearer_token_file": str(token), "verify_tls": False}
        )
    )
    async with running(service):
        await wait_for(lambda: _count(service, "published") >= 1, timeout=30)
