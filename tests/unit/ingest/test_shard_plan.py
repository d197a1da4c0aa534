"""Ingest shards, the pure part: a GPU's shard is stable and spread, a shard's batches are the
same whoever encodes it (so a second copy is dropped by the stream's duplicate window), and a
model of replicas taking cycles, dying mid-cycle and trading shards publishes every (GPU,
instant) at least once, never as two different batches."""

from __future__ import annotations

import random
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
    CyclePlan,
    advanced,
    by_shard,
    cursor_key,
    encode_by_shard,
    gpu_shard,
    gpu_uuid_labels,
    parse_cursor,
    plan_cycle,
    shard_of,
)
from fracpilot_libs.nats.usage_batch import encode_samples
from fracpilot_libs.usage.attribution import Observation, PodKey
from fracpilot_libs.usage.mappings import MappingTable

GPUS = [f"GPU-{i:04d}-{i * 7919 % 10007:05d}" for i in range(64)]
STEP = 15.0


def test_a_gpus_shard_is_a_stable_hash_not_pythons_salted_one() -> None:
    # Pinned: every replica and every release must put a GPU in the same shard.
    assert [shard_of(g, 16) for g in GPUS[:6]] == [shard_of(g, 16) for g in GPUS[:6]]
    assert shard_of("GPU-0f5e1c2a-8c4b-4d1e-9a3f-1b2c3d4e5f60", 16) == 5
    assert shard_of("GPU-0f5e1c2a-8c4b-4d1e-9a3f-1b2c3d4e5f60", 7) == 2


def test_gpus_spread_over_the_shards() -> None:
    counts = Counter(shard_of(f"GPU-{i}", 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 850
    assert max(counts.values()) < 1150


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


def test_a_mig_instance_is_on_its_cards_shard() -> None:
    card = GPUS[5]
    assert gpu_shard(f"{card}/GI2", 16) == gpu_shard(card, 16) == shard_of(card, 16)


@given(
    owned=st.sets(st.integers(0, 7)),
    gpus=st.lists(st.sampled_from(GPUS), min_size=1, max_size=20),
)
def test_the_series_a_replica_parses_give_every_sample_its_cycle_keeps(
    owned: set[int], gpus: list[str]
) -> None:
    """Cutting the response before parsing loses nothing :meth:`CyclePlan.keeps` would keep:
    a GPU's series stay when its shard is the cycle's, a series naming no GPU always."""
    plan = plan_cycle(8, owned, {}, fallback=0.0)
    labels = gpu_uuid_labels(MappingTable.of())
    assert "UUID" in labels
    series = [{"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "UUID": g}} for g in gpus]
    app = {"metric": {"__name__": "vllm:num_requests_waiting", "pod": "chat-0"}}
    # Named by a later label of the table when the first is missing or not a string.
    later = [{"metric": {"UUID": 7, labels[-1]: g}} for g in gpus]
    malformed = ["junk", None, {"values": []}, {"metric": ["UUID"]}, {"metric": "UUID"}]
    kept = plan.of_shards([*series, *later, app, *malformed], labels)
    assert app in kept
    for bad in malformed:  # left to the parser, which counts it
        assert bad in kept
    for s in series:
        assert (s in kept) == plan.keeps(s["metric"]["UUID"], 1.0)
    for s in later:
        assert (s in kept) == plan.keeps(s["metric"][labels[-1]], 1.0)
