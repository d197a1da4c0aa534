"""A simulator of inference workloads' GPU usage, for the demo (never for tests of real sources).

Each simulated workload serves traffic that follows a day: low at night, a peak in the
afternoon, with deterministic noise and occasional short bursts. Compute follows the traffic;
memory is the model's weights plus a KV cache that grows with traffic. A workload that serves
with vLLM (``saturates_at`` set) also reports vLLM's signals: its requests wait when the
fraction it holds is below what its traffic needs, though its utilization stays low (decoding
is bound by memory bandwidth, not by the SMs DCGM counts), so only the queue shows it.
A workload served by a server that preallocates (``preallocates`` set: vLLM, issue 28) holds
its memory flag's share of the card whatever its traffic: the flag as fracpilot rewrites it for
the fraction it holds (:func:`fracpilot_libs.llm_servers.flag_value`; the server's default on a
GPU of its own), so its memory in use is flat. Its KV cache fills the pool (the preallocation
less the weights) as its traffic needs, and it reports the pool and its usage as vLLM's metrics
say them, so the engine sizes it from the KV cache it uses (:mod:`fracpilot_libs.sizing.kv_memory`).
The flag is that of the fraction held, as if every change restarted the server: a real in-place
upsize leaves the pool at its start flag (the demo's backend recreates only its downsizes).
Everything is a pure function of the workload's parameters, the simulated time and the fraction
held, so a run is reproducible.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime

from fracpilot_libs.contracts import AppSignals, WorkloadRef
from fracpilot_libs.llm_servers import FLAGS, LlmServer, flag_value

GIB = 1024**3
WAITING_AT_FULL_DEFICIT = 64  # requests waiting when the fraction held serves no traffic at all


@dataclass(frozen=True, slots=True)
class SimulatedWorkload:
    workload: WorkloadRef
    peak_compute: float  # share of a whole GPU at the daily peak
    night_compute: float  # share of a whole GPU at the quietest hour
    weights_share: float  # model weights as a share of device memory
    kv_cache_share: float  # KV cache at peak traffic as a share of device memory
    peak_hour: float = 15.0  # local hour of the daily peak
    device_memory_bytes: int = 80 * GIB
    gpu_model: str = "NVIDIA A100-SXM4-80GB"  # as DCGM names it (modelName): prices the demo
    # vLLM serving: the fraction of a GPU the traffic needs at its daily peak for no request to
    # wait (None: the workload reports no application signals)
    saturates_at: float | None = None
    # an LLM server that preallocates its memory at the flag fracpilot writes for its fraction
    preallocates: LlmServer | None = None

    @property
    def pod(self) -> str:
        return f"{self.workload.owner_name}-0"


def _noise(key: str, slot: int) -> float:
    """Deterministic noise in [-1, 1) from a key and a time slot."""
    digest = hashlib.blake2b(f"{key}|{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


def daily_level(w: SimulatedWorkload, at: datetime) -> float:
    """The smooth daily part of the traffic, 0..1: 1 at the peak hour, 0 twelve hours later."""
    hour = at.hour + at.minute / 60 + at.second / 3600
    return 0.5 * (1 + math.cos((hour - w.peak_hour) / 24 * 2 * math.pi))


def traffic(w: SimulatedWorkload, at: datetime) -> float:
    """Traffic level 0..1 at a simulated time: a daily cosine curve plus noise."""
    daily = daily_level(w, at)
    slot = int(at.timestamp() // 60)
    jitter = 0.08 * _noise(w.workload.key, slot)
    burst = 0.25 if _noise(w.workload.key + "burst", slot // 7) > 0.94 else 0.0
    return min(1.0, max(0.0, daily + jitter + burst))


def preallocated_share(w: SimulatedWorkload, fraction: float | None) -> float | None:
    """The share of the card a preallocating server holds at ``fraction`` (None: a GPU of its
    own, the flag as its owner left it: the server's default); None: it does not preallocate."""
    if w.preallocates is None:
        return None
    if fraction is None:
        return FLAGS[w.preallocates].default or 1.0
    return flag_value(w.preallocates, min(max(fraction, 0.0), 1.0))


def usage_at(
    w: SimulatedWorkload, at: datetime, fraction: float | None = None
) -> tuple[float, int]:
    """Compute share and memory bytes of the workload at a simulated time, holding ``fraction``
    (None: a whole GPU; only a preallocating server's memory depends on it)."""
    level = traffic(w, at)
    compute = w.night_compute + (w.peak_compute - w.night_compute) * level
    held = preallocated_share(w, fraction)
    memory_share = w.weights_share + w.kv_cache_share * level if held is None else held
    return min(1.0, max(0.0, compute)), int(min(1.0, memory_share) * w.device_memory_bytes)


def kv_pool_share(w: SimulatedWorkload, fraction: float | None) -> float | None:
    """A preallocating server's KV pool: its preallocation less the weights (None: it does not
    preallocate)."""
    held = preallocated_share(w, fraction)
    return None if held is None else max(0.0, min(1.0, held) - w.weights_share)


def signals_at(w: SimulatedWorkload, at: datetime, fraction: float | None) -> AppSignals | None:
    """vLLM's signals of a serving workload holding ``fraction`` (None: a whole GPU) at a
    simulated time: requests wait in proportion to the share of the traffic's need the
    fraction does not cover (the smooth daily traffic, so the queue grows steadily while the
    traffic rises past what the fraction serves); the KV cache fills with the traffic."""
    if w.preallocates is not None:
        return _kv_signals(w, at, fraction)
    if w.saturates_at is None:
        return None
    held = 1.0 if fraction is None else fraction
    needed = daily_level(w, at) * w.saturates_at
    deficit = max(0.0, needed - held) / w.saturates_at
    kv = min(1.0, needed / held) if held > 0 else 1.0
    return AppSignals(
        waiting_requests=round(WAITING_AT_FULL_DEFICIT * deficit), kv_cache_usage=round(kv, 4)
    )


def _kv_signals(w: SimulatedWorkload, at: datetime, fraction: float | None) -> AppSignals:
    """A preallocating server's KV signals, as ingest maps vLLM's ``cache_config_info`` (the
    pool) and ``kv_cache_usage_perc``: the KV cache its traffic needs over the pool (full when
    the pool is too small for it)."""
    assert w.preallocates is not None
    pool = kv_pool_share(w, fraction) or 0.0
    needed = w.kv_cache_share * traffic(w, at)
    usage = min(1.0, needed / pool) if pool > 0 else 1.0
    return AppSignals(
        kv_cache_usage=round(usage, 4),
        llm_server=w.preallocates.value,
        kv_pool_bytes=int(pool * w.device_memory_bytes),
    )


def demo_workloads(namespace: str = "inference", cluster: str = "demo") -> list[SimulatedWorkload]:
    """Eight inference services of different sizes and rhythms, as a platform team runs them."""
    specs = [
        ("chat-llama-8b", 0.55, 0.06, 0.20, 0.15, 14.0),
        ("embed-bge", 0.12, 0.02, 0.03, 0.02, 11.0),
        ("rerank-minilm", 0.18, 0.03, 0.02, 0.03, 16.0),
        ("sdxl-images", 0.70, 0.04, 0.12, 0.10, 20.0),
        ("whisper-asr", 0.30, 0.05, 0.06, 0.05, 10.0),
        ("code-qwen-7b", 0.45, 0.03, 0.18, 0.14, 15.0),  # vLLM: queues below 0.8 at peak
        ("ocr-donut", 0.15, 0.01, 0.04, 0.02, 9.0),
        ("tts-xtts", 0.22, 0.02, 0.05, 0.04, 18.0),
    ]
    return [
        SimulatedWorkload(
            workload=WorkloadRef(cluster=cluster, namespace=namespace, owner_name=name),
            peak_compute=peak,
            night_compute=night,
            weights_share=weights,
            kv_cache_share=kv,
            peak_hour=hour,
            saturates_at=SERVING.get(name),
            preallocates=PREALLOCATING.get(name),
        )
        for name, peak, night, weights, kv, hour in specs
    ]


# Workloads served by vLLM, and the fraction their peak traffic needs: code-qwen-7b's
# utilization peaks at 0.45 of a GPU, but its requests wait below 0.8 (the queue shows it).
SERVING = {"code-qwen-7b": 0.8}

# Workloads served by an LLM server that preallocates: chat-llama-8b runs vLLM, its flag
# rewritten at every recreate, so its memory in use is its fraction's share (issue 28).
PREALLOCATING = {"chat-llama-8b": LlmServer.VLLM}
