"""The memory an LLM server that preallocates its KV cache needs, from its KV pool. Pure.

vLLM, SGLang and TGI take their memory flag's share of the card when they start and keep it:
weights, activations and CUDA graphs (the *fixed part*) plus a KV-cache pool that fills the
rest (:mod:`fracpilot_libs.llm_servers`). Their memory in use is the preallocation, flat, so
sizing from it never shrinks them. What they need is the fixed part plus the part of the pool
their KV cache fills::

    fixed = memory in use - KV pool
    need  = fixed + KV pool x KV usage

The engine keeps the peak of ``need`` over its memory window and adds its headroom, as it does
with memory in use (:func:`fracpilot_libs.sizing.engine.observe`): so the need is the fixed part
plus the pool the peak KV usage of the window fills, plus headroom. A server restarted with a
smaller flag gets a smaller pool that holds as many tokens as that peak (the fixed part does not
change); the flag is rewritten at every recreate (:mod:`fracpilot_libs.llm_servers`).

Without the pool's size or usage, or with numbers that do not add up (a pool larger than the
memory in use), the need is the memory in use, today's rule, and :attr:`KvMemory.reason` says
why.
"""

from __future__ import annotations

from dataclasses import dataclass

from fracpilot_libs.contracts import UsageSample


@dataclass(frozen=True, slots=True)
class KvMemory:
    """What one sample needs of its GPU's memory, and by which rule."""

    need_bytes: int
    kv_aware: bool  # False: memory in use (today's rule); reason says why
    reason: str
    fixed_bytes: int | None = None  # memory in use minus the KV pool
    used_kv_bytes: int | None = None  # the part of the pool the KV cache fills


def kv_memory(
    memory_used_bytes: int, kv_pool_bytes: int | None, kv_usage: float | None
) -> KvMemory:
    """The bytes a preallocating server needs: fixed part + used KV (see the module docstring).

    ``kv_usage`` is the pool's share in use, 0..1 (vLLM ``kv_cache_usage_perc``, SGLang
    ``token_usage``, TGI reserved over capacity tokens)."""
    if kv_pool_bytes is None:
        return KvMemory(
            memory_used_bytes, False, "memory in use: the server's KV pool size is unknown"
        )
    if kv_usage is None:
        return KvMemory(memory_used_bytes, False, "memory in use: no KV-cache usage reported")
    if not 0.0 <= kv_usage <= 1.0:
        return KvMemory(
            memory_used_bytes, False, f"memory in use: KV-cache usage {kv_usage!r} not in 0..1"
        )
    if kv_pool_bytes > memory_used_bytes:
        return KvMemory(
            memory_used_bytes,
            False,
            f"memory in use: the KV pool ({kv_pool_bytes} B) is larger than the memory in use "
            f"({memory_used_bytes} B)",
        )
    fixed = memory_used_bytes - kv_pool_bytes
    used_kv = round(kv_pool_bytes * kv_usage)
    return KvMemory(
        fixed + used_kv,
        True,
        f"fixed part {fixed} B + {kv_usage:.0%} of the {kv_pool_bytes} B KV pool",
        fixed,
        used_kv,
    )


def needed_memory_share(sample: UsageSample) -> float:
    """The share of the device the sample's pod needs: :func:`kv_memory` for a server that
    reports its KV pool, else its memory in use (on every sample: the common case is cheap)."""
    signals = sample.signals
    if signals is None or signals.kv_pool_bytes is None:
        return sample.memory_share
    need = kv_memory(sample.memory_used_bytes, signals.kv_pool_bytes, signals.kv_cache_usage)
    return need.need_bytes / sample.memory_total_bytes
