"""What the decision engine remembers of a workload, and its checkpoints.

History per workload is bounded: compute lives in a decaying histogram of 1% buckets (as the
VPA recommender keeps CPU), memory in per-slot peaks over the memory window, plus the last few
samples for upsize confirmation. :func:`dump_state` and :func:`load_state` checkpoint it (the
decision service keeps them in KV; ``fracpilot status`` reads them): JSON
(:func:`state_json`), zlib-compressed. A checkpoint in plain JSON, as written before
compression, still loads (a rolling upgrade). The decision service's checkpoint groups hold
each state in a compact binary form (:func:`state_bytes`, version 2), which :func:`load_state`
reads too: the exact doubles of the histogram and peaks packed with ``struct`` and
``array.tobytes`` (a few µs a state, where its JSON took about 45: ``repr`` of 101 floats).
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from itertools import chain, pairwise
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fracpilot_libs.sizing.kv_memory import PoolSource

BUCKETS = 101  # compute histogram: bucket i holds samples in ((i-1)%, i%]
MEMORY_SLOTS = 24  # the memory window is kept as this many per-slot peaks


def _empty_histogram() -> array[float]:
    return array("d", bytes(8 * BUCKETS))


_NO_SLOTS: array[float] = array("d")  # shared by every state without memory history (never
# mutated: observe copies before it writes)


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """What the engine remembers of one workload. Times are unix seconds.

    About 2 KiB in memory once the memory window is full (``bench/decision_memory.py``; a
    peak profile, where the decision service keeps one, adds about 0.5 KiB):
    numbers live in flat ``array('d')`` rather than tuples of boxed floats.
    """

    compute_weights: array[float] = field(default_factory=_empty_histogram)
    compute_total: float = 0.0
    compute_ref: float = 0.0  # reference time of the decaying weights
    # Memory peaks per slot, flat: slot start, peak, slot start, peak..., oldest first.
    memory_slots: array[float] = field(default_factory=lambda: _NO_SLOTS)
    recent_compute: tuple[float, ...] = ()  # the last few compute samples, newest last
    memory_over: int = 0  # consecutive samples with memory need above the fraction
    first_seen: float | None = None
    samples: int = 0
    current_fraction: float | None = None  # as last observed or decided
    decided_fraction: float | None = None  # the last fraction this engine asked for
    decided_at: float | None = None
    last_change_at: float | None = None
    below_since: float | None = None  # when the need first fell a full step below
    hold_until: float | None = None  # no downsize before this (after a signal)
    # Where the last sample observed sits in its stream (set by the service, 0 elsewhere): a
    # sample delivered again after a hand-over (at or before it) is not counted twice.
    position: int = 0
    # The application's waiting requests (vLLM) of the last samples that reported them, newest
    # last; empty when the last sample did not report them.
    recent_waiting: tuple[int, ...] = ()
    kv_cache_usage: float | None = None  # as the last sample reported it
    # memory_headroom learned (sizing/headroom.py): the largest jump above the trailing memory
    # peak so far, and the headroom learned from it (None: the uniform rule applies).
    memory_jump: float = 0.0
    memory_headroom: float | None = None
    # When the fraction changed within the last day, oldest first (the resize budget).
    resize_times: tuple[float, ...] = ()
    # The memory peak per period of the clock all workloads share, flat: period, peak...,
    # oldest first (sizing/peak_profile.py, kept by the engine's observe; for the card planner).
    memory_profile: array[float] = field(default_factory=lambda: _NO_SLOTS)
    # A preallocating LLM server's KV pool (sizing/kv_memory.py): the last pool size seen
    # (tokens) and the memory in use at it (bytes), the bytes per token learned across two pool
    # sizes, and the KV rule as the last sample applied it: (fixed part, pool, minimum pool or
    # -1 when unknown) in bytes, its reason, and how the pool was known.
    kv_anchor: tuple[float, float] | None = None
    kv_bytes_per_token: float | None = None
    kv_sized: tuple[float, float, float] | None = None
    kv_note: str = ""
    kv_pool_source: PoolSource = PoolSource.UNKNOWN

    @property
    def memory_peaks(self) -> tuple[tuple[float, float], ...]:
        """(slot start, peak) per memory slot, oldest first."""
        slots = self.memory_slots
        return tuple((slots[i], slots[i + 1]) for i in range(0, len(slots), 2))


_FIELDS = WorkloadState.__slots__


def evolve(state: WorkloadState, **changes: Any) -> WorkloadState:
    """``dataclasses.replace`` without its generic overhead (this is the engine's hot path)."""
    return WorkloadState(*[changes[f] if f in changes else getattr(state, f) for f in _FIELDS])


_STATE_VERSION = 1
_KV_NOTE_MAX = 300


def dump_state(state: WorkloadState) -> bytes:
    """The checkpoint of one workload's state, as stored: :func:`state_json` compressed by zlib
    at level 1 (about half the bytes, 0.9 KB on average; level 6 saves 2% more for three times
    the CPU). The decision service keeps states in groups
    (:mod:`fracpilot_libs.sizing.checkpoint_groups`); one state alone is how they were kept
    before groups, and still loads."""
    return zlib.compress(state_json(state), 1)


def state_json(state: WorkloadState) -> bytes:
    """A compact JSON document of one workload's state (under 3 KiB)."""
    body: dict[str, Any] = {}
    for name in WorkloadState.__slots__:
        if name == "memory_slots":
            body["memory_peaks"] = state.memory_peaks
        elif name == "memory_profile":
            profile = state.memory_profile
            if profile:  # absent when empty: as checkpoints written before it
                body[name] = [(int(profile[i]), profile[i + 1]) for i in range(0, len(profile), 2)]
        elif name == "kv_pool_source":
            if state.kv_pool_source is not PoolSource.UNKNOWN:  # absent: as before it
                body[name] = state.kv_pool_source.value
        elif name.startswith("kv_") and name != "kv_cache_usage":
            value = getattr(state, name)
            if value:  # absent when unknown: as checkpoints written before them
                body[name] = value[:_KV_NOTE_MAX] if isinstance(value, str) else value
        else:
            body[name] = getattr(state, name)
    # Exact floats (a rounded weight no longer sums to compute_total), trailing empties dropped.
    weights = state.compute_weights
    last = len(weights)
    while last and weights[last - 1] == 0.0:
        last -= 1
    body["compute_weights"] = weights[:last].tolist()
    body["v"] = _STATE_VERSION
    return json.dumps(body, separators=(",", ":")).encode()


class _Checkpoint(BaseModel):
    """The checkpoint's shape, checked on load: a field missing or of the wrong type fails,
    and so does NaN or an infinity (it would poison every later decision of the workload)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    v: Literal[1]
    compute_weights: list[float] = Field(max_length=BUCKETS)
    compute_total: float = Field(ge=0)
    compute_ref: float
    memory_peaks: list[tuple[float, float]] = Field(max_length=4 * MEMORY_SLOTS)
    recent_compute: list[float] = Field(max_length=20)
    memory_over: int = Field(ge=0)
    first_seen: float | None
    samples: int = Field(ge=0)
    current_fraction: float | None
    decided_fraction: float | None
    decided_at: float | None
    last_change_at: float | None
    below_since: float | None
    hold_until: float | None
    position: int = Field(default=0, ge=0)  # absent from checkpoints written before it
    recent_waiting: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=21)
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1)
    memory_jump: float = Field(default=0.0, ge=0, le=1)  # absent before the learned headroom
    memory_headroom: float | None = Field(default=None, ge=0, le=1)
    resize_times: list[float] = Field(default_factory=list, max_length=1441)
    # absent before peak profiles (and when empty); as many periods as peak_profile keeps
    memory_profile: list[tuple[int, Annotated[float, Field(ge=0, le=1)]]] = Field(
        default_factory=list, max_length=MEMORY_SLOTS + 2
    )

    # absent before the KV pool was learned (and when unknown)
    kv_anchor: tuple[Annotated[float, Field(gt=0)], Annotated[float, Field(ge=0)]] | None = None
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    kv_sized: (
        tuple[
            Annotated[float, Field(ge=0)],
            Annotated[float, Field(ge=0)],
            Annotated[float, Field(ge=-1)],
        ]
        | None
    ) = None
    kv_note: str = Field(default="", max_length=_KV_NOTE_MAX)
    kv_pool_source: PoolSource = PoolSource.UNKNOWN  # absent before it (and when unknown)

    @field_validator("memory_profile")
    @classmethod
    def _periods_increase(cls, value: list[tuple[int, float]]) -> list[tuple[int, float]]:
        if any(a[0] >= b[0] for a, b in pairwise(value)):
            raise ValueError("memory_profile's periods must increase")
        return value


_ZLIB = b"x"  # the first byte of every zlib stream (deflate, 32 KiB window); JSON starts "{"
_MAX_JSON = 64 * 1024  # far above any state: a value inflating beyond it is not a checkpoint


def inflate(data: bytes, limit: int = _MAX_JSON) -> bytes:
    """A zlib-compressed checkpoint's bytes; ValueError if it is not one (or inflates past
    ``limit``)."""
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data, limit)
    except zlib.error as exc:  # its checksum catches a flipped byte
        raise ValueError(f"not a decision-engine checkpoint: {exc}") from exc
    if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise ValueError("not a decision-engine checkpoint: truncated, too long or trailed")
    return body


def load_state(data: bytes) -> WorkloadState:
    """Restore a checkpoint written by :func:`dump_state`, or one in plain JSON
    (:func:`state_json`, as written before compression); raises ValueError if it is not one."""
    if data[:1] == _ZLIB:
        data = inflate(data)
    if data[:1] == _BINARY:
        return state_from_bytes(data)
    try:
        c = _Checkpoint.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"not a decision-engine checkpoint: {exc}") from exc
    # Straight from the validated fields: a restore of 100,000 workloads (or a fleet's
    # ``fracpilot status``) pays for every step here.
    weights = _empty_histogram()
    n = len(c.compute_weights)
    weights[0:n] = array("d", c.compute_weights)
    slots = array("d", chain.from_iterable(c.memory_peaks)) if c.memory_peaks else _NO_SLOTS
    return WorkloadState(
        compute_weights=weights,
        compute_total=c.compute_total,
        compute_ref=c.compute_ref,
        memory_slots=slots,
        recent_compute=tuple(c.recent_compute),
        memory_over=c.memory_over,
        first_seen=c.first_seen,
        samples=c.samples,
        current_fraction=c.current_fraction,
        decided_fraction=c.decided_fraction,
        decided_at=c.decided_at,
        last_change_at=c.last_change_at,
        below_since=c.below_since,
        hold_until=c.hold_until,
        position=c.position,
        recent_waiting=tuple(c.recent_waiting),
        kv_cache_usage=c.kv_cache_usage,
        memory_jump=c.memory_jump,
        memory_headroom=c.memory_headroom,
        resize_times=tuple(c.resize_times),
        memory_profile=(
            array("d", chain.from_iterable(c.memory_profile)) if c.memory_profile else _NO_SLOTS
        ),
        kv_anchor=c.kv_anchor,
        kv_bytes_per_token=c.kv_bytes_per_token,
        kv_sized=c.kv_sized,
        kv_note=c.kv_note,
        kv_pool_source=c.kv_pool_source,
    )


# --- the binary form (version 2) ------------------------------------------------------------
#
# Little-endian: a fixed head (the version byte, which optional fields are present, the
# lengths of the variable parts, every scalar; an absent optional is 0.0 with its bit clear),
# then the doubles of the histogram (trailing zeros dropped), the memory slots, the recent
# compute samples, the resize times and the memory profile, the waiting requests (int64) and
# the KV note (UTF-8); the KV pool's source is two bits of the mask, above the optionals'.
# Every double as it is in memory: the state loads back identical.

_BINARY = b"\x02"  # the first byte of a binary state (JSON starts "{", zlib "x")
_HEAD = struct.Struct("<BHBHBBHBH2d3q16d")
_OPTIONAL = (  # one bit each in the head's mask, in this order; then memory_jump
    "first_seen",
    "current_fraction",
    "decided_fraction",
    "decided_at",
    "last_change_at",
    "below_since",
    "hold_until",
    "kv_cache_usage",
    "memory_headroom",
    "kv_bytes_per_token",
)
_ANCHOR_BIT, _SIZED_BIT = 1 << len(_OPTIONAL), 1 << (len(_OPTIONAL) + 1)
_SOURCE_SHIFT = len(_OPTIONAL) + 2  # kv_pool_source: its index in _SOURCES, two bits
_SOURCES = (PoolSource.UNKNOWN, PoolSource.READ, PoolSource.LEARNED)
_NO_KV3 = (0.0, 0.0, 0.0)
_NO_KV2 = (0.0, 0.0)
_MAX_SLOTS, _MAX_RECENT, _MAX_WAITING, _MAX_RESIZES = 8 * MEMORY_SLOTS, 20, 21, 1441
_MAX_PROFILE = 2 * (MEMORY_SLOTS + 2)


def state_bytes(state: WorkloadState) -> bytes:
    """The binary form of one workload's state (version 2; under 3 KiB), read back by
    :func:`load_state` into an identical state (as compared by ``==``)."""
    s = state
    weights = s.compute_weights
    n = (len(weights.tobytes().rstrip(b"\0")) + 7) // 8  # trailing zero weights dropped
    mask = 0
    scalars = []
    for bit, value in enumerate(
        (
            s.first_seen,
            s.current_fraction,
            s.decided_fraction,
            s.decided_at,
            s.last_change_at,
            s.below_since,
            s.hold_until,
            s.kv_cache_usage,
            s.memory_headroom,
            s.kv_bytes_per_token,
        )
    ):
        if value is None:
            scalars.append(0.0)
        else:
            mask |= 1 << bit
            scalars.append(value)
    anchor, sized = s.kv_anchor, s.kv_sized
    if anchor is not None:
        mask |= _ANCHOR_BIT
    if sized is not None:
        mask |= _SIZED_BIT
    mask |= _SOURCES.index(s.kv_pool_source) << _SOURCE_SHIFT
    note = s.kv_note[:_KV_NOTE_MAX].encode()
    head = _HEAD.pack(
        2,
        mask,
        n,
        len(s.memory_slots),
        len(s.recent_compute),
        len(s.recent_waiting),
        len(s.resize_times),
        len(s.memory_profile),
        len(note),
        s.compute_total,
        s.compute_ref,
        s.memory_over,
        s.samples,
        s.position,
        *scalars,
        s.memory_jump,
        *(anchor or _NO_KV2),
        *(sized or _NO_KV3),
    )
    doubles = weights[:n]
    doubles += s.memory_slots
    doubles.fromlist(list(s.recent_compute))
    doubles.fromlist(list(s.resize_times))
    doubles += s.memory_profile
    return head + doubles.tobytes() + array("q", s.recent_waiting).tobytes() + note


def _finite(values: array[float]) -> bool:
    # A sum is finite when every term is (overflow aside: then each is looked at).
    return math.isfinite(sum(values)) or all(map(math.isfinite, values))


def state_from_bytes(data: bytes) -> WorkloadState:
    """A state from :func:`state_bytes`; ValueError when ``data`` is not one, or breaks a rule
    the JSON form is checked for (lengths, ranges, no NaN nor infinity)."""

    def bad(why: str) -> ValueError:
        return ValueError(f"not a decision-engine checkpoint: {why}")

    if len(data) < _HEAD.size:
        raise bad("binary state shorter than its head")
    head = _HEAD.unpack_from(data)
    version, mask, n, n_slots, n_recent, n_waiting, n_resizes, n_profile, n_note = head[:9]
    total, ref, memory_over, samples, position = head[9:14]
    scalars, memory_jump = head[14:24], head[24]
    anchor, sized = head[25:27], head[27:30]
    if version != 2:
        raise bad(f"binary state version {version}")
    if (
        n > BUCKETS
        or n_slots > _MAX_SLOTS
        or n_slots % 2
        or n_recent > _MAX_RECENT
        or n_waiting > _MAX_WAITING
        or n_resizes > _MAX_RESIZES
        or n_profile > _MAX_PROFILE
        or n_profile % 2
        or n_note > 4 * _KV_NOTE_MAX
        or mask >> _SOURCE_SHIFT >= len(_SOURCES)
    ):
        raise bad("binary state with a part too long")
    n_doubles = n + n_slots + n_recent + n_resizes + n_profile
    end = _HEAD.size + 8 * (n_doubles + n_waiting) + n_note
    if len(data) != end:
        raise bad(f"binary state of {len(data)} bytes where its head says {end}")
    doubles = array("d")
    doubles.frombytes(data[_HEAD.size : _HEAD.size + 8 * n_doubles])
    if not (_finite(doubles) and _finite(array("d", head[9:11] + head[14:]))):
        raise bad("NaN or infinity in a binary state")
    waiting = array("q")
    waiting.frombytes(data[_HEAD.size + 8 * n_doubles : end - n_note])
    try:
        note = data[end - n_note : end].decode()
    except UnicodeDecodeError as exc:
        raise bad("its KV note is not UTF-8") from exc
    optional = [v if mask >> i & 1 else None for i, v in enumerate(scalars)]
    (first_seen, current, decided, decided_at, changed_at, below, hold, kv_usage) = optional[:8]
    headroom, per_token = optional[8:10]
    kv_anchor = anchor if mask & _ANCHOR_BIT else None
    kv_sized = sized if mask & _SIZED_BIT else None
    i = n
    weights = _empty_histogram()
    weights[0:n] = doubles[0:n]
    slots = doubles[i : i + n_slots] if n_slots else _NO_SLOTS
    i += n_slots
    recent = tuple(doubles[i : i + n_recent])
    i += n_recent
    resizes = tuple(doubles[i : i + n_resizes])
    i += n_resizes
    profile = doubles[i : i + n_profile] if n_profile else _NO_SLOTS
    periods = profile[0::2]
    if (
        total < 0
        or memory_over < 0
        or samples < 0
        or position < 0
        or min(waiting, default=0) < 0
        or len(note) > _KV_NOTE_MAX
        or not 0 <= memory_jump <= 1
        or (kv_usage is not None and not 0 <= kv_usage <= 1)
        or (headroom is not None and not 0 <= headroom <= 1)
        or (per_token is not None and per_token <= 0)
        or (kv_anchor is not None and not (kv_anchor[0] > 0 and kv_anchor[1] >= 0))
        or (kv_sized is not None and not (min(kv_sized[:2]) >= 0 and kv_sized[2] >= -1))
        or any(not 0 <= peak <= 1 for peak in profile[1::2])
        or any(p != int(p) or p >= q for p, q in pairwise(periods))
        or any(p != int(p) for p in periods[-1:])
    ):
        raise bad("a binary state's value out of its range")
    return WorkloadState(
        compute_weights=weights,
        compute_total=total,
        compute_ref=ref,
        memory_slots=slots,
        recent_compute=recent,
        memory_over=memory_over,
        first_seen=first_seen,
        samples=samples,
        current_fraction=current,
        decided_fraction=decided,
        decided_at=decided_at,
        last_change_at=changed_at,
        below_since=below,
        hold_until=hold,
        position=position,
        recent_waiting=tuple(waiting),
        kv_cache_usage=kv_usage,
        memory_jump=memory_jump,
        memory_headroom=headroom,
        resize_times=resizes,
        memory_profile=profile,
        kv_anchor=kv_anchor,
        kv_bytes_per_token=per_token,
        kv_sized=kv_sized,
        kv_note=note,
        kv_pool_source=_SOURCES[mask >> _SOURCE_SHIFT],
    )
