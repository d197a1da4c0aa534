"""Replay of preallocating LLM servers: a generated trace whose vLLM pods hold 0.9 of the card
all day while their KV usage follows the day, replayed with the KV-aware rule (the trace carries
``kv_pool_bytes``) and with today's rule (the same trace without it), side by side.

Overruns are counted against what the pod needs, its fixed part plus the KV cache it uses
(analysis/replay.py): a server started at a smaller fraction gets a smaller pool, not less room
for the tokens it holds.
"""

from __future__ import annotations

import csv
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fracpilot_libs.analysis.baselines import EngineSizer
from fracpilot_libs.analysis.replay import replay
from fracpilot_libs.analysis.trace import TraceError, group_by_workload, read_trace
from fracpilot_libs.contracts import Policy

GIB = 1024**3
TOTAL = 80 * GIB
START = datetime(2026, 3, 2, tzinfo=UTC)
# name: (fixed part in GiB: weights + activations + graphs, KV usage at night, at the peak)
SERVERS = {"llama-8b": (18, 0.03, 0.45), "qwen-14b": (32, 0.05, 0.7), "mistral-7b": (16, 0.02, 0.2)}
COLUMNS = [
    *("timestamp", "namespace", "workload", "pod", "gpu_util"),
    *("gpu_mem_used_bytes", "gpu_mem_total_bytes", "requested_fraction"),
    *("kv_cache_usage", "kv_pool_bytes", "llm_server"),
]


def daily(hour: float, night: float, peak: float) -> float:
    """Low at night, highest at 14:00."""
    return night + (peak - night) * max(0.0, math.sin(math.pi * (hour - 6) / 16))


def write_trace(path: Path, *, days: int = 3, step_min: int = 5, kv_pool: bool = True) -> None:
    """vLLM pods at their default flag: 0.9 of an 80 GiB card in use, flat; the KV pool is the
    rest of it after the fixed part; KV usage and compute follow the day."""
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(COLUMNS)
        for name, (fixed_gib, night, peak) in SERVERS.items():
            used = int(0.9 * TOTAL)
            pool = used - fixed_gib * GIB
            for step in range(days * 24 * 60 // step_min):
                at = START + timedelta(minutes=step * step_min)
                hour = at.hour + at.minute / 60
                usage = daily(hour, night, peak)
                compute = 0.05 + 0.4 * usage
                out.writerow(
                    [
                        at.isoformat(),
                        "inference",
                        name,
                        f"{name}-0",
                        f"{compute:.4f}",
                        used,
                        TOTAL,
                        "1.0",
                        f"{usage:.4f}",
                        pool if kv_pool else "",
                        "vllm",
                    ]
                )


def run(path: Path) -> dict[str, tuple[float, int, float]]:
    """Per workload: (GPU-hours held per hour, memory overrun samples, final fraction)."""
    report = replay(group_by_workload(read_trace(path)), lambda: EngineSizer(Policy()))
    hours = 3 * 24
    return {
        w.workload.owner_name: (
            w.metrics.fraction_hours / hours,
            w.metrics.memory_overrun_samples,
            w.final_fraction,
        )
        for w in report.workloads
    }


def test_kv_aware_sizing_gives_memory_back_without_overrun_where_todays_rule_never_shrinks(
    tmp_path: Path,
) -> None:
    kv, today = tmp_path / "kv.csv", tmp_path / "today.csv"
    write_trace(kv)
    write_trace(today, kv_pool=False)
    aware, flat = run(kv), run(today)
    for name in SERVERS:
        held, overruns, final = flat[name]
        assert final >= 0.9, name  # today's rule reads 0.9 as needed
        assert held >= 0.9, name
        assert overruns == 0
        held_kv, overruns_kv, final_kv = aware[name]
        assert overruns_kv == 0, name  # never below fixed + used KV
        assert final_kv < 0.9, name
        assert held_kv < held, name
    # The need follows KV usage: the busiest pool keeps the most, the idlest the least.
    finals = {name: aware[name][2] for name in SERVERS}
    assert finals["mistral-7b"] < finals["llama-8b"] < finals["qwen-14b"]
    # And never below what the peak needs: fixed + pool x peak usage.
    for name, (fixed_gib, _, peak) in SERVERS.items():
        pool_gib = 0.9 * 80 - fixed_gib
        assert finals[name] * 80 >= fixed_gib + pool_gib * peak


def test_trace_reads_the_kv_columns_and_rejects_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, days=1, step_min=60)
    first = next(iter(read_trace(path)))
    assert first.sample.signals is not None
    assert first.sample.signals.llm_server == "vllm"
    assert first.sample.signals.kv_pool_bytes == int(0.9 * TOTAL) - 18 * GIB
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace(",vllm\n", ",triton\n", 1))
    with pytest.raises(TraceError, match="llm_server"):
        list(read_trace(bad))
    bad.write_text(path.read_text().replace(f",{int(0.9 * TOTAL) - 18 * GIB},", ",lots,", 1))
    with pytest.raises(TraceError, match="kv_pool_bytes: 'lots' is not a whole number"):
        list(read_trace(bad))


PER_TOKEN = 128 * 1024  # Llama-3.1-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 B


def write_token_trace(path: Path, *, recreated_at_day: int | None) -> None:
    """One vLLM that reports its pool in tokens only (vLLM's default ``cache_config_info``):
    at 0.9 of the card, then (from ``recreated_at_day``) recreated with its flag at 0.6."""
    fixed = 18 * GIB
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow([*COLUMNS, "kv_pool_tokens", "kv_max_sequence_tokens"])
        for step in range(3 * 24 * 12):
            at = START + timedelta(minutes=step * 5)
            share = 0.6 if recreated_at_day is not None and at.day - 2 >= recreated_at_day else 0.9
            tokens = (int(share * TOTAL) - fixed) // PER_TOKEN // 16 * 16  # whole blocks
            usage = daily(at.hour + at.minute / 60, 0.03, 0.45)
            row = [at.isoformat(), "inference", "llama-8b", "llama-8b-0", f"{0.05 + usage:.4f}"]
            memory = [fixed + tokens * PER_TOKEN, TOTAL, "1.0"]
            out.writerow([*row, *memory, f"{usage:.4f}", "", "vllm", tokens, 131072])


def test_a_pool_reported_in_tokens_is_learned_across_a_recreate_and_replayed_without_overrun(
    tmp_path: Path,
) -> None:
    learned, never = tmp_path / "learned.csv", tmp_path / "never.csv"
    write_token_trace(learned, recreated_at_day=1)
    write_token_trace(never, recreated_at_day=None)
    report = replay(group_by_workload(read_trace(learned)), lambda: EngineSizer(Policy()))
    [account] = report.workloads
    assert account.metrics.memory_overrun_samples == 0
    # fixed 18 GiB + the peak's 45% of the 30 GiB pool at 0.6 (13.5 GiB), plus headroom
    assert account.final_fraction < 0.6
    assert account.final_fraction * 80 >= 18 + 0.45 * (0.6 * 80 - 18)
    [flat] = replay(group_by_workload(read_trace(never)), lambda: EngineSizer(Policy())).workloads
    assert flat.final_fraction >= 0.9  # one pool size: nothing learned, memory in use sizes it
    first = next(iter(read_trace(learned)))
    assert first.sample.signals is not None
    assert first.sample.signals.kv_max_sequence_tokens == 131072
