"""The KV-aware memory need of a preallocating LLM server (sizing/kv_memory.py) and the engine
that sizes from it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from factories import GIB, sample, v1_policy
from fracpilot_libs.contracts import AppSignals, Direction
from fracpilot_libs.sizing.engine import decide, need_of
from fracpilot_libs.sizing.kv_memory import kv_memory, needed_memory_share
from fracpilot_libs.sizing.observation import observe
from fracpilot_libs.sizing.state import WorkloadState

PROPERTY = settings(max_examples=200, deadline=None)
TOTAL = 80 * GIB
# A vLLM at its default flag on an 80 GiB card: 72 GiB in use, 16 GiB of weights and overhead,
# a 56 GiB KV pool.
USED, POOL = 72 * GIB, 56 * GIB


def vllm(usage: float | None, pool: int | None = POOL) -> AppSignals:
    return AppSignals(kv_cache_usage=usage, llm_server="vllm", kv_pool_bytes=pool)


def test_need_is_the_fixed_part_plus_the_used_kv() -> None:
    need = kv_memory(USED, POOL, 0.25)
    assert need.kv_aware
    assert need.fixed_bytes == 16 * GIB
    assert need.used_kv_bytes == 14 * GIB
    assert need.need_bytes == 30 * GIB
    assert "fixed part" in need.reason


def test_missing_or_inconsistent_kv_numbers_keep_the_memory_in_use_with_a_reason() -> None:
    cases = {
        (None, 0.3): "pool size is unknown",
        (POOL, None): "no KV-cache usage",
        (POOL, 1.5): "not in 0..1",
        (USED + 1, 0.3): "larger than the memory in use",
    }
    for (pool, usage), reason in cases.items():
        need = kv_memory(USED, pool, usage)
        assert not need.kv_aware
        assert need.need_bytes == USED
        assert reason in need.reason


@PROPERTY
@given(
    used=st.integers(min_value=0, max_value=TOTAL),
    pool_share=st.floats(min_value=0.0, max_value=1.0),
    usage=st.floats(min_value=0.0, max_value=1.0),
)
def test_need_never_below_fixed_plus_used_kv_nor_above_the_memory_in_use(
    used: int, pool_share: float, usage: float
) -> None:
    pool = int(used * pool_share)
    need = kv_memory(used, pool, usage)
    assert need.kv_aware
    assert need.need_bytes >= (used - pool) + pool * usage - 1  # rounding of the used KV
    assert need.need_bytes <= used


@PROPERTY
@given(
    low=st.floats(min_value=0.0, max_value=1.0),
    high=st.floats(min_value=0.0, max_value=1.0),
    pool_share=st.floats(min_value=0.01, max_value=1.0),
)
def test_need_follows_kv_usage(low: float, high: float, pool_share: float) -> None:
    low, high = min(low, high), max(low, high)
    pool = int(USED * pool_share)
    assert kv_memory(USED, pool, low).need_bytes <= kv_memory(USED, pool, high).need_bytes


@PROPERTY
@given(
    share=st.floats(min_value=0.0, max_value=1.0),
    signals=st.sampled_from(
        [None, AppSignals(kv_cache_usage=0.2), AppSignals(waiting_requests=3), vllm(0.2, None)]
    ),
)
def test_no_change_without_kv_data(share: float, signals: AppSignals | None) -> None:
    s = sample(memory_share=share, signals=signals)
    assert needed_memory_share(s) == s.memory_share


def test_the_engine_keeps_the_peak_of_fixed_plus_used_kv() -> None:
    policy = v1_policy()
    state = WorkloadState()
    for minute, usage in enumerate((0.1, 0.5, 0.2)):
        s = sample(memory_share=0.9, minute=minute, signals=vllm(usage))
        state = observe(state, s, policy, s.timestamp.timestamp())
    need = need_of(state, policy)
    assert need.memory_peak == (16 + 0.5 * 56) / 80  # the peak usage of the window, not 0.9


def test_a_preallocating_server_with_idle_kv_is_downsized_and_without_its_pool_is_not() -> None:
    policy = v1_policy()

    def last_decision(signals: AppSignals) -> float | None:
        state, fraction = WorkloadState(), None
        current = 1.0
        for minute in range(0, 6 * 60, 5):
            s = sample(0.1, 0.9, minute=minute, allocated=current, signals=signals)
            state, d = decide(state, s, policy)
            if d is not None:
                assert d.direction is Direction.DOWN
                current = fraction = d.new_fraction
        return fraction

    kv_aware = last_decision(vllm(0.1))
    assert kv_aware is not None
    # 16 GiB fixed + 5.6 GiB used KV = 0.27 of the card, plus headroom, on the 1/8 grid.
    assert kv_aware == 0.375
    assert last_decision(vllm(0.1, pool=None)) is None  # today's rule: 0.9 in use, kept
