"""Stream limits as settings (FRACPILOT_STREAMS_*): each stream's config carries them, 0 is no
limit, and every stream discards its oldest messages at a limit (pure)."""

from __future__ import annotations

import pytest
from nats.js.api import DiscardPolicy

from fracpilot_libs.config import ServiceSettings, StreamLimitSettings
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.streams import default_streams, stream_config
from fracpilot_libs.nats.usage_streams import usage_stream_config


def test_each_stream_gets_its_own_limits() -> None:
    limits = StreamLimitSettings(
        decisions_max_bytes=1000,
        decisions_max_age_s=60.0,
        results_max_bytes=2000,
        deadletters_max_age_s=3600.0,
    )
    configs = {s.name: stream_config(s) for s in default_streams(limits)}
    decisions = configs[subjects.DECISION_STREAM]
    assert (decisions.max_bytes, decisions.max_age) == (1000, 60.0)
    results = configs[subjects.ACTUATION_STREAM]
    assert (results.max_bytes, results.max_age) == (2000, None)
    dead = configs[subjects.DEADLETTER_STREAM]
    assert (dead.max_bytes, dead.max_age) == (None, 3600.0)
    assert usage_stream_config(0, 2, 60.0, ("a",), 3, 5000).max_bytes == 5000


def test_no_limit_by_default_and_every_stream_discards_old() -> None:
    for spec in default_streams():
        config = stream_config(spec)
        assert (config.max_bytes, config.max_age) == (None, None)
        assert config.discard == DiscardPolicy.OLD
    assert usage_stream_config(0, 2, 60.0, ("a",)).discard == DiscardPolicy.OLD


def test_the_limits_read_fracpilot_streams_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRACPILOT_STREAMS_USAGE_MAX_BYTES", "1073741824")
    monkeypatch.setenv("FRACPILOT_STREAMS_DEADLETTERS_MAX_AGE_S", "604800")
    streams = ServiceSettings().streams
    assert streams.usage_max_bytes == 1073741824
    assert streams.deadletters_max_age_s == 604800.0
    assert streams.decisions_max_bytes == 0
    monkeypatch.setenv("FRACPILOT_STREAMS_RESULTS_MAX_BYTES", "-1")
    with pytest.raises(ValueError, match="results_max_bytes"):
        ServiceSettings()
