"""How ingest reaches Prometheus: certificate verification, token file, extra headers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from fracpilot_ingest.settings import IngestSettings, PrometheusSettings
from fracpilot_ingest.sources.http_auth import BearerTokenFile, prometheus_session


def _prepared(auth: BearerTokenFile) -> requests.PreparedRequest:
    request = requests.Request("GET", "https://prom.example/api/v1/query").prepare()
    return auth(request)


def test_token_is_read_again_when_the_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    auth = BearerTokenFile(str(path))
    assert _prepared(auth).headers["Authorization"] == "Bearer first"
    # A rotation replaces the file (a projected token, a Secret's symlink swap).
    fresh = tmp_path / "token.new"
    fresh.write_text("second-and-longer")
    os.replace(fresh, path)
    assert _prepared(auth).headers["Authorization"] == "Bearer second-and-longer"


def test_a_missing_token_file_fails_the_request(tmp_path: Path) -> None:
    auth = BearerTokenFile(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):
        _prepared(auth)


def test_certificates_are_verified_by_default() -> None:
    session, auth = prometheus_session(PrometheusSettings())
    assert session.verify is True
    assert auth is None


def test_ca_file_headers_and_opting_out() -> None:
    settings = PrometheusSettings(ca_file="/etc/ca.pem", headers={"X-Scope-OrgID": "t"})
    session, _ = prometheus_session(settings)
    assert session.verify == "/etc/ca.pem"
    assert session.headers["X-Scope-OrgID"] == "t"
    session, _ = prometheus_session(PrometheusSettings(verify_tls=False))
    assert session.verify is False


def test_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_PROMETHEUS_VERIFY_TLS", "false")
    monkeypatch.setenv("FRACPILOT_PROMETHEUS_CA_FILE", "/ca.pem")
    monkeypatch.setenv("FRACPILOT_PROMETHEUS_BEARER_TOKEN_FILE", "/token")
    monkeypatch.setenv("FRACPILOT_PROMETHEUS_HEADERS", '{"X-Scope-OrgID": "team-a"}')
    prometheus = IngestSettings().prometheus
    assert prometheus.verify_tls is False
    assert prometheus.ca_file == "/ca.pem"
    assert prometheus.bearer_token_file == "/token"
    assert prometheus.headers == {"X-Scope-OrgID": "team-a"}
