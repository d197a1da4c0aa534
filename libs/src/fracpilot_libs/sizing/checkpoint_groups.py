"""Workload states checkpointed in groups: several states in one KV value.

Each checkpoint is a message the NATS cluster replicates and stores; at 100,000 workloads one
per workload state cost nats-server more CPU than the samples themselves. So the decision
service keeps the states of a **group** in one value, under ``groups/<slot>/<g>``: ``slot``
is the workload's usage slot (:func:`fracpilot_libs.nats.subjects.slot_of`, fixed forever, as
the slot of its samples), ``g`` a hash of its whole key modulo :data:`GROUPS_PER_SLOT`. A slot
belongs to one partition whatever the partition count, and a partition to one replica at a
time, so one writer writes a group, and a change of the partition count moves groups whole.
About 24 states a group at 100,000 workloads (13 KB compressed), 245 at 1,000,000 (140 KB,
under nats-server's 1 MB payload).

A group's value is zlib-compressed: a header line, ``fracpilot-states 2``, then for each state
the length of its KV key (2 bytes, little-endian), the length of its state (4 bytes), the key
and the state in binary (:func:`~fracpilot_libs.sizing.state.state_bytes`: its exact doubles
packed, about 3 µs a state to encode where its JSON took about 45; a state holding an int past
64 bits is kept as its JSON instead, which holds any). Groups of the first version
(``fracpilot-states 1``, written before 2026-12-05's binary states) are still read: one line a
state, its KV key, a space, its JSON (:func:`~fracpilot_libs.sizing.state.state_json`).

Checkpoints written before groups, one per workload under its KV key, are still read
(:class:`CheckpointRead`): a workload in both takes the state with the later stream position,
a tie the group's (the group is written after the key, never before it, and the service
deletes the key once a group holding its workload is stored).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.state import (
    WorkloadState,
    inflate,
    load_state,
    state_bytes,
    state_from_bytes,
    state_json,
)

GROUP_PREFIX = "groups/"
GROUPS_PER_SLOT = 4  # fixed: every reader finds a workload's group from its key
_GROUP_KEY = re.compile(r"groups/(\d+)/(\d+)")
_HEADER = b"fracpilot-states 2\n"
_HEADER_JSON = b"fracpilot-states 1\n"  # the first version: a line of JSON a state
_ENTRY = struct.Struct("<HI")  # a state's key length, then its length
_BINARY = b"\x02"  # a state's first byte in binary (state_bytes); "{" in JSON, for an int
# past 64 bits
_MAX_GROUP = 256 * 1024 * 1024  # inflated: far above any group's size


def group_key(key: str) -> str | None:
    """The group holding the state of the workload whose KV key is ``key`` (None for a key
    of another shape: not a workload's)."""
    parts = key.rsplit("/", 3)
    if len(parts) != 4 or not parts[1] or not parts[3]:
        return None
    slot = subjects.workload_slot(parts[1], parts[3])  # cached: the same workloads each time
    return f"{GROUP_PREFIX}{slot}/{zlib.crc32(key.encode()) % GROUPS_PER_SLOT}"


def group_partition(key: str, partitions: int) -> int | None:
    """The usage partition of a group's states, when there are ``partitions`` (None: ``key``
    does not name a group)."""
    m = _GROUP_KEY.fullmatch(key)
    if m is None or int(m[1]) >= subjects.USAGE_SLOTS:
        return None
    return int(m[1]) % partitions


def dump_group(states: Iterable[tuple[str, WorkloadState]]) -> bytes:
    """One group's value: the states, by KV key, in binary, compressed together at zlib's
    level 1 (about 0.55 KB a state at 100,000 workloads; level 6 saves a tenth for twice the
    CPU)."""
    parts = [_HEADER]
    pack = _ENTRY.pack
    for key, state in states:
        try:
            body = state_bytes(state)
        except (OverflowError, struct.error):  # an int past 64 bits (a queue of 2^63 requests)
            body = state_json(state)  # its JSON holds any int; the reader takes either
        name = key.encode()
        parts += (pack(len(name), len(body)), name, body)
    return zlib.compress(b"".join(parts), 1)


def load_group(data: bytes) -> Iterator[tuple[str, WorkloadState | ValueError]]:
    """The states in a group's value (either version), by KV key, each a state or why it does
    not load (that workload starts afresh, its neighbours not); raises ValueError when the
    value is not a group at all."""
    body = inflate(data, _MAX_GROUP)
    if body.startswith(_HEADER_JSON):
        yield from _json_lines(body[len(_HEADER_JSON) :])
        return
    if not body.startswith(_HEADER):
        raise ValueError("not a group of decision-engine checkpoints: no header")
    view, at, n = memoryview(body), len(_HEADER), 0
    while at < len(body):
        if at + _ENTRY.size > len(body):
            yield f"?#{n}", ValueError("a group's entry cut short")
            return
        key_len, state_len = _ENTRY.unpack_from(body, at)
        at += _ENTRY.size
        name = bytes(view[at : at + key_len]).decode("utf-8", "replace")
        state = bytes(view[at + key_len : at + key_len + state_len])
        at += key_len + state_len
        if at > len(body):
            yield f"{name or '?'}#{n}", ValueError("a group's entry cut short")
            return
        n += 1
        if group_key(name) is None:
            yield f"{name or '?'}#{n - 1}", ValueError("not a workload's KV key")
            continue
        try:
            loaded = state_from_bytes(state) if state[:1] == _BINARY else load_state(state)
        except Exception as exc:  # any failure to load means a corrupt checkpoint
            yield name, ValueError(str(exc))
            continue
        yield name, loaded


def _json_lines(body: bytes) -> Iterator[tuple[str, WorkloadState | ValueError]]:
    """The states of a group of the first version: a line each, key, space, JSON."""
    for n, line in enumerate(body.split(b"\n")):
        if not line:
            continue
        key, _, state = line.partition(b" ")
        name = key.decode("utf-8", "replace")
        if not state or group_key(name) is None:
            yield f"{name or '?'}#{n}", ValueError("not a checkpoint line (key, space, state)")
            continue
        try:
            loaded = load_state(state)
        except Exception as exc:  # any failure to load means a corrupt checkpoint
            yield name, ValueError(str(exc))
            continue
        yield name, loaded


@dataclass
class CheckpointRead:
    """What a read of the checkpoint bucket found: the states of the workloads ``wanted``
    (groups and per-workload keys alike), what did not load, and the per-workload keys seen
    (the service deletes them once a group holds their workloads)."""

    wanted: Callable[[str], bool] = lambda key: True
    states: dict[str, WorkloadState] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (key, why)
    single_keys: set[str] = field(default_factory=set)
    _rank: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def add(self, key: str, data: bytes) -> None:
        """One entry of the bucket (a mark or any other key is left out)."""
        if key.startswith(GROUP_PREFIX):
            try:
                members = list(load_group(data))
            except Exception as exc:  # any failure to load means a corrupt checkpoint
                self.problems.append((key, str(exc)))
                return
            for name, state in members:
                if not self.wanted(name):
                    continue
                if isinstance(state, ValueError):
                    self.problems.append((f"{key}: {name}", str(state)))
                else:
                    self._keep(name, state, from_group=True)
            return
        if group_key(key) is None or not self.wanted(key):
            return
        self.single_keys.add(key)
        try:
            state = load_state(data)
        except Exception as exc:  # any failure to load means a corrupt checkpoint
            self.problems.append((key, str(exc)))
            return
        self._keep(key, state, from_group=False)

    def _keep(self, key: str, state: WorkloadState, from_group: bool) -> None:
        rank = (state.position, from_group)
        if key not in self._rank or rank > self._rank[key]:
            self._rank[key] = rank
            self.states[key] = state
