"""Decision settings are nested groups, but read the same environment names as before."""

from __future__ import annotations

import pytest

from fracpilot_decision.settings import DecisionSettings

ENVIRONMENT = {
    "FRACPILOT_NATS_URL": "nats://nats-0:4222,nats://nats-1:4222",
    "FRACPILOT_NATS_USER": "decision",
    "FRACPILOT_NATS_PASSWORD": "secret",
    "FRACPILOT_NATS_TLS_CA_FILE": "/etc/nats/ca.pem",
    "FRACPILOT_NATS_CONNECT_TIMEOUT_S": "7.5",
    "FRACPILOT_METRICS_HOST": "0.0.0.0",
    "FRACPILOT_METRICS_PORT": "9191",
    "FRACPILOT_CHECKPOINT_INTERVAL_S": "30",
    "FRACPILOT_CHECKPOINT_WHEN_IDLE_S": "0",
    "FRACPILOT_GC_FREEZE_INTERVAL_S": "2",
    "FRACPILOT_GC_FULL_INTERVAL_S": "120",
    "FRACPILOT_PARTITION_LEASE_S": "15",
    "FRACPILOT_MAX_UNACKED": "5000",
    "FRACPILOT_DECISION_PARTITIONS": "8",
    "FRACPILOT_LOG_LEVEL": "DEBUG",
}


def test_every_environment_name_reaches_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    s = DecisionSettings()
    assert s.nats.url == "nats://nats-0:4222,nats://nats-1:4222"
    assert (s.nats.user, s.nats.password) == ("decision", "secret")
    assert s.nats.tls_ca_file == "/etc/nats/ca.pem"
    assert s.nats.connect_timeout_s == 7.5
    assert (s.metrics.host, s.metrics.port) == ("0.0.0.0", 9191)
    assert (s.checkpoint.interval_s, s.checkpoint.when_idle_s) == (30.0, 0.0)
    assert (s.gc.freeze_interval_s, s.gc.full_interval_s) == (2.0, 120.0)
    assert s.partition.lease_s == 15.0
    assert (s.max_unacked, s.decision_partitions, s.log_level) == (5000, 8, "DEBUG")


def test_keywords_and_environment_merge_within_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_NATS_TLS_CA_FILE", "/etc/nats/ca.pem")
    s = DecisionSettings(nats={"url": "nats://127.0.0.1:4333"})
    assert (s.nats.url, s.nats.tls_ca_file) == ("nats://127.0.0.1:4333", "/etc/nats/ca.pem")


def test_a_group_checks_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_PARTITION_LEASE_S", "0.1")
    with pytest.raises(ValueError, match="lease_s"):
        DecisionSettings()
