"""Ingest shards, the pure part: which shard a GPU is in, and what one cycle of one replica
publishes given the shards it owns and their cursors. No I/O, no clock: the adapter,
:mod:`fracpilot_ingest.shards`, holds the leases (:mod:`fracpilot_libs.leases`) and the
cursors (NATS KV).

Several ingest replicas read one Prometheus source; the GPUs are split into ``shards`` by the
last hex digits of their UUID (:func:`shard_of`: the same on every replica and every run), and
each replica asks Prometheus only for the series of GPUs in shards it holds a lease on (a
label matcher, :func:`shard_regex`), so each downloads and decodes its share, not the whole.
Each shard has its own cursor, the last instant of it that is on NATS (:func:`cursor_key`), so
a shard taken over from a replica that died is published by its new owner from where the dead
one stopped.

No sample is counted twice: a shard's samples are encoded apart from every other shard's
(:func:`by_shard`), so the batches of one (shard, partition, instant) are the same whoever
publishes them, with the same batch ids (a digest of their sample ids,
:mod:`fracpilot_libs.nats.usage_batch`), and the stream's duplicate window drops a second copy
(an old owner still finishing the cycle it began while its lease ran out). None is skipped:
a cursor moves only past instants whose batches are all acknowledged, and only forward
(:func:`advanced`), whoever writes it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fracpilot_libs.contracts import UsageSample
from fracpilot_libs.nats.subjects import usage_partition
from fracpilot_libs.nats.usage_batch import MAX_BATCH_SAMPLES, EncodedBatch, encode_partitions
from fracpilot_libs.usage.attribution import Observation
from fracpilot_libs.usage.mappings import MappingTable
from fracpilot_libs.usage.mig import card_of

CURSOR_PREFIX = "prometheus.cursor"  # the unsharded cursor's key; a shard's adds .<N>.<k>


# GPUs whose shard one process remembers per shard count and kind (cards, devices), then
# forgets all at once: far above the GPUs of one source, a bound against churn over months.
_MEMO_LIMIT = 1 << 20


class _ShardMemo(dict[str, int]):
    """GPU -> shard for one shard count, kept across cycles (the same GPUs every cycle): asked
    per sample and per batch, a hit is one dict lookup. (An ``lru_cache`` of 65,536 missed
    every time at 100,000 GPUs, each cycle passing over all.) With ``cards``: keyed by a
    sample's device, whose shard is its card's (a MIG instance's parent), looked up there."""

    __slots__ = ("cards", "shards")

    def __init__(self, shards: int, cards: _ShardMemo | None = None) -> None:
        super().__init__()
        self.shards, self.cards = shards, cards

    def __missing__(self, gpu_uuid: str) -> int:
        if len(self) >= _MEMO_LIMIT:
            self.clear()
        if self.cards is not None:
            shard = self[gpu_uuid] = self.cards[card_of(gpu_uuid)]
            return shard
        shard = self[gpu_uuid] = _suffix_value(gpu_uuid) % self.shards
        return shard


@functools.cache  # one pair per shard count a process uses (one, or two across a change)
def _memos(shards: int) -> tuple[_ShardMemo, _ShardMemo]:
    """The shard count's memos: of cards' UUIDs (:func:`shard_of`), of devices'
    (:func:`gpu_shard`)."""
    cards = _ShardMemo(shards)
    return cards, _ShardMemo(shards, cards)


# Shard counts: powers of two up to 256, so that a shard is a set of values of the UUID's last
# two hex digits and a regex a Prometheus label matcher can hold (:func:`shard_regex`).
SHARD_COUNTS = tuple(2**b for b in range(1, 9))
_HEX = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}
_HEX_CHARS = {v: "".join(sorted({f"{v:x}", f"{v:X}"})) for v in range(16)}


def _suffix_value(gpu_uuid: str) -> int:
    """The UUID's last two hex digits as a number (0-255): a character that is not a hex
    digit, or is missing (a UUID of one character), counts as 0."""
    last = _HEX.get(gpu_uuid[-1], 0) if gpu_uuid else 0
    before = _HEX.get(gpu_uuid[-2], 0) if len(gpu_uuid) > 1 else 0
    return before << 4 | last


