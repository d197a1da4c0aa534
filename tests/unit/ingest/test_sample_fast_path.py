"""Ingest's typed path to a sample (fracpilot_libs.usage.samples): a sample it makes without
pydantic is the one pydantic makes from the same observation (equal, the same JSON, decoded back
to itself), and whatever pydantic refuses still becomes the same ``invalid`` rejection."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fracpilot_libs.contracts import UsageSample, WorkloadRef
from fracpilot_libs.usage import samples
from fracpilot_libs.usage.attribution import Observation, PodKey, Rejection
from fracpilot_libs.usage.samples import PublishedSeries, to_sample

T = 1_772_409_600.0
GIB = 1024**3
WORKLOAD = WorkloadRef(cluster="prod", namespace="inference", owner_name="chat")


def names(longest: int) -> st.SearchStrategy[str]:
    """Around the contract's bounds: empty, at the limit, one past it; escapes in JSON."""
    return st.sampled_from(["", "a", "x" * longest, "x" * (longest + 1), 'é\u2028\x00"\\'])


numbers = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1.0000001, -1e-9, math.nan, math.inf, -math.inf, 0.5]),
    st.floats(-2.0, 2.0),
    st.integers(-1, 2),
)
byte_counts = st.one_of(
    st.integers(-1, 100 * GIB),
    st.sampled_from([0, 1, 80 * GIB, 2**70]),
    st.floats(0, 100 * GIB),
)


FIELDS = (
    "pod", "container", "gpu_uuid", "node", "compute", "used", "total", "model", "fraction",
    "source",
)  # fmt: skip


@st.composite
def observations(draw: st.DrawFn) -> tuple[Observation, float | int | None, str]:
    """A valid observation with one or two fields at or past a bound (few, so that the check
    of each bound is what decides)."""
    off = {draw(st.sampled_from(FIELDS)), draw(st.sampled_from(FIELDS))}
    fields = iter(FIELDS)

    def field(valid: object, edges: st.SearchStrategy[object]) -> object:
        return draw(edges) if next(fields) in off else valid

    obs = Observation(
        pod=PodKey(
            "inference",
            field("chat-7c9d5f8b6d-x2k4p", names(253)),  # type: ignore[arg-type]
            field("vllm", names(63)),  # type: ignore[arg-type]
        ),
        gpu_uuid=field("GPU-1", names(128)),  # type: ignore[arg-type]
        node=field("node-a", names(253)),  # type: ignore[arg-type]
        timestamp=T + draw(st.integers(-5, 5)),
        compute=field(draw(st.floats(0.0, 1.0)), numbers),  # type: ignore[arg-type]
        memory_used_bytes=field(10 * GIB, byte_counts),  # type: ignore[arg-type]
        memory_total_bytes=field(80 * GIB, byte_counts),  # type: ignore[arg-type]
        exact=draw(st.booleans()),
        gpu_model=field("NVIDIA H100 80GB HBM3", names(128)),  # type: ignore[arg-type]
    )
    fraction = field(draw(st.sampled_from([None, 0.25, 1.0])), st.one_of(st.none(), numbers))
    source = field("prometheus", st.sampled_from(["", "s" * 63, "s" * 64]))
    return obs, fraction, source  # type: ignore[return-value]


def convert(obs: Observation, fraction: float | int | None, source: str) -> UsageSample | Rejection:
    return to_sample(obs, WORKLOAD, source, T + 30, 3600.0, PublishedSeries(), fraction)  # type: ignore[arg-type]


@settings(max_examples=400)
@given(observations())
def test_the_typed_path_makes_the_sample_pydantic_makes_or_the_same_rejection(
    drawn: tuple[Observation, float | int | None, str],
) -> None:
    typed = convert(*drawn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(samples, "_typed_path", False)  # pydantic alone
        validated = convert(*drawn)
    if isinstance(validated, Rejection):
        assert typed == validated
        return
    assert isinstance(typed, UsageSample)
    assert typed == validated
    assert typed.to_json() == validated.to_json()
    assert UsageSample.model_validate_json(typed.to_json()) == typed
    assert typed.model_fields_set == validated.model_fields_set


def test_a_common_sample_takes_the_typed_path_and_a_nan_does_not() -> None:
    pod = PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")
    ok = Observation(pod, "GPU-1", "node-a", T, 0.42, 10 * GIB, 80 * GIB, True)
    taken: list[str] = []
    checked = samples._checked

    def spy(fields: dict[str, object]) -> UsageSample:
        taken.append(str(fields["sample_id"]))
        return checked(fields)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(samples, "_checked", spy)
        good = convert(ok, 0.5, "prometheus")
        bad = convert(Observation(pod, "GPU-1", "node-a", T, math.nan, 1, 2, True), None, "p")
    assert isinstance(good, UsageSample)
    assert taken == [good.sample_id]  # the typed path, and the NaN not on it
    assert isinstance(bad, Rejection)
    assert bad.reason == "invalid"
    assert "compute" in bad.detail


def test_samples_of_the_typed_path_share_a_fields_set_no_copy_changes() -> None:
    """The typed path's samples share one fields set: frozen, nothing adds to it, and a copy
    with an update gets a set of its own."""
    pod = PodKey("inference", "chat-7c9d5f8b6d-x2k4p", "vllm")
    one, two = (
        convert(Observation(pod, f"GPU-{i}", "node-a", T, 0.42, GIB, 80 * GIB, True), None, "p")
        for i in (1, 2)
    )
    assert isinstance(one, UsageSample)
    assert isinstance(two, UsageSample)
    fields_set = set(one.model_fields_set)
    copied = one.model_copy(update={"schema_version": 1})
    assert copied.model_fields_set == fields_set | {"schema_version"}
    assert one.model_fields_set == two.model_fields_set == fields_set
    assert "schema_version" not in fields_set
    with pytest.raises(ValueError, match="frozen"):
        one.pod = "other"  # type: ignore[misc]
    assert one.model_fields_set == fields_set
