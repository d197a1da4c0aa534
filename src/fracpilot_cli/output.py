"""One output layer for every command that prints data: ``-o table|wide|json|yaml|csv``.

A command builds a :class:`Listing` (its rows, the columns a table shows, the JSON-shaped
document ``json``/``yaml`` print, one flat record per row for ``csv``) and hands it to
:func:`emit`; it never formats for itself. Tables are plain aligned columns, as kubectl
prints them: fast for ten thousand rows, greppable, coloured only on a terminal. The JSON
document is each command's own (its keys are the stable interface scripts rely on); CSV
holds the same values as the document's items, one row each, nested values as compact JSON.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TextIO, TypeVar

import pydantic_core

Format = Literal["table", "wide", "json", "yaml", "csv"]
FORMATS: tuple[Format, ...] = ("table", "wide", "json", "yaml", "csv")
R = TypeVar("R")


class FormatError(ValueError):
    """An ``-o`` a command does not print."""


def choose(given: str | None, default: str, allowed: Sequence[str] = FORMATS) -> str:
    """The format asked for (``default`` when none), checked against what the command prints."""
    fmt = given or default
    if fmt not in allowed:
        raise FormatError(f"-o {fmt}: choose one of {', '.join(allowed)}")
    return fmt


@dataclass(frozen=True)
class Column(Generic[R]):
    """A table column: its header and the text of its cell for a row."""

    header: str
    cell: Callable[[R], str]
    wide: bool = False  # only with -o wide


@dataclass(frozen=True)
class Listing(Generic[R]):
    """What a command prints, as data."""

    rows: Sequence[R]
    columns: Sequence[Column[R]]
    document: Callable[[], Any]  # JSON-shaped: what -o json / -o yaml print (built if asked)
    record: Callable[[R], Mapping[str, Any]]  # one CSV row (flat keys; nested values as JSON)
    footer: Sequence[str] = ()  # under the table only
    style: Callable[[R], str] | None = None  # a rich style per row, on a terminal only
    title: str = ""  # above the table only
    csv_fields: Sequence[str] = field(default=())  # the CSV header; empty: the first record's


# --- table -----------------------------------------------------------------------------------


def align(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, three spaces apart, the last one unpadded."""
    widths = [len(h) for h in header]
    for cells in body:
        for i, cell in enumerate(cells):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    last = len(header) - 1

    def line(cells: Sequence[str]) -> str:
        return "   ".join(
            c if i == last else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    return [line(header), *(line(c) for c in body)]


def table_lines(listing: Listing[R], wide: bool = False) -> list[str]:
    """The header, one line per row, then (after a blank line) the footer."""
    columns = [c for c in listing.columns if wide or not c.wide]
    lines = align([c.header for c in columns], [[c.cell(r) for c in columns] for r in listing.rows])
    if listing.footer:
        lines += ["", *listing.footer]
    return lines


# --- CSV -------------------------------------------------------------------------------------


def csv_cell(value: object) -> str:
    """None as an empty cell, booleans as true/false, nested values as compact JSON."""
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def to_csv(listing: Listing[R]) -> str:
    records = [listing.record(r) for r in listing.rows]
    fields = list(listing.csv_fields) or (list(records[0]) if records else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    # Python 3.11's writer quotes a lone "\r" only when it is in the line terminator
    quoted = csv.writer(buffer, lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writerow(fields)
    for rec in records:
        cells = [csv_cell(rec.get(f)) for f in fields]
        (quoted if any("\r" in c for c in cells) else writer).writerow(cells)
    return buffer.getvalue()


# --- JSON ------------------------------------------------------------------------------------


def to_json(document: object) -> str:
    """Indented JSON (pydantic-core's encoder: ten times the standard library's with indent)."""
    return pydantic_core.to_json(document, indent=2).decode()


# --- YAML ------------------------------------------------------------------------------------


def yaml_dumper() -> type[Any]:
    """PyYAML's safe dumper with libyaml's emitter (``CSafeDumper``) when PyYAML was built with
    it, else the pure-Python ``SafeDumper``: the same text (tests/unit/cli/test_output.py),
    in about a third of the CPU time (bench/yaml_output.py)."""
    import yaml  # here: a table or JSON need not load PyYAML

    dumper: type[Any] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return dumper


def to_yaml(document: object, *, dumper: type[Any] | None = None) -> str:
    """Block-style YAML of the document ``-o json`` prints, by PyYAML's safe dumper
    (:func:`yaml_dumper` unless ``dumper`` names one).

    The document is made JSON-shaped first (as pydantic-core does for ``-o json``: datetimes
    as ISO text, tuples as lists), so both formats hold the same values. Only the emitter is
    libyaml's: PyYAML's representer stays Python, so ten thousand status rows still take
    seconds, where the table takes a tenth of one. Non-ASCII text is escaped, as JSON's
    default is; lines are never folded.
    """
    import yaml

    return yaml.dump(
        pydantic_core.to_jsonable_python(document),
        Dumper=dumper or yaml_dumper(),
        sort_keys=False,
        default_flow_style=False,
        width=1 << 30,
    )


# --- all of them -----------------------------------------------------------------------------


def render_text(listing: Listing[R], fmt: str) -> str:
    """The whole output in ``fmt``, ending with a newline."""
    if fmt == "json":
        return to_json(listing.document()) + "\n"
    if fmt == "yaml":
        return to_yaml(listing.document())
    if fmt == "csv":
        return to_csv(listing)
    lines = table_lines(listing, wide=fmt == "wide")
    if listing.title:
        lines = [listing.title, *lines]
    return "\n".join(lines) + "\n"


def emit(listing: Listing[R], fmt: str, out: TextIO | None = None) -> None:
    """Print ``listing`` in ``fmt`` on ``out`` (stdout); a table on a terminal is coloured."""
    import sys

    stream = out if out is not None else sys.stdout
    if fmt in ("table", "wide") and listing.style is not None and stream.isatty():
        _print_styled(listing, fmt == "wide")
        return
    stream.write(render_text(listing, fmt))
    stream.flush()


def styled(listing: Listing[R], wide: bool) -> Any:
    """The table as rich Text, each row in its style (a terminal's view)."""
    from rich.text import Text

    lines = table_lines(listing, wide)
    if listing.title:
        lines = [listing.title, *lines]
    head = 1 + bool(listing.title)
    text = Text(no_wrap=True, overflow="crop")
    for line in lines[:head]:
        text.append(line + "\n", style="bold")
    for row, line in zip(listing.rows, lines[head:], strict=False):
        text.append(line + "\n", style=listing.style(row) if listing.style else "")
    text.append("\n".join(lines[head + len(listing.rows) :]))
    return text


def _print_styled(listing: Listing[R], wide: bool) -> None:
    from rich.console import Console

    Console(highlight=False).print(styled(listing, wide), soft_wrap=True)
