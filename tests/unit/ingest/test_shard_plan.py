"""Ingest shards, the pure part: a GPU's shard is stable and spread, a shard's batches are the
same whoever encodes it (so a second copy is dropped by the stream's duplicate window), and a
model of replicas taking cycles, dying mid-cycle and trading shards publishes every (GPU,
instant) at least once, never as two different batches."""

from __future__ import annotations

import random
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.factories import sample

from fracpilot_ingest.settings import IngestSettings
from fracpilot_ingest.shard_plan import (
    SHARD_COUNTS,
    CyclePlan,
    advanced,
    by_shard,
    cursor_key,
    encode_by_shard,
    gpu_label_groups,
    gpu_shard,
    parse_cursor,
    plan_cycle,
    shard_of,
    shard_regex,
)
from fracpilot_libs.nats.usage_batch import encode_samples
from fracpilot_libs.usage.attribution import Observation, PodKey
from fracpilot_libs.usage.mappings import MappingTable

GPUS = [f"GPU-{i:04d}-{i * 7919 % 65536:04x}" for i in range(64)]
STEP = 15.0


def test_a_gpus_shard_is_its_uuids_last_hex_digits_modulo_the_count() -> None:
    # Pinned: every replica and every release must put a GPU in the same shard.
    uuid = "GPU-0f5e1c2a-8c4b-4d1e-9a3f-1b2c3d4e5f6b"
    assert [shard_of(uuid, n) for n in (2, 4, 8, 16, 32, 64, 128, 256)] == [
        1, 3, 11 % 8, 11, 0x6B % 32, 0x6B % 64, 0x6B % 128, 0x6B
    ]  # fmt: skip
    assert shard_of(uuid.upper(), 256) == 0x6B  # either case
    assert shard_of("GPU-x9", 256) == 9  # a character not a hex digit counts as 0
    assert shard_of("9", 256) == 9  # and a missing one
    assert gpu_shard(f"{uuid}/GI2", 16) == 11  # a MIG instance: its card's


def test_nvidia_uuids_spread_over_the_shards() -> None:
    rng = random.Random(7)  # NVIDIA's UUIDs: 128 bits printed in hex
    gpus = [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(16_000)]
    for shards in (8, 64):
        counts = Counter(shard_of(g, shards) for g in gpus)
        assert set(counts) == set(range(shards))
        per_shard = len(gpus) / shards  # 250 at 64: 4 standard deviations is +-25%
        assert per_shard * 0.75 < min(counts.values()) <= max(counts.values()) < per_shard * 1.25


@given(
    gpu=st.text(alphabet="0123456789abcdefABCDEF-GPUx/\né", max_size=12).filter(bool),
    shards=st.sampled_from(SHARD_COUNTS),
    held=st.sets(st.integers(0, 255), min_size=1),
)
def test_a_shards_regex_matches_exactly_the_uuids_of_its_shards(
    gpu: str, shards: int, held: set[int]
) -> None:
    """What Prometheus selects by the label matcher is what :func:`shard_of` assigns: no GPU
    read by two replicas, none by no replica (tests/integration/test_ingest_shards.py asks a
    real Prometheus)."""
    held = {k % shards for k in held}
    if len(held) == shards:
        with pytest.raises(ValueError, match="a regex for"):
            shard_regex(held, shards)
        return
    regex = shard_regex(held, shards)
    assert (re.fullmatch(regex, gpu) is not None) == (shard_of(gpu, shards) in held)
    # One alternative per set of second-last digits: at 32 shards those are even, odd or any.
    assert regex.count("|") < (3 if shards == 32 else 16)


def test_a_shard_regex_has_an_alternative_per_second_last_digit_set() -> None:
    # Not an alternative per last digit (which cost Prometheus up to twice the selection): the
    # last digits that share a set of second-last digits are one class.
    assert shard_regex(set(range(0, 32, 3)), 32).count("|") == 1  # 11 shards, 2 alternatives
    # Last digit 0 under any second-last digit, 1 under an even one, 2 under an odd one.
    assert shard_regex({0, 16, 1, 18}, 32) == (
        "(?s:.*[^123456789AaBbCcDdEeFf]|(.*[^13579BbDdFf])?[1]|.*[13579BbDdFf][2])"
    )
    assert shard_regex(set(range(16)), 32) == "(?s:(.*[^13579BbDdFf])?.)"


def test_a_shard_regex_is_asked_only_of_a_power_of_two_and_a_share() -> None:
    assert shard_regex({1, 3}, 4) == "(?s:.*[13579BbDdFf])"  # odd last digits
    assert shard_regex({0}, 2) == "(?s:.*[^13579BbDdFf])"  # 0: any other character too
    for held, shards in (({0}, 6), (set(), 8), (set(range(8)), 8)):
        with pytest.raises(ValueError, match="a regex for"):
            shard_regex(held, shards)


