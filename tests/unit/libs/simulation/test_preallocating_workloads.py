"""The demo's simulated vLLM server that preallocates (issue 28): memory flat at its fraction's
share, KV usage following the day, and vLLM's KV signals so the engine sizes it from its KV
cache, not from the preallocation (which would only ever grow it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fracpilot_libs.contracts import Policy, ReasonCode, UsageSample
from fracpilot_libs.llm_servers import LlmServer
from fracpilot_libs.simulation.workloads import (
    GIB,
    demo_workloads,
    kv_pool_share,
    preallocated_share,
    signals_at,
    traffic,
    usage_at,
)
from fracpilot_libs.sizing.engine import decide
from fracpilot_libs.sizing.kv_memory import needed_memory_share
from fracpilot_libs.sizing.state import WorkloadState

DAY = datetime(2026, 3, 2, tzinfo=UTC)
[VLLM] = [w for w in demo_workloads() if w.preallocates is not None]
HOURS = [DAY + timedelta(hours=h, minutes=7) for h in range(24)]


def sample(at: datetime, held: float, signals: bool = True) -> UsageSample:
    compute, memory = usage_at(VLLM, at, held)
    return UsageSample(
        sample_id=at.isoformat(),
        workload=VLLM.workload,
        pod=VLLM.pod,
        timestamp=at,
        compute=compute,
        memory_used_bytes=memory,
        memory_total_bytes=VLLM.device_memory_bytes,
        allocated_fraction=held,
        source="simulator",
        signals=signals_at(VLLM, at, held) if signals else None,
    )


def test_the_demos_chat_model_runs_vllm_and_the_others_do_not_preallocate() -> None:
    assert VLLM.workload.owner_name == "chat-llama-8b"
    assert VLLM.preallocates is LlmServer.VLLM
    others = [w for w in demo_workloads() if w != VLLM]
    assert all(preallocated_share(w, 0.5) is None for w in others)
    assert all(kv_pool_share(w, 0.5) is None for w in others)


def test_memory_is_flat_at_the_flag_its_fraction_gets_whatever_the_traffic() -> None:
    for held, share in ((0.5, 0.475), (0.25, 0.237), (None, 0.92)):
        memory = {usage_at(VLLM, at, held)[1] for at in HOURS}
        assert memory == {int(share * 80 * GIB)}, held  # the rewritten flag; vLLM's default
    # compute still follows the day
    assert len({usage_at(VLLM, at, 0.5)[0] for at in HOURS}) > 20


def test_kv_usage_follows_the_day_and_the_signals_say_the_pool_as_vllm_does() -> None:
    quiet = min(HOURS, key=lambda t: traffic(VLLM, t))
    busy = max(HOURS, key=lambda t: traffic(VLLM, t))
    low, high = signals_at(VLLM, quiet, 0.5), signals_at(VLLM, busy, 0.5)
    assert low is not None
    assert high is not None
    assert (low.llm_server, high.llm_server) == ("vllm", "vllm")
    pool = int((0.475 - VLLM.weights_share) * 80 * GIB)  # the preallocation less the weights
    assert low.kv_pool_bytes == high.kv_pool_bytes == pool
    assert low.kv_cache_usage is not None
    assert high.kv_cache_usage is not None
    assert low.kv_cache_usage < 0.15 < 0.4 < high.kv_cache_usage <= 1.0
    # a smaller fraction: a smaller pool, fuller for the same traffic
    small = signals_at(VLLM, busy, 0.3)
    assert small is not None
    assert small.kv_pool_bytes is not None
    assert small.kv_pool_bytes < pool
    assert small.kv_cache_usage is not None
    assert small.kv_cache_usage > high.kv_cache_usage


def test_the_kv_aware_need_is_the_weights_plus_the_kv_cache_the_traffic_fills() -> None:
    for at in HOURS:
        s = sample(at, 0.5)
        need = needed_memory_share(s)
        expected = VLLM.weights_share + VLLM.kv_cache_share * traffic(VLLM, at)
        assert need == pytest.approx(expected, abs=1e-3)
        assert need < s.memory_share  # the preallocation is not the need


def test_with_kv_signals_the_engine_never_ratchets_the_server_to_a_whole_gpu() -> None:
    """Today's rule reads the flat preallocation as need: each upsize raises the flag, hence
    the memory, hence the need again, up to a whole GPU. The KV-aware need does not."""

    def held_through_the_day(signals: bool) -> tuple[list[float], set[ReasonCode]]:
        state, held, fractions, reasons = WorkloadState(), 0.5, [], set()
        for minute in range(24 * 60):
            at = DAY + timedelta(hours=12, minutes=minute)
            state, d = decide(state, sample(at, held, signals), Policy())
            if d is not None:
                held = d.new_fraction
                reasons.add(d.reason)
            fractions.append(held)
        return fractions, reasons

    kv_aware, _ = held_through_the_day(signals=True)
    circular, reasons = held_through_the_day(signals=False)
    assert circular[-1] == 1.0
    assert ReasonCode.MEMORY_HIGH in reasons
    assert max(kv_aware) < 0.7
