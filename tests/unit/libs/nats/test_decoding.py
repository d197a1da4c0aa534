"""Decode errors classified once: not JSON at all, or not the model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.decoding import DecodeError, classify, dead_letter_record, decode


def test_a_payload_that_is_not_json_is_a_decode_error() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(UsageSample, b"{not json")
    assert caught.value.kind == "decode"
    assert caught.value.reason.startswith("not valid JSON: ")


def test_json_that_is_not_the_model_is_a_validation_error() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(UsageSample, b'{"workload": 3}')
    assert caught.value.kind == "validation"
    assert "workload" in caught.value.reason


def test_classify_agrees_with_decode() -> None:
    for payload in (b"", b"[", b"{}", b'{"workload": {}}'):
        with pytest.raises(ValidationError) as raw:
            UsageSample.model_validate_json(payload)
        with pytest.raises(DecodeError) as decoded:
            decode(UsageSample, payload)
        error = classify(raw.value)
        assert (error.kind, error.reason) == (decoded.value.kind, decoded.value.reason)


def test_a_dead_letter_keeps_the_raw_payload_and_a_bounded_reason() -> None:
    record = dead_letter_record("decision", "x.y", b"\xff\xfe", {"a": "b"}, "decode", "r" * 9000)
    assert record.raw_payload == repr(b"\xff\xfe")
    assert len(record.reason) == 8000
    assert record.headers == {"a": "b"}
    assert record.error_kind == "decode"


def test_subject_parsing_reads_both_reply_forms_and_kv_keys() -> None:
    assert subjects.stream_position("|42|1000") == (42, 1000)
    assert subjects.kv_key_parts("c/ns/Deployment/web") == ("c", "ns", "Deployment", "web")
    assert subjects.kv_key_parts("marks/FRACPILOT_USAGE_0") is None
