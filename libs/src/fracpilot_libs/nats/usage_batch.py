"""The usage batch wire format: many samples in one message, each one decodable alone.

A batch is the samples of one usage partition from one scrape instant (at most
:data:`MAX_BATCH_SAMPLES` of them and :data:`MAX_BATCH_BYTES` on the wire, else several
batches), published on
:func:`fracpilot_libs.nats.subjects.usage_batch_subject` with its batch id as ``Nats-Msg-Id``.
The payload is lines separated by ``\\n``: first a
:class:`~fracpilot_libs.contracts.UsageBatchHeader` (its ``batch_format`` is the version of
this format), then one ``UsageSample`` JSON per line, exactly as the one-sample-per-message
format carries it. JSON never holds a raw newline, so the lines split without parsing, and a
sample that does not decode is refused alone: its line is dead-lettered with the batch id and
its index, its neighbours are decided.

The batch id is a digest of the partition and the sample ids: an instant read again yields the
same batches with the same ids, which the stream's duplicate window drops (samples are sorted
by id before they are cut into batches, so the cut does not depend on the source's order).

**Deflated on the wire.** What is published is those lines zlib-deflated (level 1, 2026-12-05):
14 times fewer bytes for the bench's samples (a 500-sample batch: 219 KiB of text, 15 KiB
deflated), for about 1.7 µs a sample to deflate and 0.8 µs to inflate. At R3 every byte of a
batch crosses the routes (to the stream leader, to its two followers, from the consumer's
leader) and is written twice on each node (raft log and stream), and nats-server's CPU per
sample followed the bytes (docs/performance.md, "nats-server CPU per sample at R3"). A reader
tells the two apart by the first byte (text starts with the header's ``{``, a zlib stream with
0x78) and reads both, so batches stored as text before stay readable. A reader older than this
cannot read a deflated batch (it dead-letters it whole): upgrade the decision replicas (and the
CLI) before ingest.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from pydantic import ValidationError

from fracpilot_libs.contracts import USAGE_BATCH_FORMAT, UsageBatchHeader, UsageSample
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.decoding import DecodeError, classify

# Samples a message at most: at R3 nats-server's CPU goes by the replicated message, not the
# byte (docs/performance.md, "nats-server CPU per sample at R3"), so a batch is as large as
# the payload limit allows: 2,000 bench samples are 880 KiB of text, 62 KiB deflated.
MAX_BATCH_SAMPLES = 2000
# A batch deflated to more than this (samples that do not compress) is cut in two, again and
# again: under nats-server's default max_payload of 1 MiB, headers included.
MAX_BATCH_BYTES = 900 * 1024
BATCH_ID_HEADER = "Fracpilot-Batch-Id"  # on a dead-lettered sample of a batch
BATCH_INDEX_HEADER = "Fracpilot-Batch-Index"  # its line, 0 = the first sample
DEFLATE_LEVEL = 1  # zlib's fastest: 6 makes it 20% smaller for twice the CPU
_DEFLATED = 0x78  # the first byte of a zlib stream (deflate, 32 KiB window); text starts with {
_MAX_INFLATED = 64 * 1024 * 1024  # far above a batch's text (500 samples of at most ~2 KiB)
_SERIALIZER = UsageSample.__pydantic_serializer__  # what UsageSample.to_json calls
# A row's sample id and its JSON, taken in C (a generator or a lambda per sample was a tenth of
# the batches' own work, past the JSON and the deflate).
_ID, _BODY = itemgetter(0), itemgetter(1)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One batch ready to publish."""

    subject: str
    batch_id: str
    payload: bytes  # what is published: the text, deflated (or not)
    sample_ids: tuple[str, ...]
    text: bytes  # the header line and the sample lines, as a reader gets them back


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch's header and its sample lines, not yet parsed (each is parsed alone)."""

    header: UsageBatchHeader
    lines: list[bytes]


def batch_id(partition: int, sample_ids: Iterable[str]) -> str:
    """SHA-256 of the partition, then of ``"\\n" + id`` for each sample id: hashed as one
    text (the digest of a stream is that of its parts fed one by one, two calls a sample)."""
    digest = hashlib.sha256("\n".join([str(partition), *sample_ids]).encode())
    return f"b{USAGE_BATCH_FORMAT}-{partition}-{digest.hexdigest()[:32]}"


def encode_batch(
    partition: int,
    partitions: int,
    samples: Sequence[tuple[str, bytes]],
    *,
    deflate: bool = True,
) -> EncodedBatch:
    """The batch of ``samples`` (``(sample_id, UsageSample JSON)``, in the order they are to
    be decided) of ``partition``; its payload deflated unless ``deflate`` is false (the text
    as readers before 2026-12-05 read it)."""
    ids = tuple(map(_ID, samples))
    bid = batch_id(partition, ids)
    header = UsageBatchHeader(
        batch_id=bid, partition=partition, partitions=partitions, samples=len(samples)
    )
    text = b"\n".join([header.to_json(), *map(_BODY, samples)])
    payload = zlib.compress(text, DEFLATE_LEVEL) if deflate else text
    return EncodedBatch(subjects.usage_batch_subject(partition), bid, payload, ids, text)


