"""The binary form of a workload's state (fracpilot_libs.sizing.state.state_bytes, version 2)
and the checkpoint groups that hold it; groups and states of the JSON form still load."""

from __future__ import annotations

import base64
import dataclasses
import math
import struct
import zlib
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import sample
from fracpilot_libs.contracts import AppSignals, Policy
from fracpilot_libs.sizing.checkpoint_groups import CheckpointRead, dump_group, load_group
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.kv_memory import PoolSource
from fracpilot_libs.sizing.state import (
    BUCKETS,
    MEMORY_SLOTS,
    WorkloadState,
    load_state,
    state_bytes,
    state_from_bytes,
    state_json,
)

finite = st.floats(allow_nan=False, allow_infinity=False)
share = st.floats(min_value=0.0, max_value=1.0)
positive = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
non_negative = st.floats(min_value=0.0, allow_infinity=False)
count = st.integers(min_value=0, max_value=2**62)


def _flat(pairs: list[tuple[float, float]]) -> array[float]:
    return array("d", [x for pair in pairs for x in pair])


@st.composite
def profiles(draw: st.DrawFn) -> array[float]:
    periods = sorted(draw(st.sets(st.integers(-(2**40), 2**40), max_size=MEMORY_SLOTS + 2)))
    return _flat([(float(p), draw(share)) for p in periods])


states = st.builds(
    WorkloadState,
    compute_weights=st.lists(non_negative, min_size=BUCKETS, max_size=BUCKETS).map(
        lambda w: array("d", w)
    ),
    compute_total=non_negative,
    compute_ref=finite,
    memory_slots=st.lists(st.tuples(finite, share), max_size=MEMORY_SLOTS).map(_flat),
    recent_compute=st.lists(share, max_size=20).map(tuple),
    memory_over=count,
    first_seen=st.none() | finite,
    samples=count,
    current_fraction=st.none() | share,
    decided_fraction=st.none() | share,
    decided_at=st.none() | finite,
    last_change_at=st.none() | finite,
    below_since=st.none() | finite,
    hold_until=st.none() | finite,
    position=count,
    recent_waiting=st.lists(count, max_size=21).map(tuple),
    kv_cache_usage=st.none() | share,
    memory_jump=share,
    memory_headroom=st.none() | share,
    resize_times=st.lists(finite, max_size=50).map(tuple),
    memory_profile=profiles(),
    kv_anchor=st.none() | st.tuples(positive, non_negative),
    kv_bytes_per_token=st.none() | positive,
    kv_sized=st.none() | st.tuples(non_negative, non_negative, st.floats(-1.0, 1e12)),
    kv_note=st.text(max_size=300),
    kv_pool_source=st.sampled_from(PoolSource),
)


def assert_identical(got: WorkloadState, want: WorkloadState) -> None:
    """Equal, and every number the same double (0.0 and -0.0 told apart, types kept)."""
    assert got == want
    for name in WorkloadState.__slots__:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, array):
            assert a.tobytes() == b.tobytes(), name
        elif isinstance(b, float):
            assert struct.pack("<d", a) == struct.pack("<d", b), name


@settings(max_examples=300, deadline=None)
@given(states)
def test_any_state_loads_back_identical_from_its_binary_form(state: WorkloadState) -> None:
    data = state_bytes(state)
    assert_identical(state_from_bytes(data), state)
    assert_identical(load_state(data), state)  # the checkpoint reader takes it too
    assert state_bytes(state_from_bytes(data)) == data  # stable: a rewrite changes nothing


@settings(max_examples=100, deadline=None)
@given(st.lists(states, max_size=5))
def test_any_group_of_states_loads_back_identical(members: list[WorkloadState]) -> None:
    keys = [f"c/ns{i}/Deployment/w{i}" for i in range(len(members))]
    loaded = list(load_group(dump_group(zip(keys, members, strict=True))))
    assert [k for k, _ in loaded] == keys
    for (_, got), want in zip(loaded, members, strict=True):
        assert isinstance(got, WorkloadState)
        assert_identical(got, want)


