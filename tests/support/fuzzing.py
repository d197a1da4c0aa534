"""Generated bad input for the fuzz tests (tests/unit/fuzz, tests/integration/test_fuzz_*.py).

How many inputs each subject gets comes from the hypothesis profiles registered in
tests/conftest.py: ``fuzz`` (the default pass of ``make test``) or, with
``FRACPILOT_FUZZ_LONG=1`` (``make fuzz``), ``fuzz-long`` (at least 10,000 per subject).

The payload strategies start from a valid message and break it one way at a time, by kind:
``binary`` (random bytes), ``truncated`` (the valid JSON cut short), ``wrong_type`` (a field
given a value of another JSON type), ``non_finite`` (NaN and infinities, which Python's json
writes), ``huge`` (long strings, big numbers and arrays), ``deep`` (deeply nested arrays and
objects), ``out_of_range`` (a right-typed value beyond the field's bounds, a naive timestamp,
a future schema version, an unknown field, a missing field) and ``any_json`` (arbitrary JSON
documents).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fracpilot_libs.nats.bus import DecodeError, decode

T = TypeVar("T")

FUZZ_LONG = os.environ.get("FRACPILOT_FUZZ_LONG", "") not in ("", "0", "false")
PROFILE = "fuzz-long" if FUZZ_LONG else "fuzz"
MAX_PAYLOAD = 512 * 1024  # below NATS' default max_payload of 1 MiB, with room for headers


def fuzz_settings() -> settings:
    return settings.get_profile(PROFILE)


def examples_per_subject() -> int:
    return int(fuzz_settings().max_examples)


def run_property(strategy: st.SearchStrategy[T], check: Callable[[T], None]) -> int:
    """Run ``check`` on the profile's number of generated inputs; returns how many ran."""
    runs = 0

    @fuzz_settings()
    @given(strategy)
    def prop(value: T) -> None:
        nonlocal runs
        runs += 1
        check(value)

    prop()
    return runs


def draw(strategy: st.SearchStrategy[T], n: int | None = None) -> list[T]:
    """``n`` (default: the profile's count) generated values, for a test that sends them."""
    n = n or examples_per_subject()
    out: list[T] = []

    @settings(fuzz_settings(), max_examples=n)
    @given(strategy)
    def collect(value: T) -> None:
        out.append(value)

    collect()
    return out


# --- JSON values ------------------------------------------------------------------------------

SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=20,
)

BOUNDARY_NUMBERS: st.SearchStrategy[Any] = st.sampled_from(
    [
        -1,
        -0.0001,
        0,
        0.0,
        1.0000001,
        1.5,
        2,
        101,
        -(2**63),
        2**63,
        2**64 + 1,
        10**30,
        10**400,
        1e308,
        -1e308,
        5e-324,
    ]
)
BOUNDARY_STRINGS: st.SearchStrategy[Any] = st.sampled_from(
    [
        "",
        " ",
        "x" * 300,
        "x" * 5000,
        "a.b",
        "a b",
        "*",
        ">",
        "..",
        "\u0000",
        "\ud800",
        "é" * 100,
        "2026-03-02T00:00:00",  # naive: no timezone
        "10000-01-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "not a time",
    ]
)


def _dumps(body: Any) -> bytes:
    # ensure_ascii keeps lone surrogates printable; NaN and Infinity are written as json does
    return json.dumps(body, allow_nan=True).encode()


def _paths(body: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (dict keys and list indexes)."""
    out: list[tuple[Any, ...]] = []
    if isinstance(body, dict):
        for key, value in body.items():
            out.append((*prefix, key))
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(body, list):
        for i, value in enumerate(body):
            out.append((*prefix, i))
            out.extend(_paths(value, (*prefix, i)))
    return out


def _replaced(body: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> Any:
    copy = json.loads(json.dumps(body))
    target = copy
    for step in path[:-1]:
        target = target[step]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


def _deep(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def junk_payloads(valid: BaseModel) -> st.SearchStrategy[bytes]:
    """Bad variants of ``valid``'s JSON, of every kind in the module docstring."""
    return junk_json(valid.model_dump_json().encode(), MAX_PAYLOAD)


def junk_json(text: bytes, max_size: int) -> st.SearchStrategy[bytes]:
    """Bad variants of the JSON document ``text``, of every kind in the module docstring, each
    at most ``max_size`` bytes."""
    body = json.loads(text)
    paths = _paths(body)
    any_path = st.sampled_from(paths)

    binary = st.binary(min_size=0, max_size=2048)
    truncated = st.integers(min_value=0, max_value=len(text) - 1).map(lambda n: text[:n])
    wrong_type = st.tuples(any_path, JSON_VALUES).map(lambda p: _dumps(_replaced(body, *p)))
    non_finite = st.tuples(any_path, st.sampled_from([math_nan(), math_inf(), -math_inf()])).map(
        lambda p: _dumps(_replaced(body, *p))
    )
    huge = st.one_of(
        st.tuples(any_path, st.sampled_from(["y" * 200_000, 10**4000, [0] * 50_000])).map(
            lambda p: _dumps(_replaced(body, *p))
        ),
        st.integers(min_value=1, max_value=max_size // 2).map(lambda n: b" " * n + text),
        st.just(b"9" * (max_size - 16)),
    )
    deep = st.tuples(
        st.integers(min_value=50, max_value=100_000), st.sampled_from(["array", "object"])
    ).map(lambda p: _deep(*p))
    out_of_range = st.one_of(
        st.tuples(any_path, st.one_of(BOUNDARY_NUMBERS, BOUNDARY_STRINGS)).map(
            lambda p: _dumps(_replaced(body, *p))
        ),
        any_path.map(lambda p: _dumps(_replaced(body, p, None, delete=True))),
        st.just(_dumps({**body, "schema_version": 2})),
        st.text(min_size=1, max_size=20).map(lambda k: _dumps({**body, f"x-{k}": 1})),
    )
    any_json = JSON_VALUES.map(_dumps)
    return st.one_of(
        binary, truncated, wrong_type, non_finite, huge, deep, out_of_range, any_json
    ).filter(lambda b: len(b) <= max_size)


def rejected_junk(model: type[BaseModel], valid: BaseModel) -> st.SearchStrategy[bytes]:
    """Junk that ``model`` refuses (a mutation may leave a message valid: those are dropped)."""
    return junk_payloads(valid).filter(lambda data: not decodes(model, data))


def decodes(model: type[BaseModel], data: bytes) -> bool:
    try:
        decode(model, data)
    except DecodeError:
        return False
    return True


def math_nan() -> float:
    return float("nan")


def math_inf() -> float:
    return float("inf")
