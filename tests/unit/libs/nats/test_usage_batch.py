"""The usage batch codec: a round trip keeps every sample and its order; a bad sample line is
refused alone; a header this version does not read refuses the batch."""

from __future__ import annotations

import hashlib
import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factories import T0, sample
from fracpilot_libs.contracts import USAGE_BATCH_FORMAT, UsageBatchHeader, UsageSample
from fracpilot_libs.nats import subjects, usage_batch
from fracpilot_libs.nats.decoding import DecodeError
from fracpilot_libs.nats.usage_batch import (
    MAX_BATCH_SAMPLES,
    as_samples,
    decode_batch,
    decode_sample,
    encode_samples,
)

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1)


@st.composite
def usage_samples(draw: st.DrawFn) -> list[UsageSample]:
    count = draw(st.integers(min_value=0, max_value=40))
    out = []
    for i in range(count):
        name = draw(st.sampled_from(["chat", "embed", "batch", "ns.with.dots", "we ird\n"]))
        out.append(
            sample(
                compute=draw(st.floats(min_value=0, max_value=1)),
                memory_share=draw(st.floats(min_value=0, max_value=1)),
                at=T0 + timedelta(seconds=15 * draw(st.integers(0, 3))),
                name=name,
                pod=f"{draw(names)[:200]}",
                sample_id=f"id-{i}-{draw(names)[:50]}",
            )
        )
    return out


@given(samples=usage_samples(), partitions=st.integers(1, 64), cut=st.integers(1, 7))
def test_a_round_trip_keeps_every_sample_in_its_partition(
    samples: list[UsageSample], partitions: int, cut: int
) -> None:
    batches = encode_samples(samples, partitions, max_samples=cut)
    back: list[UsageSample] = []
    ids = set()
    for b in batches:
        decoded = decode_batch(b.payload)
        assert decoded.header.batch_id == b.batch_id
        assert b.subject == subjects.usage_batch_subject(decoded.header.partition)
        assert subjects.is_usage_batch(b.subject)
        assert 1 <= len(decoded.lines) <= cut
        got = [decode_sample(line) for line in decoded.lines]
        assert [s.sample_id for s in got] == sorted(s.sample_id for s in got)
        for s in got:
            assert subjects.usage_partition(s.workload, partitions) == decoded.header.partition
        back.extend(got)
        ids.add(b.batch_id)
    assert len(ids) == len(batches)  # every batch its own id
    assert sorted(back, key=lambda s: s.sample_id) == sorted(samples, key=lambda s: s.sample_id)


def fed_one_by_one(partition: int, sample_ids: list[str]) -> str:
    """The batch id as it was first computed (2026-12-05): the partition, then a newline and
    each id, fed to the digest one by one. Stored batches' ids: an instant read again after
    an upgrade must get the same."""
    digest = hashlib.sha256(str(partition).encode())
    for sample_id in sample_ids:
        digest.update(b"\n")
        digest.update(sample_id.encode())
    return f"b{USAGE_BATCH_FORMAT}-{partition}-{digest.hexdigest()[:32]}"


@given(partition=st.integers(0, 1023), sample_ids=st.lists(names, max_size=20))
def test_a_batch_id_is_the_digest_it_always_was(partition: int, sample_ids: list[str]) -> None:
    assert usage_batch.batch_id(partition, sample_ids) == fed_one_by_one(partition, sample_ids)
    assert (
        usage_batch.batch_id(3, ["a", "b"]) == "b1-3-" + hashlib.sha256(b"3\na\nb").hexdigest()[:32]
    )


@given(samples=usage_samples(), partitions=st.integers(1, 16))
def test_a_batch_carries_each_sample_as_the_one_sample_format_does(
    samples: list[UsageSample], partitions: int
) -> None:
    by_id = {s.sample_id: s for s in samples}
    for b in encode_samples(samples, partitions, deflate=False):
        lines = decode_batch(b.payload).lines
        assert lines == [by_id[sample_id].to_json() for sample_id in b.sample_ids]
        for sample_id in b.sample_ids:
            p = subjects.usage_partition(by_id[sample_id].workload, partitions)
            assert b.subject == subjects.usage_batch_subject(p)


@given(samples=usage_samples(), partitions=st.integers(1, 16))
def test_the_same_instant_read_again_gives_the_same_batch_ids(
    samples: list[UsageSample], partitions: int
) -> None:
    first = encode_samples(samples, partitions)
    again = encode_samples(list(reversed(samples)), partitions)  # another source order
    assert [(b.batch_id, b.payload) for b in first] == [(b.batch_id, b.payload) for b in again]


