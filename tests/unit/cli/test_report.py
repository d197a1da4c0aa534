"""``fracpilot report``'s pure core and page: the numbers of a window, and HTML that shows them."""

from __future__ import annotations

import base64
import io
import json
import re
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from factories import T0, decision, sample
from fracpilot_cli import output, render
from fracpilot_cli.operator_cli import parse_duration
from fracpilot_cli.report import build_report, measure
from fracpilot_cli.report_html import fleet_series, num, render_report
from fracpilot_libs.analysis.accounting import sample_intervals
from fracpilot_libs.contracts import ActuationResult, Outcome, PlanKind, UsageSample
from fracpilot_libs.pricing import GpuPrices

A100 = "NVIDIA A100-SXM4-80GB"  # 3.40 USD per GPU-hour in the built-in table


def series(
    held: list[float], compute: float = 0.1, memory: float = 0.1, name: str = "chat"
) -> list[UsageSample]:
    return [
        sample(compute, memory, minute=m, name=name, allocated=h, gpu_model=A100)
        for m, h in enumerate(held)
    ]


def action(name: str, plan: PlanKind, outcome: Outcome, minute: int) -> ActuationResult:
    d = decision(name=name, decision_id=f"{name}-{minute}")
    return ActuationResult(
        decision_id=d.decision_id,
        workload=d.workload,
        plan=plan,
        outcome=outcome,
        fraction_before=0.5,
        fraction_after=0.25,
        finished_at=T0 + timedelta(minutes=minute),
    )


def test_intervals_stand_until_the_next_sample_with_gaps_capped() -> None:
    assert sample_intervals([]) == []
    assert sample_intervals([0.0]) == [60.0]
    assert sample_intervals([0, 60, 120, 3720, 3780]) == [60, 60, 300, 60, 60]


def test_usage_against_the_fraction_held() -> None:
    # 30 minutes at 0.5, 30 at 0.25; memory 0.3 overruns the 0.25 half
    samples = series([0.5] * 30 + [0.25] * 30, memory=0.3)
    replay = measure(samples[0].workload, samples, 3.40)
    m = replay.metrics
    assert m.samples == 60
    assert m.fraction_hours == pytest.approx(0.5 * 0.5 + 0.5 * 0.25)
    assert m.whole_gpu_hours == pytest.approx(1.0)
    assert m.memory_overrun_samples == 30
    assert m.compute_overrun_samples == 0
    assert m.longest_overrun_s == 30 * 60
    assert m.resizes == 1
    assert m.cost_saved_usd == pytest.approx((1.0 - 0.375) * 3.40)
    assert replay.final_fraction == 0.25
    assert [(t, f) for t, _, _, f in replay.timeline][29:31] == [
        ((T0 + timedelta(minutes=29)).timestamp(), 0.5),
        ((T0 + timedelta(minutes=30)).timestamp(), 0.25),
    ]


def test_a_sample_without_an_allocation_holds_a_whole_gpu() -> None:
    samples = [*series([0.5, 0.5]), sample(minute=2, allocated=None, gpu_model=A100)]
    m = measure(samples[0].workload, samples, 1.0).metrics
    assert m.fraction_hours == pytest.approx((0.5 + 0.5 + 1.0) / 60)