def batch_text(payload: bytes) -> bytes:
    """A batch's lines, inflated when the payload is deflated; raises :class:`DecodeError`
    for a deflated payload that does not inflate."""
    if not payload or payload[0] != _DEFLATED:
        return payload
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(payload, _MAX_INFLATED)
    except zlib.error as exc:
        raise DecodeError("decode", f"a deflated usage batch that does not inflate: {exc}") from exc
    if inflater.unconsumed_tail or not inflater.eof:
        raise DecodeError("decode", "a deflated usage batch, truncated or over 64 MiB inflated")
    return text


def encode_samples(
    samples: Iterable[UsageSample],
    partitions: int,
    max_samples: int = MAX_BATCH_SAMPLES,
    *,
    deflate: bool = True,
) -> list[EncodedBatch]:
    """The samples of one instant as batches: grouped by partition, sorted by sample id, cut
    every ``max_samples``, each deflated unless ``deflate`` is false."""
    by_partition: dict[int, list[tuple[str, bytes]]] = {}
    # Per sample (100,000 an instant): subjects.usage_partition and UsageSample.to_json
    # without their Python frames (the serializer's bytes are to_json's, not decoded and
    # encoded again).
    slot, to_json = subjects.workload_slot, _SERIALIZER.to_json
    for sample in samples:
        workload = sample.workload
        p = slot(workload.namespace, workload.owner_name) % partitions
        if (rows := by_partition.get(p)) is None:
            rows = by_partition[p] = []
        rows.append((sample.sample_id, to_json(sample)))
    return encode_partitions(by_partition, partitions, max_samples, deflate=deflate)


def encode_partitions(
    by_partition: Mapping[int, list[tuple[str, bytes]]],
    partitions: int,
    max_samples: int = MAX_BATCH_SAMPLES,
    *,
    deflate: bool = True,
) -> list[EncodedBatch]:
    """:func:`encode_samples` for samples already serialized and grouped: ``(sample_id,
    UsageSample JSON)`` rows by partition (a caller grouping by more than the partition
    serializes in one pass, in the order the samples lie in memory)."""
    batches = []
    for p in sorted(by_partition):
        rows = sorted(by_partition[p], key=_ID)
        for start in range(0, len(rows), max_samples):
            batches.extend(_cut(p, partitions, rows[start : start + max_samples], deflate))
    return batches


def _cut(
    partition: int, partitions: int, rows: list[tuple[str, bytes]], deflate: bool
) -> list[EncodedBatch]:
    """One batch, or halves of it while it is over :data:`MAX_BATCH_BYTES` (the same rows cut
    the same way every time: an instant read again gets the same batch ids)."""
    batch = encode_batch(partition, partitions, rows, deflate=deflate)
    if len(batch.payload) <= MAX_BATCH_BYTES or len(rows) == 1:
        return [batch]
    half = len(rows) // 2
    return [
        *_cut(partition, partitions, rows[:half], deflate),
        *_cut(partition, partitions, rows[half:], deflate),
    ]


def decode_batch(payload: bytes) -> DecodedBatch:
    """Split a batch (deflated or not) into its header and sample lines; raises
    :class:`DecodeError` when it does not inflate or the header is not one this version reads
    (then nothing in it can be trusted)."""
    first, _, rest = batch_text(payload).partition(b"\n")
    try:
        header = UsageBatchHeader.model_validate_json(first)
    except ValidationError as exc:
        error = classify(exc)
        raise DecodeError(error.kind, f"not a usage batch header: {error.reason}") from exc
    lines = rest.split(b"\n") if rest else []
    if len(lines) != header.samples:
        raise DecodeError(
            "validation", f"batch {header.batch_id} says {header.samples} samples, has {len(lines)}"
        )
    return DecodedBatch(header, lines)


def decode_sample(line: bytes) -> UsageSample:
    """One sample line; raises :class:`DecodeError` (refused alone)."""
    try:
        return UsageSample.model_validate_json(line)
    except ValidationError as exc:
        raise classify(exc) from exc


def as_samples(subject: str, data: bytes) -> list[tuple[str, bytes]]:
    """A stored usage message as the samples in it, each as ``(its own per-workload subject,
    its JSON)``: for readers of the usage streams that want the per-workload view (a
    one-sample message is returned as it is). Raises :class:`DecodeError` for a batch whose
    header is not read, or a sample line that does not decode."""
    if not subjects.is_usage_batch(subject):
        return [(subject, data)]
    return [
        (subjects.usage_subject(decode_sample(line).workload), line)
        for line in decode_batch(data).lines
    ]
