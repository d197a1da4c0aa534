"""Applications' own series (Level.APP: an LLM server's KV cache, queue and preemptions),
which name a pod but no GPU: gathered per pod by the point loop (:func:`observe_app_point`), then
set on each of the pod's observations (:func:`with_app_signals`)."""

from __future__ import annotations

import math
from dataclasses import replace

from fracpilot_libs.usage.attribution_types import MetricPoint, Observation, Rejection
from fracpilot_libs.usage.mappings import LLM_SERVER_FAMILIES, MetricMapping, Quantity
from fracpilot_libs.usage.point_reading import checked_value, describe_point, pod_of

# Several series of one pod (vLLM's engines, SGLang's ranks): the fullest pool speaks for it.
_LARGEST = frozenset(
    {
        Quantity.KV_CACHE,
        Quantity.KV_USED_TOKENS,
        Quantity.KV_CAPACITY_TOKENS,
        Quantity.KV_POOL_BYTES,
        Quantity.KV_MAX_SEQUENCE_TOKENS,
    }
)


def observe_app_point(
    point: MetricPoint,
    rows: tuple[MetricMapping, ...],
    renamed: set[tuple[str, str]],
    app: dict[tuple[str, str], dict[Quantity, float]],
    servers: dict[tuple[str, str], str],
    rejections: list[Rejection],
) -> None:
    """An application's series: every row that reads it (an info metric feeds several)."""
    for row in rows:
        raw = row.value_of(point.value, point.labels)
        if raw is None:  # an info label the server has not filled (vLLM's "None"): no value
            continue
        value, rejection = checked_value(point, row, raw)
        if rejection is not None:
            rejections.append(rejection)
            return
        assert value is not None
        pod = pod_of(point, row, renamed)
        if pod is None:  # nobody to attribute it to
            rejections.append(Rejection("no_pod", f"no pod label: {describe_point(point)}"))
            return
        ref = (pod.namespace, pod.pod)
        own = app[ref]
        quantity = row.quantity
        if quantity is Quantity.PREEMPTIONS:  # a counter per engine: the sum
            own[quantity] = own.get(quantity, 0.0) + value
        elif quantity in _LARGEST:
            own[quantity] = max(own.get(quantity, 0.0), value)
            if row.family in LLM_SERVER_FAMILIES:
                servers[ref] = row.family
        else:
            own[quantity] = value


def _kv_usage(signals: dict[Quantity, float]) -> float | None:
    """The KV pool's share in use: as the server says it, else used over capacity tokens."""
    usage = signals.get(Quantity.KV_CACHE)
    if usage is not None:
        return usage
    used, capacity = signals.get(Quantity.KV_USED_TOKENS), signals.get(Quantity.KV_CAPACITY_TOKENS)
    if used is None or not capacity:
        return None
    return min(1.0, used / capacity)


def with_app_signals(
    obs: Observation, signals: dict[Quantity, float] | None, server: str | None
) -> Observation:
    if not signals:
        return obs
    waiting = signals.get(Quantity.WAITING)
    pool = signals.get(Quantity.KV_POOL_BYTES)
    return replace(
        obs,
        kv_cache_usage=_kv_usage(signals),
        waiting_requests=int(waiting) if waiting is not None else None,
        preemptions_total=signals.get(Quantity.PREEMPTIONS),
        llm_server=server,
        kv_pool_bytes=int(pool) if pool is not None and math.isfinite(pool) else None,
        kv_pool_tokens=_tokens(signals.get(Quantity.KV_CAPACITY_TOKENS)),
        kv_max_sequence_tokens=_tokens(signals.get(Quantity.KV_MAX_SEQUENCE_TOKENS)),
    )


def _tokens(value: float | None) -> int | None:
    """A whole positive number of tokens; None for anything else (0: TGI before warmup)."""
    if value is None or not math.isfinite(value) or value < 1:
        return None
    return int(value)
