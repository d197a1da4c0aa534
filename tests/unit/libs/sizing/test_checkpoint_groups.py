"""Workload states checkpointed in groups (fracpilot_libs.sizing.checkpoint_groups)."""

from __future__ import annotations

import dataclasses
import zlib

import pytest

from factories import sample
from fracpilot_libs.contracts import Policy
from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.checkpoint_groups import (
    GROUPS_PER_SLOT,
    CheckpointRead,
    dump_group,
    group_key,
    group_partition,
    load_group,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.state import WorkloadState, dump_state, state_json


def state_of(name: str, samples: int, position: int = 0) -> WorkloadState:
    state = WorkloadState()
    for minute in range(samples):
        state, _ = decide(state, sample(name=name, compute=0.3, minute=minute), Policy())
    return dataclasses.replace(state, position=position)


KEYS = [f"c{c}/ns{n}/Deployment/w{i}" for c in range(2) for n in range(3) for i in range(40)]


def test_a_workloads_group_is_of_its_slot_so_of_its_partition_at_any_count() -> None:
    groups = {group_key(k) for k in KEYS}
    assert None not in groups
    for key in KEYS:
        group = group_key(key)
        assert group is not None
        for count in (1, 4, 8, 16, 33):
            assert group_partition(group, count) == subjects.partition_of_kv_key(key, count)
    assert len(groups) > len(KEYS) // 4  # spread, not all in a few


def test_the_group_of_a_key_is_fixed_forever() -> None:
    """Readers find a workload's group from its key: this is the format, not a detail."""
    key = "prod/ml/Deployment/chat"
    slot = subjects.slot_of("ml", "chat")
    assert group_key(key) == f"groups/{slot}/{zlib.crc32(key.encode()) % GROUPS_PER_SLOT}"
    assert GROUPS_PER_SLOT == 4


@pytest.mark.parametrize(
    "key", ["marks/FRACPILOT_USAGE_3", "groups/1/2", "a/b/c", "c//Deployment/w", ""]
)
def test_a_key_of_another_shape_has_no_group(key: str) -> None:
    assert group_key(key) is None


@pytest.mark.parametrize("key", ["groups/1024/0", "groups/x/1", "groups/1", "marks/p/1"])
def test_a_key_that_names_no_group_has_no_partition(key: str) -> None:
    assert group_partition(key, 4) is None


def test_a_group_holds_its_states_compressed_together() -> None:
    states = [(KEYS[i], state_of(f"w{i}", 5 + i)) for i in range(24)]
    value = dump_group(states)
    loaded = list(load_group(value))
    assert [k for k, _ in loaded] == [k for k, _ in states]
    assert all(got == want for (_, got), (_, want) in zip(loaded, states, strict=True))
    assert len(value) < sum(len(dump_state(s)) for _, s in states)  # less than one each
    assert list(load_group(dump_group([]))) == []


def test_a_bad_state_in_a_first_version_group_is_refused_alone() -> None:
    good = state_of("a", 4)
    # a group as written before binary states: a header line, then key, space, JSON a line
    lines = [b"fracpilot-states 1", *(k.encode() + b" " + state_json(good) for k in KEYS[:3])]
    lines[2] = lines[2].replace(b'"samples":4', b'"samples":"four"')  # KEYS[1]'s state
    lines.append(b"no-space-nor-state")
    loaded = dict(load_group(zlib.compress(b"\n".join(lines))))
    assert loaded[KEYS[0]] == good
    assert loaded[KEYS[2]] == good
    assert isinstance(loaded[KEYS[1]], ValueError)
    assert isinstance(loaded["no-space-nor-state#3"], ValueError)  # its line number named


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"garbage",
        dump_state(WorkloadState()),  # one state, not a group
        zlib.compress(b"another header\n"),
        dump_group([(KEYS[0], WorkloadState())])[:-4],  # truncated
    ],
)
def test_a_value_that_is_not_a_group_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the contract is "a ValueError"
        list(load_group(value))


def test_a_read_takes_the_later_position_and_a_tie_goes_to_the_group() -> None:
    older, newer, tie = state_of("a", 3, position=10), state_of("a", 5, position=20), 30
    a, b, c = KEYS[0], KEYS[1], KEYS[2]
    read = CheckpointRead()
    read.add(a, dump_state(newer))  # the per-workload key is newer (a rollback wrote it)
    read.add(b, state_json(older))  # plain JSON, from before compression
    read.add(c, dump_state(state_of("c", 2, position=tie)))
    read.add(
        "groups/1/0",
        dump_group([(a, older), (b, newer), (c, state_of("c", 7, position=tie))]),
    )
    read.add("marks/FRACPILOT_USAGE_0", b'{"seq": 4}')  # not a state: left out
    assert read.states[a] == newer
    assert read.states[b] == newer
    assert read.states[c].samples == 7
    assert read.single_keys == {a, b, c}
    assert read.problems == []


def test_a_read_keeps_the_wanted_workloads_and_reports_what_does_not_load() -> None:
    read = CheckpointRead(lambda key: "/ns0/" in key)
    read.add(KEYS[0], b"\x00 not a checkpoint")
    read.add(KEYS[50], b"\x00 not one either, and not wanted")
    read.add("groups/7/1", b"garbage")
    read.add("groups/7/2", dump_group([(KEYS[1], state_of("b", 2)), (KEYS[45], WorkloadState())]))
    assert set(read.states) == {KEYS[1]}
    assert [k for k, _ in read.problems] == [KEYS[0], "groups/7/1"]
    assert read.single_keys == {KEYS[0]}