@given(
    samples=usage_samples().filter(lambda s: len(s) >= 1),
    bad=st.sampled_from(
        [
            b'{"schema_version": 1, "oops',
            b"\xff\xfe\x00garbage",
            b"[1, 2, 3]",
            b'{"schema_version": 99}',
            b"",
        ]
    ),
    where=st.integers(min_value=0),
)
def test_a_bad_sample_is_refused_alone(samples: list[UsageSample], bad: bytes, where: int) -> None:
    (batch, *_) = encode_samples(samples, 1, max_samples=len(samples))
    head, *lines = batch.text.split(b"\n")
    index = where % (len(lines) + 1)
    lines.insert(index, bad)
    header = UsageBatchHeader.model_validate_json(head).model_copy(update={"samples": len(lines)})
    decoded = decode_batch(b"\n".join([header.to_json(), *lines]))
    good, refused = [], []
    for i, line in enumerate(decoded.lines):
        try:
            good.append(decode_sample(line))
        except DecodeError as error:
            refused.append((i, error.kind))
    assert [i for i, _ in refused] == [index]
    assert refused[0][1] in ("decode", "validation")
    assert [s.sample_id for s in good] == sorted(s.sample_id for s in samples)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json\n{}",
        b'{"batch_format": 2, "batch_id": "x", "partition": 0, "partitions": 1, "samples": 0}',
        b'{"batch_format": 1, "batch_id": "x", "partition": 0, "partitions": 1, "samples": 2}\n{}',
    ],
    ids=["empty", "not_json", "unknown_format", "count_mismatch"],
)
def test_a_batch_whose_header_is_not_read_is_refused_whole(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


@given(samples=usage_samples(), partitions=st.integers(1, 16))
def test_a_batch_reads_the_same_deflated_or_as_text(
    samples: list[UsageSample], partitions: int
) -> None:
    """Batches stored as text (before 2026-12-05) and deflated ones, in one stream, read alike."""
    deflated = encode_samples(samples, partitions)
    text = encode_samples(samples, partitions, deflate=False)
    assert [b.batch_id for b in deflated] == [b.batch_id for b in text]  # one id: deduplicated
    for d, t in zip(deflated, text, strict=True):
        assert d.payload[:1] == b"x"
        assert t.payload[:1] == b"{"
        assert t.payload == d.text == t.text
        assert decode_batch(d.payload) == decode_batch(t.payload)
        assert as_samples(d.subject, d.payload) == as_samples(t.subject, t.payload)


def test_a_deflated_batch_is_smaller_than_its_text() -> None:
    many = [sample(name="chat", pod=f"chat-{i}", sample_id=f"s-{i:06}") for i in range(500)]
    (batch,) = encode_samples(many, 1)
    assert len(batch.payload) * 5 < len(batch.text)


@pytest.mark.parametrize("cut", [1, 2, 10, -1], ids=["one_byte", "two_bytes", "ten", "all_but_1"])
def test_a_deflated_batch_that_does_not_inflate_is_refused_whole(cut: int) -> None:
    (batch,) = encode_samples([sample(name="chat", sample_id="s-1")], 1)
    with pytest.raises(DecodeError) as refused:
        decode_batch(batch.payload[:cut])
    assert refused.value.kind == "decode"


def test_a_large_instant_is_cut_under_the_payload_limit() -> None:
    many = [sample(name="chat", pod=f"chat-{i}", sample_id=f"s-{i:06}") for i in range(4321)]
    batches = encode_samples(many, 1)
    assert [len(decode_batch(b.payload).lines) for b in batches] == [2000, 2000, 321]
    assert max(len(b.payload) for b in batches) <= usage_batch.MAX_BATCH_BYTES
    assert MAX_BATCH_SAMPLES == 2000


def test_samples_that_do_not_deflate_are_cut_under_the_byte_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(usage_batch, "MAX_BATCH_BYTES", 10_000)
    rng = random.Random(7)
    noise = [rng.randbytes(120).hex() for _ in range(200)]  # 240 characters, barely deflating
    many = [sample(name="chat", pod=noise[i], sample_id=f"s-{i:06}") for i in range(200)]
    batches = encode_samples(many, 1)
    assert len(batches) > 1
    assert all(len(b.payload) <= 10_000 for b in batches)
    lines = [line for b in batches for line in decode_batch(b.payload).lines]
    assert [decode_sample(line).sample_id for line in lines] == [f"s-{i:06}" for i in range(200)]
    again = encode_samples(list(reversed(many)), 1)
    assert [b.batch_id for b in again] == [b.batch_id for b in batches]


def test_a_stored_message_reads_as_the_samples_in_it() -> None:
    one = sample(name="chat", sample_id="s-1")
    two = sample(name="embed", sample_id="s-2")
    single = (subjects.usage_subject(one.workload), one.to_json())
    assert as_samples(*single) == [single]
    (batch,) = encode_samples([one, two], 1)
    assert as_samples(batch.subject, batch.payload) == [
        (subjects.usage_subject(one.workload), one.to_json()),
        (subjects.usage_subject(two.workload), two.to_json()),
    ]