def engine_state(name: str, samples: int, compute: float = 0.3, position: int = 0) -> WorkloadState:
    state = WorkloadState()
    for minute in range(samples):
        memory = 0.2 + 0.01 * (minute % 7)
        at = sample(name=name, compute=compute, memory_share=memory, minute=minute * 20)
        state, _ = decide(state, at, Policy())
    return dataclasses.replace(state, position=position)


@pytest.mark.parametrize("samples", [0, 1, 5, 200])
def test_the_engines_states_load_the_same_from_either_form(samples: int) -> None:
    state = engine_state("chat", samples, compute=0.37)
    assert_identical(load_state(state_bytes(state)), state)
    assert_identical(load_state(state_bytes(state)), load_state(state_json(state)))
    assert len(state_bytes(state)) < len(state_json(state))


# A group as main wrote it before binary states (commit 9044b1b, dump_group of two engine
# states: w0 after 3 samples of 0.3 at position 11, w1 after 7 of 0.55 at position 12).
_FIRST_VERSION_GROUP = base64.b64decode(
    "eAHNk8FOwzAMhu88Bep5dE67tFvPvMWEopC6ayBtqiTdBIh3x103ygZCAiHgkIvj2P7/fK6cVJ02Nlz5IAP6S3ah"
    "YN56mF9jZ+xDg22Y7+DyKVK26fqAYod6UwcfFWuIYfYXJ40BeL7kHHjCVixP+c3sdbxggzRR8T5nSnFYRQXL82QB"
    "qwwGBVGDjXUPokN5Pyhbn9xCzG6og0NFZoiDD3v9KelP6erw3G7RRQWVq7TzQXjE9ryRl01nkHqkNE/v3FCxoj8I"
    "2lIuxHwWlah0ieWbcNsbM8VliIoxYiR1UbVsNyim6C0auxNetwrPu9fWlKJvgyaHxhKd9XrszdirxJ2kWLshiaTt"
    "fiuUVDWK3ssNVRzfHRTf9U03jD1ZWKMsnbXNMdGh148ogm4G1UPBo9fOVtpQwfV6sUrSNCMv9z5vaernjyhk/4rC"
    "3yA/j2EBGST5cgXpImMJ2XfcwwPo71KmjJ/jnHP6HD6s2TdIz79AOsTZKejHRcz2jJ0Df3p7Av6I6afAJ78B/NsR"
    "J/+6T+F/AaKlmfY="
)


def test_a_group_written_before_binary_states_still_loads_whole() -> None:
    """An upgrade does not reset history: the JSON groups of the version before load into the
    states the engine had, and the next write turns them into the binary form."""
    w0 = dataclasses.replace(engine_state_as_before("w0", 3, 0.3), position=11)
    w1 = dataclasses.replace(engine_state_as_before("w1", 7, 0.55), position=12)
    loaded = dict(load_group(_FIRST_VERSION_GROUP))
    assert loaded == {"c0/ns0/Deployment/w0": w0, "c0/ns0/Deployment/w1": w1}
    read = CheckpointRead()
    read.add("groups/5/1", _FIRST_VERSION_GROUP)
    assert read.problems == []
    assert read.states["c0/ns0/Deployment/w1"].samples == 7
    again = dict(load_group(dump_group(read.states.items())))
    assert again == loaded
    assert zlib.decompress(dump_group(read.states.items())).startswith(b"fracpilot-states 2\n")


def engine_state_as_before(name: str, samples: int, compute: float) -> WorkloadState:
    state = WorkloadState()
    for minute in range(samples):
        state, _ = decide(state, sample(name=name, compute=compute, minute=minute), Policy())
    return state


def test_a_bad_state_in_a_binary_group_is_refused_alone() -> None:
    good = engine_state("a", 4)
    keys = [f"c/ns/Deployment/w{i}" for i in range(3)]
    body = bytearray(zlib.decompress(dump_group((k, good) for k in keys)))
    head, entry = len(b"fracpilot-states 2\n"), 6 + len(keys[0]) + len(state_bytes(good))
    samples_at = head + entry + 6 + len(keys[1]) + 1 + 2 + 1 + 2 + 1 + 1 + 2 + 1 + 2 + 16 + 8
    assert struct.unpack_from("<q", body, samples_at) == (4,)
    struct.pack_into("<q", body, samples_at, -4)  # keys[1]'s sample count
    loaded = dict(load_group(zlib.compress(bytes(body))))
    assert loaded[keys[0]] == good
    assert loaded[keys[2]] == good
    assert isinstance(loaded[keys[1]], ValueError)


