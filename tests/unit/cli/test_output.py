"""The output layer (``fracpilot_cli.output``): each format of one listing, read back."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_cli import output
from fracpilot_cli.options import GlobalOptions, OptionsError
from fracpilot_libs.contracts import Mode

ROWS = [
    {"name": "chat", "fraction": 0.5, "node": "gpu-1", "tags": ["a", "b"], "note": None},
    {"name": "batch-long-name", "fraction": 0.125, "node": "gpu-2", "tags": [], "note": "x, y"},
]


def listing(rows: list[dict[str, Any]] = ROWS) -> output.Listing[dict[str, Any]]:
    return output.Listing(
        rows=rows,
        columns=[
            output.Column("NAME", lambda r: r["name"]),
            output.Column("FRACTION", lambda r: f"{r['fraction']:g}"),
            output.Column("NODE", lambda r: r["node"], wide=True),
        ],
        document=lambda: {"kind": "Test", "items": rows},
        record=lambda r: r,
        footer=["2 rows"],
    )


def test_table_is_aligned_and_wide_adds_its_columns() -> None:
    table = output.render_text(listing(), "table").splitlines()
    assert table[0].split() == ["NAME", "FRACTION"]
    assert table[1].split() == ["chat", "0.5"]
    # columns line up: each row's second cell starts where the header's does
    start = table[0].index("FRACTION")
    assert table[2][start:].strip() == "0.125"
    assert table[-2:] == ["", "2 rows"]
    wide = output.render_text(listing(), "wide").splitlines()
    assert wide[0].split() == ["NAME", "FRACTION", "NODE"]
    assert wide[2].split() == ["batch-long-name", "0.125", "gpu-2"]


def test_json_and_yaml_print_the_document() -> None:
    document = {"kind": "Test", "items": ROWS}
    assert json.loads(output.render_text(listing(), "json")) == document
    assert yaml.safe_load(output.render_text(listing(), "yaml")) == document


def test_yaml_holds_what_json_holds_for_values_json_writes_as_text() -> None:
    """Datetimes, enums and tuples: -o yaml prints them as -o json does (PyYAML alone would
    write a YAML timestamp, or refuse), and text that YAML would read as another type is
    quoted."""
    when = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    document = {"at": when, "mode": Mode.AUTO, "pair": (1, 2), "words": ["yes", "null", "1.5"]}
    text = output.to_yaml(document)
    assert yaml.safe_load(text) == json.loads(output.to_json(document))
    assert yaml.safe_load(text)["words"] == ["yes", "null", "1.5"]
    assert "!!" not in text  # no Python-specific tags


def test_csv_holds_each_record_with_nested_values_as_json() -> None:
    rows = list(csv.DictReader(io.StringIO(output.render_text(listing(), "csv"))))
    assert [r["name"] for r in rows] == ["chat", "batch-long-name"]
    assert [float(r["fraction"]) for r in rows] == [0.5, 0.125]
    assert json.loads(rows[0]["tags"]) == ["a", "b"]
    assert rows[0]["note"] == ""  # None
    assert rows[1]["note"] == "x, y"  # quoted by the writer, read back whole


def test_an_empty_listing_prints_an_empty_csv_and_document() -> None:
    empty = listing([])
    assert output.render_text(empty, "csv") == "\n"
    assert json.loads(output.render_text(empty, "json"))["items"] == []


def test_choose_checks_the_format() -> None:
    assert output.choose(None, "table") == "table"
    assert output.choose("csv", "table") == "csv"
    with pytest.raises(output.FormatError, match="-o xml: choose one of table, wide"):
        output.choose("xml", "table")
    with pytest.raises(output.FormatError, match="choose one of text, json"):
        output.choose("csv", "text", ("text", "json"))


def test_json_flag_is_an_alias_of_o_json() -> None:
    assert GlobalOptions(as_json=True).format() == "json"
    assert GlobalOptions(as_json=True, output="json").format() == "json"
    assert GlobalOptions(output="yaml").format() == "yaml"
    with pytest.raises(OptionsError, match="--json is -o json"):
        GlobalOptions(as_json=True, output="yaml").format()


def test_nats_url_and_kubeconfig_options_are_alternatives() -> None:
    GlobalOptions(nats_url="nats://x:4222").check()
    with pytest.raises(OptionsError, match="give one or the other"):
        GlobalOptions(nats_url="nats://x:4222", context="prod").check()
    assert GlobalOptions(release="fp").kube
    assert not GlobalOptions(nats_url="nats://x:4222").kube


scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=12)
records = st.lists(
    st.fixed_dictionaries({"a": scalars, "b": scalars, "c": st.lists(st.integers(), max_size=3)}),
    max_size=5,
)


@given(records)
def test_csv_cells_read_back_as_their_values(rows: list[dict[str, Any]]) -> None:
    text = output.render_text(listing(rows), "csv")
    back = list(csv.DictReader(io.StringIO(text)))
    assert len(back) == len(rows)
    for got, want in zip(back, rows, strict=True):
        assert got == {k: output.csv_cell(v) for k, v in want.items()}
        assert json.loads(got["c"]) == want["c"]


@given(records)
def test_yaml_reads_back_as_the_json_document(rows: list[dict[str, Any]]) -> None:
    document = json.loads(output.render_text(listing(rows), "json"))
    assert yaml.safe_load(output.render_text(listing(rows), "yaml")) == document


# --- libyaml's emitter and the pure-Python one: the same text -----------------------------------

# Strings YAML treats specially: booleans and nulls of YAML 1.1, numbers, indicators, quotes,
# line breaks, surrounding blanks, control characters and text beyond ASCII (escaped).
# fmt: off
SPECIAL = [
    "", " ", "yes", "No", "on", "OFF", "y", "n", "~", "null", "Null", "true", "1.5", "1e3", "0x1f",
    "0o17", "012", ".inf", "-.NaN", "2026-03-02", "2026-03-02T01:02:03+00:00", "12:30", "- item",
    "? key", ": value", "a: b", "a #b", "#comment", "&anchor", "*alias", "!tag", "%directive",
    "@at", "`tick", "|", ">", "'single'", '"double"', "{a: 1}", "[1, 2]", "a, b", "line\nbreak",
    "trailing\n", " leading", "trailing ", "tab\there", "\x00nul", "bell\x07", "del\x7f",
    "é", "naïve façade", "ünïcödé: ä", "日本語", "emoji 🎉", "\u2028sep", "\ufeffbom", "\u00a0nbsp",
    "x" * 300, "---", "...", "=", "<<",
]
# fmt: on


def test_the_cli_uses_libyaml_when_pyyaml_has_it() -> None:
    assert yaml.__with_libyaml__, "the lock's PyYAML wheel is built with libyaml"
    assert output.yaml_dumper() is yaml.CSafeDumper


def status_like(text: str, i: int) -> dict[str, Any]:
    """A row shaped as ``fracpilot status -o yaml`` prints one, ``text`` in its string cells."""
    return {
        "cluster": text,
        "namespace": f"ns-{i}",
        "workload": text,
        "fraction": 0.5 if i % 2 else None,
        "gpu_memory_bytes": 42_949_672_960,
        "compute_p": i / 7,
        "state": Mode.AUTO,
        "last_action_at": datetime(2026, 3, 2, 1, 2, i % 60, tzinfo=UTC),
        "last_error": text or None,
        "tags": [text, i, -0.0, float("inf"), True],
        "empty": {},
        "nested": {f"key-{i}": [text], "list": []},
    }


def test_libyaml_and_pure_python_dumpers_write_the_same_bytes() -> None:
    document = {
        "kind": "WorkloadStatusList",
        "totals": {"workloads": len(SPECIAL), "saved": 1234.5},
        "items": [status_like(text, i) for i, text in enumerate(SPECIAL)],
    }
    fast = output.to_yaml(document, dumper=yaml.CSafeDumper)
    slow = output.to_yaml(document, dumper=yaml.SafeDumper)
    assert fast.encode() == slow.encode()
    assert yaml.safe_load(fast) == json.loads(output.to_json(document))


# The CLI's documents: a mapping (or a list of them) keyed by field names, label keys and the
# like (not empty, one line, short), any JSON value inside.
keys = st.text(min_size=1, max_size=40).filter(lambda k: "\r" not in k) | st.sampled_from(
    [k for k in SPECIAL if k and len(k) <= 40]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.sampled_from(SPECIAL),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)
cli_documents = st.dictionaries(keys, json_values, max_size=6) | st.lists(
    st.dictionaries(keys, json_values, max_size=4), max_size=3
)


@given(cli_documents)
def test_both_dumpers_agree_on_any_cli_document(document: Any) -> None:
    fast = output.to_yaml(document, dumper=yaml.CSafeDumper)
    assert fast.encode() == output.to_yaml(document, dumper=yaml.SafeDumper).encode()


@pytest.mark.parametrize(
    "document", [{"": 1}, {"a\rb": 1}, {"k" * 130: 1}, {"é" * 70: 1}, None, "text", 1.5]
)
def test_where_the_emitters_differ_both_read_back_the_same(document: Any) -> None:
    """Outside the CLI's documents the two emitters' texts differ: a key that is empty, holds a
    carriage return or is long (libyaml counts its bytes, PyYAML its characters) is written in
    the explicit ``? key`` form by one of them only; a lone scalar gets PyYAML's ``...`` end
    marker. The value read back is the same."""
    fast = output.to_yaml(document, dumper=yaml.CSafeDumper)
    slow = output.to_yaml(document, dumper=yaml.SafeDumper)
    assert yaml.safe_load(fast) == yaml.safe_load(slow) == document
