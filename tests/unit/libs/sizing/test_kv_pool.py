"""The KV pool in bytes of a preallocating LLM server (read, learned across two pool sizes, or
unknown), its minimum pool (one longest sequence), the KV rule in the decision's explanation,
and the engine's state that keeps the learning (sizing/kv_memory.py, sizing/state.py).

The shapes are a real model's: Llama-3.1-8B-Instruct (32 layers, 8 KV heads of 128, bf16) takes
2 x 32 x 8 x 128 x 2 B = 128 KiB of KV cache per token and serves up to 131072 tokens
(``max_position_embeddings``), so one longest sequence needs a 16 GiB pool. On an 80 GiB card
at vLLM's default 0.92, with about 20.35 GiB of weights, activations and graphs, vLLM reports
27264 blocks of 16 tokens; recreated at 0.5, 10060 blocks (a pool of 19.65 GiB).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import GIB, sample, v1_policy
from fracpilot_libs.contracts import AppSignals, Direction, UsageSample
from fracpilot_libs.sizing.engine import decide, need_of
from fracpilot_libs.sizing.explanations import kv_rule
from fracpilot_libs.sizing.kv_memory import (
    PoolLearning,
    PoolSource,
    kv_memory,
    kv_sizing,
    learn_bytes_per_token,
    min_pool_of,
    needed_memory_share,
    pool_of,
)
from fracpilot_libs.sizing.observation import observe
from fracpilot_libs.sizing.state import WorkloadState, dump_state, load_state, state_json

PROPERTY = settings(max_examples=200, deadline=None)
TOTAL = 80 * GIB
PER_TOKEN = 2 * 32 * 8 * 128 * 2  # bytes of KV cache per token: 128 KiB
MAX_MODEL_LEN = 131072
FIXED = int(20.35 * GIB)
TOKENS_092 = 27264 * 16  # vLLM's pool at --gpu-memory-utilization 0.92
TOKENS_05 = 10060 * 16  # and recreated at 0.5
USED_092 = FIXED + TOKENS_092 * PER_TOKEN
USED_05 = FIXED + TOKENS_05 * PER_TOKEN


def vllm(
    usage: float | None,
    tokens: int | None = TOKENS_092,
    *,
    pool_bytes: int | None = None,
    longest: int | None = MAX_MODEL_LEN,
) -> AppSignals:
    return AppSignals(
        kv_cache_usage=usage,
        llm_server="vllm",
        kv_pool_bytes=pool_bytes,
        kv_pool_tokens=tokens,
        kv_max_sequence_tokens=longest,
    )


def at(used: int, signals: AppSignals, minute: int = 0, allocated: float = 1.0) -> UsageSample:
    return sample(
        0.2,
        used / TOTAL,
        minute=minute,
        signals=signals,
        memory_used_bytes=used,
        allocated=allocated,
    )


# --- learning the bytes per token ----------------------------------------------------------------


def test_two_pool_sizes_teach_the_bytes_per_token() -> None:
    first, note = learn_bytes_per_token(PoolLearning(), TOKENS_092, USED_092)
    assert note == ""
    assert first.bytes_per_token is None  # one pool size: nothing to learn from yet
    second, note = learn_bytes_per_token(first, TOKENS_05, USED_05)
    assert note == ""
    assert second.bytes_per_token == pytest.approx(PER_TOKEN)
    assert (second.anchor_tokens, second.anchor_memory) == (TOKENS_05, USED_05)


def test_a_pool_read_in_bytes_gives_the_bytes_per_token_outright() -> None:
    learned, _ = learn_bytes_per_token(
        PoolLearning(), TOKENS_092, USED_092, pool_bytes_read=TOKENS_092 * PER_TOKEN
    )
    assert learned.bytes_per_token == pytest.approx(PER_TOKEN)


def test_the_same_pool_size_only_refreshes_the_anchor() -> None:
    first, _ = learn_bytes_per_token(PoolLearning(), TOKENS_092, USED_092)
    # a second replica, or the same pod a minute later, 2 MiB of allocator slack apart
    again, note = learn_bytes_per_token(first, TOKENS_092 - 16, USED_092 + 2 * 2**20)
    assert note == ""
    assert again.bytes_per_token is None


def test_conflicting_facts_learn_nothing_and_say_why() -> None:
    first, _ = learn_bytes_per_token(PoolLearning(bytes_per_token=PER_TOKEN), TOKENS_092, USED_092)
    # the pool shrank but the memory in use grew: another process, or another model
    second, note = learn_bytes_per_token(first, TOKENS_05, USED_092 + GIB)
    assert "conflicting facts" in note
    assert second.bytes_per_token is None  # dropped: the pool is unknown, the safe side
    assert second.anchor_tokens == TOKENS_05  # the new size is the next anchor
    # the next pool size teaches it again, from the new anchor (its fixed part 1 GiB larger
    # and then some: another process came with it)
    grown = USED_092 + GIB + (TOKENS_092 - TOKENS_05) * PER_TOKEN
    third, note = learn_bytes_per_token(second, TOKENS_092, grown)
    assert note == ""
    assert third.bytes_per_token == pytest.approx(PER_TOKEN)
    # a slope that would make the pool larger than the memory in use
    fourth, note = learn_bytes_per_token(PoolLearning(1000, GIB), 2000, 10 * GIB)
    assert "conflicting facts" in note
    assert fourth.bytes_per_token is None
    # a positive slope 20% off the one learned: the fixed part moved
    learned = PoolLearning(TOKENS_05, USED_05, PER_TOKEN)
    fifth, note = learn_bytes_per_token(learned, TOKENS_092, USED_092 - 6 * GIB)
    assert "with the 131072 B per token learned before" in note
    assert fifth.bytes_per_token is None
    # within 10%: agrees, the newer slope is kept
    sixth, note = learn_bytes_per_token(learned, TOKENS_092, USED_092 + 64 * 2**20)
    assert note == ""
    assert sixth.bytes_per_token == pytest.approx(PER_TOKEN, rel=0.01)


@pytest.mark.parametrize("tokens", [None, 0, -5])
def test_no_pool_size_in_tokens_learns_nothing(tokens: int | None) -> None:
    start = PoolLearning(TOKENS_092, USED_092, PER_TOKEN)
    learned, _ = learn_bytes_per_token(start, tokens, USED_05)
    assert learned == start


@PROPERTY
@given(
    fixed=st.integers(GIB, 60 * GIB),
    per_token=st.integers(1024, 1024 * 1024),
    t1=st.integers(1000, 2_000_000),
    t2=st.integers(1000, 2_000_000),
)
def test_any_two_distant_pool_sizes_of_one_model_give_its_bytes_per_token(
    fixed: int, per_token: int, t1: int, t2: int
) -> None:
    first, _ = learn_bytes_per_token(PoolLearning(), t1, fixed + t1 * per_token)
    second, note = learn_bytes_per_token(first, t2, fixed + t2 * per_token)
    assert note == ""
    if abs(t1 - t2) >= 0.05 * max(t1, t2):
        assert second.bytes_per_token == pytest.approx(per_token)
    else:
        assert second.bytes_per_token is None


# --- the pool and the need ---------------------------------------------------------------------


def test_the_pool_is_read_learned_or_unknown_with_a_reason() -> None:
    assert pool_of(vllm(0.1, pool_bytes=40 * GIB), None)[:2] == (40 * GIB, PoolSource.READ)
    pool, source, _ = pool_of(vllm(0.1), PER_TOKEN)
    assert (pool, source) == (TOKENS_092 * PER_TOKEN, PoolSource.LEARNED)
    pool, source, why = pool_of(vllm(0.1), None)
    assert (pool, source) == (None, PoolSource.UNKNOWN)
    assert "not learned yet" in why
    pool, source, why = pool_of(vllm(0.1, tokens=None), PER_TOKEN)
    assert (pool, source) == (None, PoolSource.UNKNOWN)
    assert "no KV pool size" in why


def test_the_minimum_pool_holds_one_longest_sequence() -> None:
    pool = TOKENS_092 * PER_TOKEN
    assert min_pool_of(vllm(0.0), pool) == MAX_MODEL_LEN * PER_TOKEN  # 16 GiB
    assert min_pool_of(vllm(0.0, longest=None), pool) is None
    assert min_pool_of(vllm(0.0, tokens=None), pool) is None


def test_at_zero_kv_usage_the_need_is_the_fixed_part_plus_the_minimum_pool() -> None:
    pool = TOKENS_092 * PER_TOKEN
    need = kv_memory(USED_092, pool, 0.0, min_pool_bytes=16 * GIB, pool_source=PoolSource.LEARNED)
    assert need.kv_aware
    assert need.need_bytes == FIXED + 16 * GIB
    assert "16.00 GiB for one longest sequence" in need.reason
    assert "(learned)" in need.reason
    busy = kv_memory(USED_092, pool, 0.5, min_pool_bytes=16 * GIB)
    assert busy.need_bytes == FIXED + round(pool * 0.5)  # above the minimum: the usage sizes
    unknown = kv_memory(USED_092, pool, 0.0)
    assert unknown.need_bytes == FIXED
    assert "minimum pool unknown" in unknown.reason


def test_a_minimum_pool_above_the_pool_is_a_conflict_and_keeps_the_memory_in_use() -> None:
    need = kv_memory(USED_05, TOKENS_05 * PER_TOKEN, 0.1, min_pool_bytes=24 * GIB)
    assert not need.kv_aware
    assert need.need_bytes == USED_05
    assert "conflicting facts" in need.reason


@PROPERTY
@given(
    used=st.integers(GIB, TOTAL),
    pool_share=st.floats(0.0, 1.0),
    min_share=st.floats(0.0, 1.0),
    usage=st.floats(0.0, 1.0),
)
def test_the_need_never_goes_below_fixed_plus_the_minimum_pool(
    used: int, pool_share: float, min_share: float, usage: float
) -> None:
    pool = int(used * pool_share)
    low = int(pool * min_share)
    need = kv_memory(used, pool, usage, min_pool_bytes=low)
    assert need.kv_aware
    assert need.need_bytes >= used - pool + low
    assert need.need_bytes <= used


def test_kv_sizing_learns_across_a_recreate_and_then_sizes_from_the_kv_used() -> None:
    first = kv_sizing(at(USED_092, vllm(0.05)), PoolLearning())
    assert first is not None
    need, learning = first
    assert not need.kv_aware
    assert "not learned yet" in need.reason
    assert need.need_bytes == USED_092
    second = kv_sizing(at(USED_05, vllm(0.3, TOKENS_05)), learning)
    assert second is not None
    need, learning = second
    assert need.kv_aware
    assert need.pool_source is PoolSource.LEARNED
    assert need.fixed_bytes == pytest.approx(FIXED, abs=1024)
    assert need.pool_bytes == TOKENS_05 * PER_TOKEN
    assert need.need_bytes == pytest.approx(FIXED + 16 * GIB, abs=1024)  # 30% < the minimum


def test_a_pod_without_a_server_is_not_sized_by_the_kv_rule() -> None:
    plain = sample(0.2, 0.3, signals=AppSignals(kv_cache_usage=0.3))
    assert kv_sizing(plain, PoolLearning()) is None
    assert needed_memory_share(plain) == plain.memory_share


# --- the engine, its state and its explanation -------------------------------------------------


def test_the_engine_keeps_the_learning_in_the_workload_state_and_explains_the_kv_rule() -> None:
    policy = v1_policy(downsize_hold_s=600, cooldown_s=600, min_history_s=300)
    state = WorkloadState()
    # an hour at 0.92, idle: the pool is unknown (one size), memory in use sizes it
    for minute in range(0, 60, 5):
        state, _ = decide(state, at(USED_092, vllm(0.02), minute), policy)
    assert state.kv_bytes_per_token is None
    assert state.kv_sized is None
    assert "not learned yet" in state.kv_note
    # recreated at 0.5 (the webhook rewrote its flag): the second pool size teaches the bytes;
    # once the 0.92 peaks leave the memory window, the fraction follows the KV rule down
    decisions = []
    for minute in range(60, 3 * 24 * 60, 5):
        state, d = decide(state, at(USED_05, vllm(0.05, TOKENS_05), minute), policy)
        if d is not None:
            decisions.append(d)
    assert state.kv_bytes_per_token == pytest.approx(PER_TOKEN)
    assert state.kv_sized is not None
    fixed, pool, low = state.kv_sized
    assert (fixed, pool, low) == pytest.approx(
        (FIXED, TOKENS_05 * PER_TOKEN, MAX_MODEL_LEN * PER_TOKEN), abs=1024
    )
    need = need_of(state, policy)
    assert need.memory_peak == pytest.approx((FIXED + 16 * GIB) / TOTAL, rel=1e-6)
    down = [d for d in decisions if d.direction is Direction.DOWN]
    assert down, "the KV rule gives memory back"
    words = down[-1].explanation
    assert "memory by the KV cache (pool learned): fixed part 20.35 GiB" in words
    assert "the minimum pool 16.00 GiB (one longest sequence) of the 19.65 GiB pool" in words
    assert state.kv_pool_source is PoolSource.LEARNED
    # and the checkpoint keeps it all
    assert load_state(dump_state(state)) == state


def test_the_explanation_names_the_peak_kv_usage_when_it_sizes() -> None:
    policy = v1_policy(downsize_hold_s=600, cooldown_s=600, min_history_s=300)
    state = WorkloadState()
    pool = TOKENS_092 * PER_TOKEN
    signals = vllm(0.6, pool_bytes=pool)
    decision = None
    for minute in range(0, 24 * 60, 5):
        state, d = decide(state, at(USED_092, signals, minute), policy)
        decision = d or decision
    assert decision is not None
    assert "memory by the KV cache (pool read): fixed part 20.35 GiB + peak KV usage 60% of " in (
        decision.explanation
    )
    assert "minimum pool 16.00 GiB" in decision.explanation
    assert state.kv_pool_source is PoolSource.READ
    assert load_state(dump_state(state)).kv_pool_source is PoolSource.READ


@pytest.mark.parametrize(
    ("source", "said"),
    [(PoolSource.READ, "read"), (PoolSource.LEARNED, "learned"), (PoolSource.UNKNOWN, "known")],
)
def test_the_explanation_says_how_the_pool_was_known_from_its_source_not_the_note(
    source: PoolSource, said: str
) -> None:
    # the note's words say "(read)": the typed source alone decides (unknown: a state written
    # before the source was kept)
    need = kv_memory(USED_092, TOKENS_092 * PER_TOKEN, 0.6, pool_source=PoolSource.READ)
    assert need.fixed_bytes is not None
    assert need.pool_bytes is not None
    sized = (float(need.fixed_bytes), float(need.pool_bytes), -1.0)
    words = kv_rule(sized, need.reason, TOTAL, USED_092 / TOTAL, source)
    assert words.startswith(f"memory by the KV cache (pool {said}): fixed part 20.35 GiB + ")


def test_an_unknown_pool_is_said_in_the_explanation() -> None:
    policy = v1_policy(downsize_hold_s=600, cooldown_s=600, min_history_s=300)
    state = WorkloadState()
    decision = None
    for minute in range(0, 24 * 60, 5):
        state, d = decide(state, at(int(0.3 * TOTAL), vllm(0.1), minute), policy)
        decision = d or decision
    assert decision is not None
    assert "memory of an LLM server by its memory in use (the KV pool holds" in (
        decision.explanation
    )


def test_a_workload_without_a_server_has_no_kv_words() -> None:
    policy = v1_policy(downsize_hold_s=600, cooldown_s=600, min_history_s=300)
    state = WorkloadState()
    decision = None
    for minute in range(0, 24 * 60, 5):
        state, d = decide(state, sample(0.1, 0.1, minute=minute, allocated=1.0), policy)
        decision = d or decision
    assert decision is not None
    assert "KV" not in decision.explanation
    assert "LLM" not in decision.explanation


def test_a_checkpoint_written_before_the_kv_fields_loads() -> None:
    plain = sample(0.1, 0.2)
    state = observe(WorkloadState(), plain, v1_policy(), plain.timestamp.timestamp())
    body = json.loads(state_json(state))
    assert not any(k.startswith("kv_") and k != "kv_cache_usage" for k in body)  # none written
    old = load_state(json.dumps(body).encode())
    kept = (old.kv_anchor, old.kv_bytes_per_token, old.kv_sized, old.kv_note, old.kv_pool_source)
    assert kept == (None, None, None, "", PoolSource.UNKNOWN)


@pytest.mark.parametrize(
    "field",
    [
        {"kv_bytes_per_token": -1.0},
        {"kv_bytes_per_token": 0.0},
        {"kv_anchor": [0, 1.0]},
        {"kv_anchor": [1.0]},
        {"kv_sized": [1.0, 2.0, -2.0]},
        {"kv_note": "x" * 301},
        {"kv_pool_source": "guessed"},
        {"kv_pool_source": 1},
        {"kv_surprise": 1},
    ],
    ids=str,
)
def test_a_checkpoint_with_bad_kv_fields_is_not_a_checkpoint(field: dict[str, object]) -> None:
    body = json.loads(state_json(WorkloadState()))
    body.update(field)
    with pytest.raises(ValueError):  # noqa: PT011 - the contract is "a ValueError"
        load_state(json.dumps(body).encode())


def test_old_samples_without_the_token_fields_still_size_from_a_pool_read_in_bytes() -> None:
    signals = AppSignals(kv_cache_usage=0.25, llm_server="vllm", kv_pool_bytes=56 * GIB)
    s = sample(0.2, 72 / 80, signals=signals)
    assert needed_memory_share(s) == pytest.approx(30 / 80)


def test_conflicting_facts_after_learning_fall_back_to_memory_in_use_and_say_why() -> None:
    policy = v1_policy(downsize_hold_s=600, cooldown_s=600, min_history_s=300)
    state = WorkloadState()
    for minute in range(0, 60, 5):  # learn at 0.92, then at 0.5
        state, _ = decide(state, at(USED_092, vllm(0.02), minute), policy)
    state, _ = decide(state, at(USED_05, vllm(0.05, TOKENS_05), 60), policy)
    assert state.kv_bytes_per_token == pytest.approx(PER_TOKEN)
    # back at the 0.92 pool, but using 6 GiB less than before: not the same fixed part
    for minute in range(65, 3 * 24 * 60, 5):
        state, _ = decide(state, at(USED_092 - 6 * GIB, vllm(0.6), minute), policy)
        if minute == 65:
            assert "conflicting facts" in state.kv_note
    assert state.kv_bytes_per_token is None  # dropped: memory in use sizes it
    assert state.kv_sized is None
    need = need_of(state, policy)
    assert need.memory_peak == pytest.approx((USED_092 - 6 * GIB) / TOTAL)
    words = kv_rule(state.kv_sized, state.kv_note, TOTAL, need.memory_peak)
    assert words.startswith("memory of an LLM server by its memory in use (the KV pool holds")
