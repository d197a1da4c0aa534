"""How ``fracpilot status`` prints its rows: an aligned table, -o wide, JSON and YAML."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import GIB, T0, sample, v1_policy, workload
from fracpilot_cli import render
from fracpilot_cli.status import FleetSnapshot, StatusRow, build_status_rows
from fracpilot_libs.contracts import Allocation
from fracpilot_libs.nats import subjects
from fracpilot_libs.pricing import GpuPrices
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState


def rows(n: int = 3) -> list[StatusRow]:
    snapshot = FleetSnapshot()
    for i in range(n):
        wl = workload(f"service-{i}" + "x" * i)
        key = subjects.kv_key(wl)
        held = 0.5
        snapshot.allocations[key] = Allocation(
            workload=wl,
            pod="p",
            node="n",
            gpu_uuid="g",
            fraction=held,
            device_memory_bytes=80 * GIB,
            updated_at=T0,
        )
        state = WorkloadState()
        for m in range(20):
            s = sample(0.1 * i, 0.1, minute=m, name=wl.owner_name, allocated=held)
            state, _ = decide(state, s, v1_policy())
        snapshot.states[key] = state
        snapshot.samples[key] = s
    return build_status_rows(
        snapshot, lambda _: v1_policy(), GpuPrices(), datetime(2026, 12, 1, tzinfo=UTC)
    )


def test_small_formats() -> None:
    assert render.duration(45) == "45s"
    assert render.duration(2520) == "42m"
    assert render.duration(3 * 3600 + 600) == "3h10m"
    assert render.duration(7200) == "2h"
    assert render.duration(2 * 86400 + 4 * 3600) == "2d4h"
    assert render.duration(None) == "-"
    assert render.gib(40 * GIB) == "40Gi"
    assert render.gib(int(37.5 * GIB)) == "37.5Gi"
    assert render.percent(1.124) == "112%"
    assert render.money(1241.2) == "$1,241"
    assert render.fraction(0.375) == "0.375"


def test_the_table_is_aligned_with_one_line_per_row_and_a_footer() -> None:
    status = rows()
    for wide in (False, True):
        lines = render.status_lines(status, wide=wide)
        header = render.WIDE_COLUMNS if wide else render.COLUMNS
        assert len(lines) == 1 + len(status) + 2
        starts, at = [], 0
        for h in header:
            at = lines[0].index(h, at)
            starts.append(at)
            at += len(h)
        for line, r in zip(lines[1 : 1 + len(status)], status, strict=True):
            cells = render.status_cells(r, wide)
            for cell, start in zip(cells, starts, strict=True):  # under its header
                assert line[start : start + len(cell)] == cell
                assert start == 0 or line[start - 1] == " "
        assert lines[-1].startswith(f"{len(status)} workloads, 1.50 GPUs held")


def test_waiting_rows_show_the_time_left() -> None:
    status = rows(1)
    assert status[0].state == "waiting to downsize"
    assert re.search(r"waiting to downsize \(41m\)", render.status_lines(status)[1])


def test_json_and_yaml_hold_every_field() -> None:
    status = rows()
    document = render.status_document(status, T0)
    assert json.loads(render.to_json(document)) == document
    assert yaml.safe_load(render.to_yaml(document)) == document
    assert [i["workload"] for i in document["items"]] == [r.workload for r in status]
    assert document["totals"]["workloads"] == 3


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
        max_leaves=12,
    )
)
def test_yaml_round_trips_any_json_document(document: Any) -> None:
    assert yaml.safe_load(render.to_yaml(document)) == document


def test_the_demo_names_the_three_commands_with_its_nats_url() -> None:
    from fracpilot_cli.operator_cli import operator_hint

    hint = operator_hint("nats://127.0.0.1:4321", "inference/chat", embedded=True)
    lines = hint.splitlines()
    assert "the embedded NATS stops with the demo" in lines[0]
    commands = [line.split("fracpilot", 1)[1].strip() for line in lines[1:]]
    assert commands == [
        "status --watch",
        "explain inference/chat",
        "report --since 1h --out fracpilot-report",
    ]
    assert all(
        line.strip().startswith("FRACPILOT_NATS_URL=nats://127.0.0.1:4321 ") for line in lines[1:]
    )
