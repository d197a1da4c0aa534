"""Workload states checkpointed in groups: several states in one KV value.

Each checkpoint is a message the NATS cluster replicates and stores; at 100,000 workloads one
per workload state cost nats-server more CPU than the samples themselves. So the decision
service keeps the states of a **group** in one value, under ``groups/<slot>/<g>``: ``slot``
is the workload's usage slot (:func:`fracpilot_libs.nats.subjects.slot_of`, fixed forever, as
the slot of its samples), ``g`` a hash of its whole key modulo :data:`GROUPS_PER_SLOT`. A slot
belongs to one partition whatever the partition count, and a partition to one replica at a
time, so one writer writes a group, and a change of the partition count moves groups whole.
About 24 states a group at 100,000 workloads (17 KB compressed), 245 at 1,000,000 (175 KB,
under nats-server's 1 MB payload).

A group's value is zlib-compressed text: a header line, then one line a state, its KV key, a
space, its JSON (:func:`~fracpilot_libs.sizing.state.state_json`). Keys hold no space nor
newline (``subjects.kv_key``), the JSON no newline.

Checkpoints written before groups, one per workload under its KV key, are still read
(:class:`CheckpointRead`): a workload in both takes the state with the later stream position,
a tie the group's (the group is written after the key, never before it, and the service
deletes the key once a group holding its workload is stored).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from fracpilot_libs.nats import subjects
from fracpilot_libs.sizing.state import WorkloadState, inflate, load_state, state_json

GROUP_PREFIX = "groups/"
GROUPS_PER_SLOT = 4  # fixed: every reader finds a workload's group from its key
_GROUP_KEY = re.compile(r"groups/(\d+)/(\d+)")
_HEADER = b"fracpilot-states 1\n"
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
    """One group's value: the states, by KV key, compressed together (the field names
    repeated from state to state compress away: 0.7 KB a state where one alone is 0.9)."""
    lines = [key.encode() + b" " + state_json(state) for key, state in states]
    return zlib.compress(_HEADER + b"\n".join(lines), 1)


def load_group(data: bytes) -> Iterator[tuple[str, WorkloadState | ValueError]]:
    """The states in a group's value, by KV key, each a state or why it does not load (that
    workload starts afresh, its neighbours not); raises ValueError when the value is not a
    group at all."""
    body = inflate(data, _MAX_GROUP)
    if not body.startswith(_HEADER):
        raise ValueError("not a group of decision-engine checkpoints: no header")
    for n, line in enumerate(body[len(_HEADER) :].split(b"\n")):
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
