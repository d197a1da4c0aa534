"""The memory an LLM server that preallocates its KV cache needs, from its KV pool. Pure.

vLLM, SGLang and TGI take their memory flag's share of the card when they start and keep it:
weights, activations and CUDA graphs (the *fixed part*) plus a KV-cache pool that fills the
rest (:mod:`fracpilot_libs.llm_servers`). Their memory in use is the preallocation, flat, so
sizing from it never shrinks them. What they need is the fixed part plus the part of the pool
their KV cache fills, and never less than the pool one longest sequence needs::

    fixed    = memory in use - KV pool
    min pool = max sequence tokens x bytes per token
    need     = fixed + max(KV pool x KV usage, min pool)

The engine keeps the peak of ``need`` over its memory window and adds its headroom, as it does
with memory in use (:func:`fracpilot_libs.sizing.observation.observe`): so the need is the
fixed part plus the pool the peak KV usage of the window fills, plus headroom. A server
restarted with a smaller flag gets a smaller pool that holds as many tokens as that peak (the
fixed part does not change); the flag is rewritten at every recreate
(:mod:`fracpilot_libs.llm_servers`).

**The pool in bytes.** No server exports it by default, but each exports its size in tokens
(vLLM ``cache_config_info`` ``num_gpu_blocks`` x ``block_size``; SGLang
``max_total_num_tokens``; TGI v3 ``tgi_batch_max_total_tokens``), and the bytes a token takes
are the model's, the same at every pool size: vLLM sizes its pool as ``num_blocks =
available_memory // page_size // num_layers`` and allocates ``page_size x num_blocks`` per layer
(``vllm/v1/core/kv_cache_utils.py`` ``get_num_blocks``, ``get_kv_cache_config_from_groups`` at
vllm-project/vllm 001cabc1be16a59a70d720ed61a13b678c060a18), linear in the tokens. So the pool
is known three ways (:class:`PoolSource`):

- **read**: the server says it in bytes (vLLM with ``--kv-cache-memory-bytes``, or a trace's
  ``kv_pool_bytes``); with its size in tokens that also gives the bytes per token;
- **learned**: the size in tokens times the bytes per token learned from two observations of
  the workload at different pool sizes (a recreate with a new flag changes the pool and the
  memory in use by the same bytes, the fixed part staying): ``(memory 2 - memory 1) / (tokens
  2 - tokens 1)`` (:func:`learn_bytes_per_token`), kept in the workload's state and dropped
  when a later pair of sizes disagrees with it (the fixed part moved);
- **unknown**: neither yet (one pool size seen so far): the need is the memory in use, today's
  rule, and :attr:`KvMemory.reason` says why.

The preallocation arithmetic alone (vLLM: memory in use ~ utilization x total) does not give the
pool: it fixes the sum of pool and fixed part, not how they split.

**The minimum pool.** vLLM refuses to start when its pool cannot hold one request of
``max_model_len`` tokens (``check_enough_kv_cache_memory``, "To serve at least one request with
the models's max seq len ...", same file and commit), and TGI v3's router when
``max_total_tokens`` or ``max_batch_prefill_tokens`` is above ``max_batch_total_tokens``
(``backends/v3/src/main.rs`` at huggingface/text-generation-inference db931fcf), so the need
never goes below the fixed part plus the pool that sequence needs, when the server's longest
sequence is known (``kv_max_sequence_tokens``). Unknown, the need is not floored and the reason
says so.

Without the pool's size or usage, or with facts that do not add up (a pool larger than the
memory in use, a minimum pool larger than the pool, memory that falls as the pool grows), the
need is the memory in use and :attr:`KvMemory.reason` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from fracpilot_libs.contracts import AppSignals, UsageSample

# Two pool sizes this far apart (relative) teach the bytes per token; closer, the memory in
# use's own noise (allocator slack, a few MiB) would dominate the difference.
MIN_POOL_CHANGE = 0.05
# A second slope this close (relative) to the learned one agrees with it (allocator slack).
SLOPE_TOLERANCE = 0.1


class PoolSource(StrEnum):
    """How the KV pool's size in bytes is known."""

    READ = "read"  # the server (or the trace) says it in bytes
    LEARNED = "learned"  # its tokens x the bytes per token learned across two pool sizes
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class KvMemory:
    """What one sample needs of its GPU's memory, and by which rule."""

    need_bytes: int
    kv_aware: bool  # False: memory in use (today's rule); reason says why
    reason: str
    fixed_bytes: int | None = None  # memory in use minus the KV pool
    used_kv_bytes: int | None = None  # the part of the pool the KV cache fills
    pool_bytes: int | None = None
    pool_source: PoolSource = PoolSource.UNKNOWN
    min_pool_bytes: int | None = None  # the pool one longest sequence needs; None: unknown