def test_the_fleet_totals_and_counts() -> None:
    samples = series([0.5] * 10) + series([0.25] * 20, compute=0.3, name="embed")
    decisions = [
        decision(0.5, 0.25, name="chat", decision_id="a"),
        decision(0.25, 0.5, name="embed", decision_id="b"),
    ]
    results = [
        action("chat", PlanKind.IN_PLACE, Outcome.APPLIED, 3),
        action("embed", PlanKind.RECREATE_ELSEWHERE, Outcome.FAILED, 4),
        action("embed", PlanKind.SCALE_UP, Outcome.APPLIED, 5),
    ]
    report = build_report(samples, decisions, results, GpuPrices(), T0, T0 + timedelta(hours=1), T0)
    doc = report.as_dict()
    fleet = doc["fleet"]
    assert fleet["samples"] == 30
    assert fleet["workloads"] == 2
    assert fleet["fraction_hours"] == round(10 / 60 * 0.5 + 20 / 60 * 0.25, 4)
    assert fleet["compute_overrun_samples"] == 20  # embed: 0.3 on 0.25
    assert fleet["decisions"] == 2
    assert fleet["decisions_by_direction"] == {"down": 1, "up": 1}
    assert fleet["actions_by_plan"] == {"in_place": 1, "recreate_elsewhere": 1, "scale_up": 1}
    assert fleet["actions_by_outcome"] == {"applied": 2, "failed": 1}
    assert fleet["cost_saved_usd"] == round((30 / 60 - (5 / 60 + 5 / 60)) * 3.40, 2)
    # overruns first
    assert [w["workload"] for w in doc["workloads"]] == ["embed", "chat"]
    embed = doc["workloads"][0]
    assert [a["plan"] for a in embed["actions"]] == ["recreate_elsewhere", "scale_up"]
    assert embed["gpu_model"] == A100
    assert embed["usd_per_gpu_hour"] == 3.40


def test_the_page_shows_the_json_numbers_and_embeds_charts() -> None:
    samples = series([0.5] * 30 + [0.25] * 30, memory=0.3) + series([0.75] * 20, name="embed")
    results = [action("chat", PlanKind.IN_PLACE, Outcome.APPLIED, 30)]
    report = build_report(samples, [], results, GpuPrices(), T0, T0 + timedelta(hours=2), T0)
    document, page = render_report(report, charts=1)
    assert document == report.as_dict()
    assert not re.search(r"(?:src|href)=\"(?!data:)", page)  # nothing loaded from elsewhere
    assert "http://" not in page
    assert "https://" not in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2  # the fleet and the one workload charted
    for data in images:
        picture = Image.open(io.BytesIO(base64.b64decode(data)))
        assert picture.format == "PNG"
        assert picture.size[0] > 600
    f = document["fleet"]
    for key in (
        "fraction_hours",
        "whole_gpu_hours",
        "saved_gpu_hours",
        "memory_overrun_samples",
        "samples",
        "actions",
    ):
        assert num(f[key]) in page, key
    assert f"${num(f['cost_saved_usd'])}" in page
    for w in document["workloads"]:
        assert f"{w['namespace']}/{w['workload']}" in page
        assert num(w["fraction_hours"]) in page
    assert "1 more without a chart" in page


def test_numbers_print_as_the_json_holds_them() -> None:
    assert num(1234.5678) == "1,234.5678"
    assert num(0.125) == "0.125"
    assert num(12) == "12"
    assert num(3.0) == "3.0"
    assert num(None) == "-"
    assert num("<b>") == "&lt;b&gt;"


def test_the_fleet_series_counts_the_workloads_running_at_each_instant() -> None:
    samples = series([0.5] * 60) + [
        sample(minute=m, name="embed", allocated=0.25, gpu_model=A100) for m in range(30, 60)
    ]
    report = build_report(samples, [], [], GpuPrices(), T0, T0, T0)
    hours, held, whole = fleet_series(report, bins=4)
    assert hours == pytest.approx([0, 59 / 60 / 4, 2 * 59 / 60 / 4, 3 * 59 / 60 / 4, 59 / 60])
    # embed starts at minute 30, after the instant at 29.5
    assert whole == [1, 1, 1, 2, 2]
    assert held == [0.5, 0.5, 0.5, 0.75, 0.75]


def test_durations() -> None:
    assert parse_duration("24h") == timedelta(hours=24)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("1w") == timedelta(days=7)
    for bad in ("", "24", "h", "-1h", "0m", "1x", "1h 30", "abc"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.sampled_from("smhdw")), min_size=1, max_size=4))
