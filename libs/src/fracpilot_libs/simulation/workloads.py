"""A simulator of inference workloads' GPU usage, for the demo (never for tests of real sources).

Each simulated workload serves traffic that follows a day: low at night, a peak in the
afternoon, with deterministic noise and occasional short bursts. Compute follows the traffic;
memory is the model's weights plus a KV cache that grows with traffic. Everything is a pure
function of the workload's parameters and the simulated time, so a run is reproducible.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime

from fracpilot_libs.contracts import WorkloadRef

GIB = 1024**3


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

    @property
    def pod(self) -> str:
        return f"{self.workload.owner_name}-0"


def _noise(key: str, slot: int) -> float:
    """Deterministic noise in [-1, 1) from a key and a time slot."""
    digest = hashlib.blake2b(f"{key}|{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


def traffic(w: SimulatedWorkload, at: datetime) -> float:
    """Traffic level 0..1 at a simulated time: a daily cosine curve plus noise."""
    hour = at.hour + at.minute / 60 + at.second / 3600
    daily = 0.5 * (1 + math.cos((hour - w.peak_hour) / 24 * 2 * math.pi))
    slot = int(at.timestamp() // 60)
    jitter = 0.08 * _noise(w.workload.key, slot)
    burst = 0.25 if _noise(w.workload.key + "burst", slot // 7) > 0.94 else 0.0
    return min(1.0, max(0.0, daily + jitter + burst))


def usage_at(w: SimulatedWorkload, at: datetime) -> tuple[float, int]:
    """Compute share and memory bytes of the workload at a simulated time."""
    level = traffic(w, at)
    compute = w.night_compute + (w.peak_compute - w.night_compute) * level
    memory_share = w.weights_share + w.kv_cache_share * level
    return min(1.0, max(0.0, compute)), int(min(1.0, memory_share) * w.device_memory_bytes)


def demo_workloads(namespace: str = "inference", cluster: str = "demo") -> list[SimulatedWorkload]:
    """Eight inference services of different sizes and rhythms, as a platform team runs them."""
    specs = [
        ("chat-llama-8b", 0.55, 0.06, 0.20, 0.15, 14.0),
        ("embed-bge", 0.12, 0.02, 0.03, 0.02, 11.0),
        ("rerank-minilm", 0.18, 0.03, 0.02, 0.03, 16.0),
        ("sdxl-images", 0.70, 0.04, 0.12, 0.10, 20.0),
        ("whisper-asr", 0.30, 0.05, 0.06, 0.05, 10.0),
        ("code-qwen-7b", 0.45, 0.03, 0.18, 0.14, 15.0),
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
        )
        for name, peak, night, weights, kv, hour in specs
    ]