def test_a_binary_group_cut_short_or_of_a_bad_key_names_the_entry() -> None:
    good = engine_state("a", 2)
    body = zlib.decompress(dump_group([("c/ns/Deployment/w0", good), ("not-a-key", good)]))
    loaded = list(load_group(zlib.compress(body)))
    assert loaded[0] == ("c/ns/Deployment/w0", good)
    assert loaded[1][0] == "not-a-key#1"
    assert isinstance(loaded[1][1], ValueError)
    cut = list(load_group(zlib.compress(body[:-10])))
    assert cut[0] == ("c/ns/Deployment/w0", good)
    assert isinstance(cut[-1][1], ValueError)


def _with(state: WorkloadState, **changes: Any) -> bytes:
    return state_bytes(dataclasses.replace(state, **changes))


_GOOD = engine_state("b", 30)
_DATA = state_bytes(_GOOD)


@pytest.mark.parametrize(
    "data",
    [
        _DATA[:-1],  # cut short
        _DATA + b"\0",  # trailed
        b"\x02",  # a version byte alone
        b"\x03" + _DATA[1:],  # a version not known
        _with(_GOOD, compute_total=math.nan),
        _with(_GOOD, hold_until=math.inf),
        _with(_GOOD, recent_compute=(0.1, math.nan)),
        _with(_GOOD, compute_total=-1.0),
        _with(_GOOD, samples=-1),
        _with(_GOOD, memory_jump=1.5),
        _with(_GOOD, kv_cache_usage=2.0),
        _with(_GOOD, kv_bytes_per_token=0.0),
        _with(_GOOD, recent_waiting=(3, -1)),
        _with(_GOOD, memory_profile=array("d", [5.0, 0.1, 4.0, 0.2])),  # periods go back
        _with(_GOOD, memory_profile=array("d", [5.5, 0.1])),  # a period not whole
        _with(_GOOD, memory_profile=array("d", [5.0, 1.1])),  # a peak above the card
        _with(_GOOD, recent_compute=(0.1,) * 21),  # longer than the JSON form allows
    ],
)
def test_a_binary_state_that_breaks_a_rule_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a decision-engine checkpoint"):
        load_state(data)


def test_huge_weights_that_overflow_their_sum_still_load() -> None:
    weights = array("d", [1e308] * 3 + [0.0] * (BUCKETS - 3))
    state = dataclasses.replace(_GOOD, compute_weights=weights, compute_total=1e308)
    assert_identical(load_state(state_bytes(state)), state)


def test_a_state_with_an_int_past_64_bits_is_kept_in_its_group_as_json() -> None:
    """A valid sample may report 2^63 waiting requests (no upper bound): that state cannot be
    packed, and is written as its JSON rather than failing its whole group's write."""
    huge = dataclasses.replace(_GOOD, recent_waiting=(2**63, 10**30), samples=2**70)
    with pytest.raises((OverflowError, struct.error)):
        state_bytes(huge)
    keys = ["c/ns/Deployment/w0", "c/ns/Deployment/w1"]
    loaded = dict(load_group(dump_group(zip(keys, (huge, _GOOD), strict=True))))
    assert loaded == {keys[0]: huge, keys[1]: _GOOD}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 1.0),
            st.floats(0.0, 1.0),
            st.none() | st.integers(0, 2**65),
            st.none() | st.floats(0.0, 1.0),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_the_engines_states_from_any_samples_load_back_from_a_group(
    readings: list[tuple[float, float, int | None, float | None]],
) -> None:
    state = WorkloadState()
    for minute, (compute, memory, waiting, kv) in enumerate(readings):
        signals = AppSignals(waiting_requests=waiting, kv_cache_usage=kv)
        at = sample(compute=compute, memory_share=memory, minute=minute * 7, signals=signals)
        state, _ = decide(state, at, Policy())
    assert list(load_group(dump_group([("c/ns/Deployment/w", state)]))) == [
        ("c/ns/Deployment/w", state)
    ]