def gib(value: float) -> str:
    return f"{value / 2**30:.2f} GiB"


def kv_memory(
    memory_used_bytes: int,
    kv_pool_bytes: int | None,
    kv_usage: float | None,
    *,
    min_pool_bytes: int | None = None,
    pool_source: PoolSource = PoolSource.READ,
    unknown_reason: str = "the server's KV pool size is unknown",
) -> KvMemory:
    """The bytes a preallocating server needs: fixed part + the larger of the used KV and the
    minimum pool (see the module docstring).

    ``kv_usage`` is the pool's share in use, 0..1 (vLLM ``kv_cache_usage_perc``, SGLang
    ``token_usage``, TGI reserved over capacity tokens)."""
    if kv_pool_bytes is None:
        return KvMemory(memory_used_bytes, False, f"memory in use: {unknown_reason}")
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
    if min_pool_bytes is not None and min_pool_bytes > kv_pool_bytes:
        return KvMemory(
            memory_used_bytes,
            False,
            f"memory in use: one longest sequence needs {min_pool_bytes} B of KV pool, more "
            f"than the {kv_pool_bytes} B pool the server started with (conflicting facts)",
        )
    fixed = memory_used_bytes - kv_pool_bytes
    used_kv = round(kv_pool_bytes * kv_usage)
    kv = used_kv if min_pool_bytes is None or used_kv >= min_pool_bytes else min_pool_bytes
    floor = (
        "minimum pool unknown (the longest sequence is not reported)"
        if min_pool_bytes is None
        else f"at least {gib(min_pool_bytes)} for one longest sequence"
    )
    return KvMemory(
        fixed + kv,
        True,
        f"fixed part {gib(fixed)} + {kv_usage:.0%} of the {gib(kv_pool_bytes)} KV pool "
        f"({pool_source.value}), {floor}",
        fixed,
        used_kv,
        kv_pool_bytes,
        pool_source,
        min_pool_bytes,
    )


# --- the pool in bytes: read, or learned across two pool sizes --------------------------------


@dataclass(frozen=True, slots=True)
class PoolLearning:
    """What the engine keeps of a workload's KV pool between samples (in its state)."""

    anchor_tokens: float | None = None  # the last pool size seen, tokens
    anchor_memory: float | None = None  # the memory in use at that pool size, bytes
    bytes_per_token: float | None = None  # learned (or read); None: not yet