def test_cursor_keys_name_the_shard_count_and_the_cursor_moves_only_forward() -> None:
    assert cursor_key(3, 16) == "prometheus.cursor.16.3"
    assert parse_cursor(b"1700000000.000") == 1_700_000_000.0
    assert parse_cursor(b"junk") is None
    assert advanced(None, 10.0)
    assert advanced(5.0, 10.0)
    assert not advanced(10.0, 10.0)
    assert not advanced(15.0, 10.0)


def test_a_cycle_starts_at_its_earliest_cursor_and_keeps_each_shard_past_its_own() -> None:
    plan = plan_cycle(4, [0, 2], {0: 300.0}, fallback=100.0)
    assert plan.cursors == {0: 300.0, 2: 100.0}
    assert plan.start == 100.0
    gpu0 = next(g for g in GPUS if shard_of(g, 4) == 0)
    gpu1 = next(g for g in GPUS if shard_of(g, 4) == 1)
    gpu2 = next(g for g in GPUS if shard_of(g, 4) == 2)
    assert not plan.keeps(gpu0, 300.0)
    assert plan.keeps(gpu0, 315.0)
    assert plan.keeps(gpu2, 115.0)
    assert not plan.keeps(gpu1, 1e12)  # not held
    asked = [(g, t) for g in (gpu0, gpu1, gpu2, f"{gpu2}/GI3") for t in (115.0, 300.0, 315.0)]
    observations = [_observation(g, t) for g, t in asked]
    assert [(o.gpu_uuid, o.timestamp) for o in plan.kept(observations)] == [
        (g, t) for g, t in asked if plan.keeps(g, t)
    ]
    assert plan_cycle(4, [], {}, 0.0).start is None


def _observation(gpu: str, instant: float) -> Observation:
    return Observation(PodKey("ns", "p"), gpu, "n", instant, 0.5, 1, 2, exact=True)


def _samples(gpus: list[str], instant: float) -> list:  # type: ignore[type-arg]
    at = datetime.fromtimestamp(instant, UTC)
    workload = {g: f"w{GPUS.index(g) % 5}" for g in gpus}  # a GPU's pod's, every cycle
    return [
        sample(at=at, name=workload[g], gpu_uuid=g, sample_id=f"t|{workload[g]}|{g}|{instant:.0f}")
        for g in gpus
    ]


@given(
    gpus=st.lists(st.sampled_from(GPUS), min_size=1, max_size=40, unique=True),
    shards=st.integers(2, 9),
    partitions=st.integers(1, 4),
    max_samples=st.integers(1, 7),
)
def test_a_shards_batches_are_the_same_whoever_encodes_it(
    gpus: list[str], shards: int, partitions: int, max_samples: int
) -> None:
    """One replica encodes the instant for all its shards, another only shard k (it took k
    over): shard k's batches have the same ids and payloads in both."""
    samples = _samples(gpus, 1_700_000_000.0)
    groups = by_shard(samples, shards)
    assert sorted(s.sample_id for g in groups for s in g) == sorted(s.sample_id for s in samples)
    everything = {
        b.batch_id: b.payload
        for group in groups
        for b in encode_samples(group, partitions, max_samples)
    }
    for group in groups:
        assert len({shard_of(s.gpu_uuid, shards) for s in group}) == 1
        alone = encode_samples(group, partitions, max_samples)
        for batch in alone:
            assert everything[batch.batch_id] == batch.payload


@given(
    gpus=st.lists(st.sampled_from(GPUS), min_size=1, max_size=40, unique=True),
    mig=st.sets(st.integers(0, 39)),
    shards=st.integers(1, 9),
    partitions=st.integers(1, 4),
    max_samples=st.integers(1, 7),
    order=st.randoms(use_true_random=False),
)
def test_encoding_all_shards_in_one_pass_gives_each_shards_own_batches(
    gpus: list[str],
    mig: set[int],
    shards: int,
    partitions: int,
    max_samples: int,
    order: random.Random,
) -> None:
    """What the service publishes (:func:`encode_by_shard`, the samples serialized in one
    pass in any order) is, batch for batch, what each shard's samples encoded alone give:
    the same subjects, ids, payloads and samples, in shard order; a MIG instance's sample
    goes with its card's shard."""
    devices = [f"{g}/GI{i}" if i in mig else g for i, g in enumerate(gpus)]
    samples = _samples(gpus, 1_700_000_000.0)
    samples = [s.model_copy(update={"gpu_uuid": d}) for s, d in zip(samples, devices, strict=True)]
    order.shuffle(samples)
    expected = [
        (b.subject, b.batch_id, b.payload, b.sample_ids)
        for group in by_shard(samples, shards)
        for b in encode_samples(group, partitions, max_samples)
    ]
    got = encode_by_shard(samples, shards, partitions, max_samples)
    assert [(b.subject, b.batch_id, b.payload, b.sample_ids) for b in got] == expected


# --- a model of replicas, cycles, deaths and moves --------------------------------------------


