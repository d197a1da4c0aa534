"""How many replicas streams get, and why a started service is not ready (both pure)."""

from __future__ import annotations

import pytest

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.bus import jetstream_unavailable
from fracpilot_libs.nats.streams import default_streams, replicas_for, stream_config
from fracpilot_libs.nats.usage_streams import usage_stream_config
from fracpilot_libs.runtime import readiness_problem


def test_replicas_follow_the_setting_else_the_server() -> None:
    assert replicas_for(None, {"server_id": "x"}) == 1
    assert replicas_for(None, {"cluster": "fracpilot"}) == 3
    assert replicas_for(1, {"cluster": "fracpilot"}) == 1
    assert replicas_for(5, {}) == 5


def test_stream_configs_carry_the_replicas() -> None:
    assert stream_config(default_streams()[0], 3).num_replicas == 3
    assert stream_config(default_streams()[0]).num_replicas == 1
    assert usage_stream_config(0, 2, 60.0, ("a",), 3).num_replicas == 3


def test_a_lost_connection_is_the_reason_given_first() -> None:
    assert readiness_problem(True, True) is None
    assert readiness_problem(True, False) == "JetStream unavailable"
    assert readiness_problem(False, False) == "NATS connection lost"


def test_only_a_5xx_reply_says_jetstream_is_unavailable() -> None:
    unavailable = b'{"error":{"code":503,"err_code":10008,"description":"temporarily unavailable"}}'
    assert jetstream_unavailable(unavailable)
    assert not jetstream_unavailable(b'{"error":{"code":404,"err_code":10059}}')
    assert jetstream_unavailable(b'{"error":{"code":500,"err_code":10009}}')
    assert not jetstream_unavailable(b'{"config":{"name":"FRACPILOT_USAGE_0"}}')
    assert not jetstream_unavailable(b"junk")


def test_the_replicas_setting_reads_fracpilot_nats_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ServiceSettings().nats.replicas is None
    monkeypatch.setenv("FRACPILOT_NATS_REPLICAS", "3")
    assert ServiceSettings().nats.replicas == 3