def learn_bytes_per_token(
    learning: PoolLearning,
    pool_tokens: int | None,
    memory_used_bytes: int,
    pool_bytes_read: int | None = None,
) -> tuple[PoolLearning, str]:
    """The learning after one sample, and what it says (``""``: nothing new).

    A pool read in bytes gives the bytes per token outright. Otherwise a pool size at least
    :data:`MIN_POOL_CHANGE` away from the anchor's gives the slope of memory in use over pool
    tokens, if it is a possible one: positive, the pool it implies no larger than the memory in
    use at either size, and within :data:`SLOPE_TOLERANCE` of a value learned before (a model's
    bytes per token do not change; a slope that does says the fixed part moved). Else the facts
    conflict: the learned value is dropped, so the pool is unknown (memory in use, the safe
    side) until the next pool size teaches it again, and the new size becomes the anchor. A
    pool of the anchor's size only refreshes the anchor's memory.
    """
    if pool_tokens is None or pool_tokens <= 0:
        return learning, "" if pool_tokens is None else f"pool of {pool_tokens} tokens ignored"
    if pool_bytes_read is not None and pool_bytes_read > 0:
        return PoolLearning(pool_tokens, memory_used_bytes, pool_bytes_read / pool_tokens), ""
    tokens, memory = learning.anchor_tokens, learning.anchor_memory
    anchored = PoolLearning(pool_tokens, memory_used_bytes, learning.bytes_per_token)
    if tokens is None or memory is None:
        return anchored, ""
    if abs(pool_tokens - tokens) < MIN_POOL_CHANGE * max(pool_tokens, tokens):
        return anchored, ""
    slope = (memory_used_bytes - memory) / (pool_tokens - tokens)
    known = learning.bytes_per_token
    if (
        slope <= 0
        or slope * pool_tokens > memory_used_bytes
        or slope * tokens > memory
        or (known is not None and abs(slope - known) > SLOPE_TOLERANCE * known)
    ):
        return PoolLearning(pool_tokens, memory_used_bytes, None), (
            f"bytes per token unknown: memory in use went from {gib(memory)} to "
            f"{gib(memory_used_bytes)} as the pool went from {tokens:.0f} to {pool_tokens} "
            "tokens (conflicting facts"
            + (f" with the {known:.0f} B per token learned before)" if known else ")")
        )
    return PoolLearning(pool_tokens, memory_used_bytes, slope), ""


def pool_of(
    signals: AppSignals, bytes_per_token: float | None
) -> tuple[int | None, PoolSource, str]:
    """The KV pool in bytes, how it is known, and why not when it is not."""
    if signals.kv_pool_bytes is not None:
        return signals.kv_pool_bytes, PoolSource.READ, ""
    if signals.kv_pool_tokens is None:
        return None, PoolSource.UNKNOWN, "the server reports no KV pool size"
    if bytes_per_token is None:
        return (
            None,
            PoolSource.UNKNOWN,
            f"the KV pool holds {signals.kv_pool_tokens} tokens but their bytes are not "
            "learned yet (it takes a second pool size: a recreate with a new flag)",
        )
    return round(signals.kv_pool_tokens * bytes_per_token), PoolSource.LEARNED, ""


def min_pool_of(signals: AppSignals, pool_bytes: int | None) -> int | None:
    """The pool one longest sequence needs, in bytes; None when the longest sequence or the
    bytes per token (the pool's bytes over its tokens) is unknown."""
    longest, tokens = signals.kv_max_sequence_tokens, signals.kv_pool_tokens
    if longest is None or pool_bytes is None or not tokens:
        return None
    return round(longest * pool_bytes / tokens)


def kv_sizing(sample: UsageSample, learning: PoolLearning) -> tuple[KvMemory, PoolLearning] | None:
    """The sample's need by the KV rule and the learning after it; None for a sample of a pod
    that runs no preallocating server (sized from its memory in use, as every pod)."""
    signals = sample.signals
    if signals is None or signals.llm_server is None:
        return None
    learned, note = learn_bytes_per_token(
        learning, signals.kv_pool_tokens, sample.memory_used_bytes, signals.kv_pool_bytes
    )
    pool, source, why = pool_of(signals, learned.bytes_per_token)
    need = kv_memory(
        sample.memory_used_bytes,
        pool,
        signals.kv_cache_usage,
        min_pool_bytes=min_pool_of(signals, pool),
        pool_source=source,
        unknown_reason=why or "the server's KV pool size is unknown",
    )
    if note:
        need = replace(need, reason=f"{need.reason}; {note}")
    return need, learned


def needed_memory_share(sample: UsageSample) -> float:
    """The share of the device the sample's pod needs, from the sample alone (no learning):
    :func:`kv_memory` for a server that reports its KV pool in bytes, else its memory in use
    (on every sample: the common case is cheap)."""
    signals = sample.signals
    if signals is None or signals.kv_pool_bytes is None:
        return sample.memory_share
    need = kv_memory(
        sample.memory_used_bytes,
        signals.kv_pool_bytes,
        signals.kv_cache_usage,
        min_pool_bytes=min_pool_of(signals, signals.kv_pool_bytes),
    )
    return need.need_bytes / sample.memory_total_bytes