@dataclass
class Model:
    shards: int
    cursors: dict[int, float] = field(default_factory=dict)  # the KV keys
    stored: dict[str, tuple[str, ...]] = field(default_factory=dict)  # batch id -> sample ids

    def cycle(self, owned: list[int], end: float, *, dies: bool, fallback: float) -> None:
        """A replica's cycle: read the cursors, publish every instant up to ``end`` it keeps
        (batches acknowledged: stored, or dropped as duplicates), then move the cursors; one
        that dies has published some batches and moved no cursor."""
        plan: CyclePlan = plan_cycle(self.shards, owned, self.cursors, fallback)
        if plan.start is None:
            return
        instant = plan.start + STEP
        published = 0
        while instant <= end:
            kept = [g for g in GPUS if plan.keeps(g, instant)]
            for group in by_shard(_samples(kept, instant), self.shards):
                for batch in encode_samples(group, 2, 5):
                    if dies and published >= 3:
                        return
                    self.stored.setdefault(batch.batch_id, batch.sample_ids)
                    published += 1
            instant += STEP
        for k in plan.cursors:
            if advanced(self.cursors.get(k), end):
                self.cursors[k] = end


@settings(max_examples=60, deadline=None)
@given(
    shards=st.integers(2, 6),
    rounds=st.lists(
        st.tuples(
            st.lists(st.integers(0, 2), min_size=6, max_size=6),  # an owner per shard (or none)
            st.integers(0, 2),  # which replica runs a cycle
            st.integers(0, 3),  # instants it moves on by
            st.booleans(),  # it dies mid-cycle
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_replicas_dying_and_trading_shards_skip_no_sample_and_count_none_twice(
    shards: int, rounds: list[tuple[list[int], int, int, bool]]
) -> None:
    model = Model(shards)
    t0 = 1_700_000_000.0
    end = t0
    for owners, replica, steps, dies in rounds:
        end += steps * STEP
        owned = [k for k in range(shards) if owners[k] == replica]
        model.cycle(owned, end, dies=dies, fallback=t0)
    # Whoever owns what, a cycle of each shard's final owner that lives catches up.
    model.cycle(list(range(shards)), end, dies=False, fallback=t0)
    counted = Counter(sid for ids in model.stored.values() for sid in ids)
    instants = int((end - t0) / STEP)
    assert len(counted) == len(GPUS) * instants  # none skipped
    assert set(counted.values()) <= {1}  # none twice: every copy had the first one's id


def test_the_shard_settings_come_from_fracpilot_ingest_and_need_prometheus_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FRACPILOT_SOURCES", "prometheus")
    monkeypatch.setenv("FRACPILOT_INGEST_SHARDS", "16")
    monkeypatch.setenv("FRACPILOT_INGEST_SHARD_LEASE_S", "6")
    monkeypatch.setenv("FRACPILOT_INGEST_REPLICA_ID", "ingest-a")
    shard = IngestSettings().ingest
    assert (shard.shards, shard.shard_lease_s, shard.replica_id) == (16, 6.0, "ingest-a")
    assert shard.sharded
    monkeypatch.setenv("FRACPILOT_INGEST_SHARDS", "1")
    assert not IngestSettings().ingest.sharded  # today's single ingest
    monkeypatch.setenv("FRACPILOT_INGEST_SHARDS", "4")
    monkeypatch.setenv("FRACPILOT_SOURCES", "prometheus,simulator")
    with pytest.raises(ValidationError, match="needs FRACPILOT_SOURCES=prometheus"):
        IngestSettings()
    monkeypatch.setenv("FRACPILOT_SOURCES", "prometheus")
    for count in ("12", "512"):  # a shard must be a set of the UUID's last hex digits
        monkeypatch.setenv("FRACPILOT_INGEST_SHARDS", count)
        with pytest.raises(ValidationError, match="shards"):
            IngestSettings()


def test_a_mig_instance_is_on_its_cards_shard() -> None:
    card = GPUS[5]
    assert gpu_shard(f"{card}/GI2", 16) == gpu_shard(card, 16) == shard_of(card, 16)


def test_a_shards_query_asks_each_rows_metrics_by_that_rows_gpu_labels() -> None:
    """Rows trying the GPU labels in other orders are asked apart: a series naming two GPUs is
    fetched for the shard its own row keeps it for."""
    default = MappingTable.of()
    assert gpu_label_groups(default) == (
        (("UUID", "device_uuid", "deviceuuid"), default.metric_names),
    )
    row = default.rows[0]
    reordered = row.model_copy(
        update={
            "metric": "custom_gpu_util",
            "roles": row.roles.model_copy(update={"gpu_uuid": ("deviceuuid", "UUID")}),
        }
    )
    table = MappingTable(rows=(*default.rows, reordered))
    assert gpu_label_groups(table) == (
        (("UUID", "device_uuid", "deviceuuid"), default.metric_names),
        (("deviceuuid", "UUID"), ("custom_gpu_util",)),
    )
