"""Ingest's parsers, fuzzed: what Prometheus or an exporter sends may be garbage, partial or
huge, and every value in it may be NaN, infinite, negative or absurd.

- a range-query result (``points_by_instant``) of any shape gives points with finite
  timestamps, the malformed parts left out, and never raises;
- an exposition text (``parse_exposition``) parses or raises an ``Exception`` (the scrape loop
  counts it as a failed scrape and goes on with the other targets);
- the points of an instant, whatever their labels and values, become samples or rejections
  with a reason (``observe_points`` + ``to_sample``), never an exception.
"""

from __future__ import annotations

import json
import math
import string

from hypothesis import strategies as st

from factories import workload
from fracpilot_ingest.sources.scrape import parse_exposition
from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.usage.attribution import GpuInventory, MetricPoint, Observation, observe_points
from fracpilot_libs.usage.mappings import LabelRoles, MappingTable
from fracpilot_libs.usage.range_queries import points_by_instant
from fracpilot_libs.usage.samples import PublishedSeries, to_sample
from support.fuzzing import JSON_VALUES, examples_per_subject, run_property

NOW = 1_772_409_600.0  # 2026-03-02T00:00:00Z
TABLE = MappingTable.of()
NAMES = sorted(TABLE.metric_names)
ROLES = LabelRoles()
LABEL_NAMES = sorted(
    {*ROLES.namespace, *ROLES.pod, *ROLES.container, *ROLES.gpu_uuid, *ROLES.node, *ROLES.model}
    | {"job", "instance", "gpu", "device", "__name__"}
)
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 100.0, 1e308, -1e308, 5e-324]
ODD_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [*SPECIAL, NOW, NOW + 1e9, -NOW]
)
TIMES = st.sampled_from([NOW, NOW - 30, *SPECIAL, NOW + 1e9, -NOW]) | st.floats()
LABEL_VALUES = st.one_of(
    st.sampled_from(["", "default", "inference", "chat-7f9c-x2", "GPU-a", "GPU-b", "node-a"]),
    st.text(max_size=30),
    st.just("x" * 10_000),
)
RAW_VALUES = st.one_of(
    ODD_FLOATS.map(repr),
    ODD_FLOATS,
    st.sampled_from(["NaN", "+Inf", "-Inf", "", "1e999"]),
    JSON_VALUES,
)


def series_like() -> st.SearchStrategy[object]:
    labels = st.dictionaries(st.sampled_from(LABEL_NAMES), LABEL_VALUES, max_size=8).map(
        lambda d: {"__name__": NAMES[len(d) % len(NAMES)], **d}
    )
    pair = st.one_of(st.tuples(ODD_FLOATS | JSON_VALUES, RAW_VALUES).map(list), JSON_VALUES)
    good = st.fixed_dictionaries({"metric": labels, "values": st.lists(pair, max_size=6)})
    return st.one_of(good, good.map(lambda s: {**s, "metric": "oops"}), JSON_VALUES)


def test_a_range_query_result_of_any_shape_gives_points_or_nothing() -> None:
    def check(result: object) -> None:
        instants = points_by_instant(result)  # type: ignore[arg-type]
        for ts, points in instants.items():
            assert math.isfinite(ts)
            for p in points:
                assert isinstance(p, MetricPoint)
                assert p.timestamp == ts
                assert isinstance(p.value, float)
                assert all(isinstance(v, str) for v in p.labels.values())

    results = st.one_of(st.lists(series_like(), max_size=6), JSON_VALUES)
    assert run_property(results, check) >= examples_per_subject()


def exposition_lines() -> st.SearchStrategy[str]:
    label = st.tuples(st.sampled_from(LABEL_NAMES[:-1]), LABEL_VALUES).map(
        lambda kv: f'{kv[0]}="{kv[1]}"'
    )
    sample = st.tuples(
        st.sampled_from(NAMES), st.lists(label, max_size=6), ODD_FLOATS.map(repr)
    ).map(lambda t: f"{t[0]}{{{','.join(t[1])}}} {t[2]}")
    return st.one_of(
        sample,
        st.sampled_from(NAMES).map(lambda n: f"# TYPE {n} gauge"),
        st.text(alphabet=string.printable, max_size=80),
        st.text(max_size=80),
    )