def test_duration_parts_add_up(parts: list[tuple[int, str]]) -> None:
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = "".join(f"{n}{u}" for n, u in parts)
    assert parse_duration(text).total_seconds() == sum(n * seconds[u] for n, u in parts)


# --- cards: GPUs in use, cards freed, card-hours -----------------------------------------------


def on_card(name: str, gpu: str, minutes: range) -> list[UsageSample]:
    return [
        sample(minute=m, name=name, allocated=0.25, gpu_model=A100, gpu_uuid=gpu) for m in minutes
    ]


def test_cards_freed_and_card_hours_on_a_hand_made_fleet() -> None:
    """Six pods to the end on three cards (two MIG instances of one card among them), and one
    that left after half an hour: the end needs 3 cards for 6 pods, 3 freed; card-hours count
    a card while someone is on it, whole-card-hours a card per pod."""
    hour = range(60)
    samples = (
        on_card("a", "GPU-1", hour)
        + on_card("b", "GPU-1", hour)
        + on_card("c", "GPU-2", hour)
        + on_card("d", "GPU-2", hour)
        + on_card("e", "GPU-3/GI1", hour)  # two MIG instances: one card
        + on_card("f", "GPU-3/GI2", hour)
        + on_card("g", "GPU-4", range(30))  # left after 30 minutes
    )
    report = build_report(samples, [], [], GpuPrices(), T0, T0 + timedelta(hours=1), T0)
    cards = report.as_dict()["fleet"]["cards"]
    assert cards == {
        "gpus_whole": 6,
        "gpus_in_use": 3,
        "cards_freed": 3,
        "card_hours": 3.5,  # GPU-1, -2, -3 an hour each, GPU-4 half an hour
        "whole_card_hours": 6.5,  # six pods an hour, g half an hour
        "card_hours_saved": 3.0,
        "card_hours_saved_pct": round(100 * 3 / 6.5, 3),
        "peak_cards": 4,
    }


def test_a_pod_that_moves_leaves_its_old_card_and_alone_it_frees_nothing() -> None:
    """One pod alone on its card the whole time: nothing freed, nothing saved, however small
    its fraction (fraction-hours save 75% here)."""
    samples = on_card("a", "GPU-1", range(30)) + on_card("a", "GPU-2", range(30, 60))
    report = build_report(samples, [], [], GpuPrices(), T0, T0 + timedelta(hours=1), T0)
    doc = report.as_dict()["fleet"]
    assert doc["savings_pct"] == 75.0
    cards = doc["cards"]
    assert (cards["gpus_whole"], cards["gpus_in_use"], cards["cards_freed"]) == (1, 1, 0)
    assert cards["card_hours"] == cards["whole_card_hours"] == 1.0
    assert cards["card_hours_saved_pct"] == 0.0
    assert cards["peak_cards"] == 1


def test_the_report_line_and_json_show_cards() -> None:
    samples = on_card("a", "GPU-1", range(60)) + on_card("b", "GPU-1", range(60))
    report = build_report(samples, [], [], GpuPrices(), T0, T0 + timedelta(hours=1), T0)
    document, page = render_report(report, charts=0)
    listing = render.report_listing(report, document)
    assert listing.footer == [
        "2 workloads, 0.5 of 2.0 GPU-hours held, $5.10 saved; 1 GPUs in use for 2 pods "
        "(1 freed), 1.0 of 2.0 card-hours; 0 actions"
    ]
    printed = json.loads(output.to_json(listing.document()))
    assert set(printed["fleet"]["cards"]) == {
        "gpus_whole",
        "gpus_in_use",
        "cards_freed",
        "card_hours",
        "whole_card_hours",
        "card_hours_saved",
        "card_hours_saved_pct",
        "peak_cards",
    }
    assert "cards freed" in page
    assert f"{num(printed['fleet']['cards']['card_hours_saved'])} (50.0%)" in page