def shard_of(gpu_uuid: str, shards: int) -> int:
    """The shard of a GPU: the value of its UUID's last two hex digits modulo ``shards`` (one
    of :data:`SHARD_COUNTS`; up to 16 the last digit alone decides). Not a hash: Prometheus
    must be able to select a shard's series by a regex on the UUID label. NVIDIA's UUIDs are
    128-bit values printed in hex (``GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448``), so their last
    digits spread the GPUs evenly; UUIDs named by hand (``GPU-1``, ``GPU-2``) spread as their
    last characters do."""
    return _memos(shards)[0][gpu_uuid]


def _char_class(values: set[int]) -> str:
    """A regex character class of the hex digits with these values, either case; with 0, any
    character that is not a hex digit of another value (:func:`_suffix_value` counts those
    as 0); with all 16, any character (``.``, in :func:`shard_regex`'s ``(?s:…)``)."""
    if len(values) == 16:
        return "."
    if 0 not in values:
        return "[" + "".join(_HEX_CHARS[v] for v in sorted(values)) + "]"
    others = "".join(_HEX_CHARS[v] for v in range(16) if v not in values)
    return f"[^{others}]"


def shard_regex(held: Iterable[int], shards: int) -> str:
    """The regex (RE2 and Python's alike, matched whole as Prometheus anchors a label
    matcher's) that a GPU UUID matches exactly when its :func:`shard_of` is in ``held``
    (not empty, not every shard: those need no matcher). One alternative per set of
    second-last digits: the last digits that share one are a character class together (two
    replicas of 32 shards: at most three alternatives where one per last digit made 16, which
    cost Prometheus twice the selection time; docs/performance.md). In ``(?s:…)``, so that
    ``.`` takes a newline too: Prometheus 3 compiles a label regex so
    (``model/labels/regexp.go``, ``NewFastRegexMatcher``), Prometheus 2 without it, which would
    leave a UUID with a newline to no replica."""
    held = set(held)
    if not held or len(held) >= shards or shards not in SHARD_COUNTS:
        raise ValueError(f"a regex for {sorted(held)} of {shards} shards")
    if shards <= 16:
        return "(?s:.*" + _char_class({v for v in range(16) if v % shards in held}) + ")"
    high = shards // 16  # the second-last digit's residues, modulo this
    lasts_by_before: dict[frozenset[int], set[int]] = {}
    for last in range(16):
        residues = {k // 16 for k in held if k % 16 == last}
        if residues:
            before = frozenset(v for v in range(16) if v % high in residues)
            lasts_by_before.setdefault(before, set()).add(last)
    alternatives = []
    for before, lasts in sorted(lasts_by_before.items(), key=lambda item: sorted(item[0])):
        if len(before) == 16:  # any second-last digit, or none
            alternatives.append(".*" + _char_class(lasts))
        elif 0 in before:  # a missing second-last digit counts as 0
            alternatives.append(f"(.*{_char_class(set(before))})?{_char_class(lasts)}")
        else:
            alternatives.append(f".*{_char_class(set(before))}{_char_class(lasts)}")
    return "(?s:" + "|".join(alternatives) + ")"


def gpu_shard(gpu_uuid: str, shards: int) -> int:
    """The shard of a sample's GPU: its card's (a MIG instance, ``UUID/GI2``, is on its
    card's shard: the card's series carry the card's UUID)."""
    return _memos(shards)[1][gpu_uuid]


LabelGroup = tuple[tuple[str, ...], tuple[str, ...]]  # GPU labels in a row's order, metrics


def gpu_label_groups(table: MappingTable) -> tuple[LabelGroup, ...]:
    """The mapping table's rows grouped by the GPU labels they try, in their order (a series'
    GPU is the first of its row's labels it carries), with the metrics of each group: a
    shard's query asks each group's metrics by that group's labels, so a series carrying two
    GPU labels is fetched for the shard its row will keep it for (one order for all rows would
    fetch it for the other's where two rows disagree)."""
    groups: dict[tuple[str, ...], dict[str, None]] = {}
    for row in table.rows:
        groups.setdefault(row.roles.gpu_uuid, {})[row.metric] = None
    return tuple((labels, tuple(metrics)) for labels, metrics in groups.items())


def cursor_key(shard: int, shards: int) -> str:
    """A shard's cursor key in the ingest state bucket. The shard count is part of it: shard
    ``k`` of 8 is not the same GPUs as shard ``k`` of 16."""
    return f"{CURSOR_PREFIX}.{shards}.{shard}"


def parse_cursor(value: bytes) -> float | None:
    try:
        return float(value.decode())
    except ValueError:
        return None


def advanced(stored: float | None, end: float) -> bool:
    """Whether writing ``end`` over the ``stored`` cursor moves it forward (a cursor never
    moves back: an old owner finishing late writes nothing the new owner has passed)."""
    return stored is None or end > stored


@dataclass(frozen=True)
class CyclePlan:
    """One replica's cycle: the shards it publishes and, for each, its cursor when the cycle
    began (the last instant of that shard on NATS)."""

    shards: int
    cursors: Mapping[int, float]

    @property
    def start(self) -> float | None:
        """The earliest cursor: the cycle reads from the instant after it (None: no shard)."""
        return min(self.cursors.values(), default=None)

    def keeps(self, gpu_uuid: str, instant: float) -> bool:
        """Whether this cycle publishes the GPU's sample of ``instant``: its shard is one of
        the cycle's and the instant is past that shard's cursor."""
        cursor = self.cursors.get(_memos(self.shards)[1][gpu_uuid])
        return cursor is not None and instant > cursor

    def kept(self, observations: Sequence[Observation]) -> list[Observation]:
        """The observations this cycle publishes (:meth:`keeps` of each), in one pass: once
        per sample of the replica's share."""
        shard, cursors = _memos(self.shards)[1], self.cursors
        return [
            obs
            for obs in observations
            if (cursor := cursors.get(shard[obs.gpu_uuid])) is not None and obs.timestamp > cursor
        ]

    @property
    def holds_all(self) -> bool:
        """Whether the cycle publishes every shard (then its query needs no shard matcher)."""
        return len(self.cursors) >= self.shards

    def uuid_regex(self) -> str:
        """The regex of the GPU UUIDs of the cycle's shards (:func:`shard_regex`)."""
        return shard_regex(self.cursors, self.shards)


def plan_cycle(
    shards: int,
    owned: Iterable[int],
    stored: Mapping[int, float],
    fallback: float,
) -> CyclePlan:
    """The cycle of a replica owning ``owned``: each shard from its ``stored`` cursor, or from
    ``fallback`` (the unsharded cursor, or the back-fill's start) when it has none yet."""
    return CyclePlan(shards, {k: stored.get(k, fallback) for k in sorted(owned)})


def by_shard(samples: Iterable[UsageSample], shards: int) -> list[list[UsageSample]]:
    """The samples of one instant grouped by their GPU's shard, in shard order: each group is
    encoded into batches of its own."""
    shard = _memos(shards)[1]
    groups: dict[int, list[UsageSample]] = {}
    for sample in samples:
        groups.setdefault(shard[sample.gpu_uuid], []).append(sample)
    return [groups[k] for k in sorted(groups)]


def encode_by_shard(
    samples: Iterable[UsageSample],
    shards: int,
    partitions: int,
    max_samples: int = MAX_BATCH_SAMPLES,
) -> list[EncodedBatch]:
    """The batches of one instant's samples, each shard's apart (in shard order): the same
    batches as :func:`by_shard` then ``encode_samples`` per group, the samples serialized in
    one pass in the order they were made (taken group by group, scattered in memory, their
    serialization cost about 2 µs a sample more at 100,000)."""
    shard = _memos(shards)[1]
    rows: dict[int, dict[int, list[tuple[str, bytes]]]] = {}
    for sample in samples:
        by_partition = rows.get(k := shard[sample.gpu_uuid])
        if by_partition is None:
            by_partition = rows[k] = {}
        p = usage_partition(sample.workload, partitions)
        by_partition.setdefault(p, []).append((sample.sample_id, sample.to_json()))
    return [
        batch for k in sorted(rows) for batch in encode_partitions(rows[k], partitions, max_samples)
    ]