def test_an_exposition_parses_or_raises_an_exception_the_scrape_loop_counts() -> None:
    wanted = set(NAMES)

    def check(text: str) -> None:
        try:
            points = parse_exposition(text, wanted, "127.0.0.1:9400", NOW)
        except Exception:  # the scrape loop's `except Exception`: counted, next target
            return
        assert all(p.metric in wanted for p in points)

    texts = st.one_of(
        st.lists(exposition_lines(), max_size=12).map("\n".join),
        st.lists(exposition_lines(), max_size=12).map(lambda ls: "\n".join(ls)[: len(ls) * 7]),
        st.binary(max_size=512).map(lambda b: b.decode("utf-8", errors="replace")),
    )
    assert run_property(texts, check) >= examples_per_subject()


@st.composite
def gpu_series(draw: st.DrawFn) -> list[MetricPoint]:
    """dcgm-exporter's device and per-process series for a few GPUs and pods, complete
    enough to reach attribution and validation, with odd values and times."""
    points = []
    ts = draw(TIMES)
    for g in range(draw(st.integers(1, 3))):
        for p in range(draw(st.integers(0, 3))):
            labels = {
                "UUID": f"GPU-{g}",
                "Hostname": "node-a",
                "modelName": draw(LABEL_VALUES),
                "namespace": "inference",
                "pod": f"chat-{p}",
                "container": draw(st.sampled_from(["", "main"])),
            }
            for metric in (
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_DEV_GPU_UTIL",
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_FB_FREE",
                "hami_container_device_utilization_ratio",
                "hami_vgpu_memory_used_bytes",
                "vllm:kv_cache_usage_perc",
            ):
                if draw(st.booleans()):
                    value = draw(st.floats(0, 100) | ODD_FLOATS)
                    points.append(MetricPoint(metric, labels, value, ts))  # one instant
    return points


def test_any_points_become_samples_or_rejections_with_a_reason() -> None:
    point = st.builds(
        MetricPoint,
        metric=st.sampled_from(NAMES),
        labels=st.dictionaries(st.sampled_from(LABEL_NAMES), LABEL_VALUES, max_size=8),
        value=ODD_FLOATS,
        timestamp=ODD_FLOATS,
    )
    inventory = st.builds(
        GpuInventory,
        default_device_memory_bytes=st.none() | st.integers(1, 2**70),
    )

    def check(case: tuple[list[MetricPoint], GpuInventory]) -> None:
        points, inv = case
        observations, rejections = observe_points(points, TABLE, inv)
        assert all(r.reason and r.detail for r in rejections)
        published = PublishedSeries()
        for obs in observations:
            assert isinstance(obs, Observation)
            result = to_sample(obs, workload(), "fuzz", NOW, 7 * 86_400.0, published, None)
            if isinstance(result, UsageSample):
                assert json.loads(result.to_json())["compute"] <= 1.0
            else:
                assert result.reason
                assert result.detail

    cases = st.tuples(st.lists(point, max_size=12) | gpu_series(), inventory)
    assert run_property(cases, check) >= examples_per_subject()


def test_an_instant_at_any_time_becomes_a_sample_or_a_rejection() -> None:
    """A complete, valid GPU reading at an odd time (NaN, infinite, far past or future)."""
    labels = {"UUID": "GPU-0", "Hostname": "node-a", "namespace": "inference", "pod": "chat-0"}

    def check(case: tuple[float, float, float]) -> None:
        ts, used, free = case
        points = [
            MetricPoint("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, 0.5, ts),
            MetricPoint("DCGM_FI_DEV_FB_USED", labels, used, ts),
            MetricPoint("DCGM_FI_DEV_FB_FREE", labels, free, ts),
        ]
        observations, rejections = observe_points(points, TABLE, GpuInventory())
        assert all(r.reason and r.detail for r in rejections)
        for obs in observations:
            result = to_sample(obs, workload(), "fuzz", NOW, 7 * 86_400.0, PublishedSeries())
            if isinstance(result, UsageSample):
                assert result.timestamp.timestamp() == ts
            else:
                assert result.reason
                assert result.detail

    mib = st.sampled_from([1000.0, 0.0, 1e302, 1.7e302, 1e300]) | ODD_FLOATS
    assert run_property(st.tuples(TIMES, mib, mib), check) >= examples_per_subject()
