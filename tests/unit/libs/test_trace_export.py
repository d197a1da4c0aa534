"""Which span exporter the standard OpenTelemetry variables ask for (pure)."""

from __future__ import annotations

import pytest

from fracpilot_libs.nats.spans import destination_template
from fracpilot_libs.telemetry import TraceExport, trace_export


def test_nothing_is_exported_unless_asked() -> None:
    assert trace_export({}) == TraceExport("none")


def test_an_otlp_endpoint_turns_on_the_otlp_exporter_which_reads_it_itself() -> None:
    assert trace_export({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == TraceExport("otlp")
    traces_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}
    assert trace_export(traces_only) == TraceExport("otlp")


def test_fracpilot_otlp_endpoint_is_a_base_url_like_otel_exporter_otlp_endpoint() -> None:
    assert trace_export({}, "http://c:4318/") == TraceExport("otlp", "http://c:4318/v1/traces")


def test_otel_traces_exporter_chooses_and_none_or_sdk_disabled_win() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert trace_export({"OTEL_TRACES_EXPORTER": "otlp"}) == TraceExport("otlp")  # localhost
    assert trace_export({"OTEL_TRACES_EXPORTER": "console"}) == TraceExport("console")
    assert trace_export(endpoint | {"OTEL_TRACES_EXPORTER": "none"}) == TraceExport("none")
    assert trace_export(endpoint | {"OTEL_SDK_DISABLED": "TRUE"}) == TraceExport("none")
    assert trace_export({"OTEL_TRACES_EXPORTER": " OTLP "}) == TraceExport("otlp")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "one of otlp, console, none"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "one of otlp, console, none"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "http/protobuf",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_clearly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trace_export(env)


def test_span_names_use_a_low_cardinality_template_of_the_subject() -> None:
    assert destination_template("fracpilot.usage.v1.3.inference.chat") == "fracpilot.usage.v1.>"
    assert destination_template("fracpilot.policy.v1.set") == "fracpilot.policy.v1.>"
    assert destination_template("fracpilot.decision.v1") == "fracpilot.decision.v1"
    assert destination_template("$KV.fracpilot_targets.a.b") == "$KV.fracpilot_targets.>"
