"""Observations become validated ``UsageSample`` messages, or rejections with a reason.

Pure: the caller passes the time and the record of what was already published (so a stale or
repeated point is caught here and nowhere else).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from fracpilot_libs.contracts import AppSignals, Attribution, UsageSample, WorkloadRef
from fracpilot_libs.usage.attribution import Observation, Rejection
from fracpilot_libs.validation import describe_validation_error


@dataclass
class PublishedSeries:
    """The newest timestamp published per series, bounded by forgetting idle series."""

    newest: dict[tuple[str, str, str, str], float] = field(default_factory=dict)

    def forget_before(self, cutoff: float) -> None:
        for key in [k for k, ts in self.newest.items() if ts < cutoff]:
            del self.newest[key]


def sample_id(source: str, workload: WorkloadRef, obs: Observation) -> str:
    """Deterministic, so re-reading the same instant publishes a duplicate NATS drops.

    Readable when it fits the contract's 200 characters; long Kubernetes names are hashed."""
    readable = (
        f"{source}|{workload.key}|{obs.pod.pod}|{obs.pod.container}|{obs.gpu_uuid}|"
        f"{int(obs.timestamp)}"
    )
    if len(readable) <= 200:
        return readable
    digest = hashlib.sha256(readable.encode()).hexdigest()[:40]
    return f"{source}|{digest}|{int(obs.timestamp)}"


def _where(obs: Observation) -> str:
    """The sample a rejection is about (formatted only for one: this runs per sample)."""
    return f"{obs.pod.namespace}/{obs.pod.pod} on {obs.gpu_uuid or '?'} at {obs.timestamp:.0f}"


def to_sample(
    obs: Observation,
    workload: WorkloadRef,
    source: str,
    now: float,
    max_age_s: float,
    published: PublishedSeries,
    allocated_fraction: float | None = None,
) -> UsageSample | Rejection:
    if not math.isfinite(obs.timestamp):  # a source's garbage: no instant to place it at
        return Rejection(
            "bad_timestamp",
            f"{obs.pod.namespace}/{obs.pod.pod} on {obs.gpu_uuid or '?'}: "
            f"time {obs.timestamp!r} is not a finite number",
        )
    if now - obs.timestamp > max_age_s:
        return Rejection(
            "stale", f"{_where(obs)}: {now - obs.timestamp:.0f} s old (max {max_age_s:g})"
        )
    if obs.timestamp > now + 60:
        return Rejection("future", f"{_where(obs)}: {obs.timestamp - now:.0f} s in the future")
    key = (workload.key, obs.pod.pod, obs.pod.container, obs.gpu_uuid)
    newest = published.newest.get(key)
    if newest is not None and obs.timestamp <= newest:
        return Rejection("duplicate", f"{_where(obs)}: not newer than {newest:.0f}")
    if obs.memory_used_bytes > obs.memory_total_bytes:
        return Rejection(
            "memory_above_device",
            f"{_where(obs)}: {obs.memory_used_bytes} B used of {obs.memory_total_bytes} B",
        )
    signals = None
    if (
        obs.kv_cache_usage is not None
        or obs.waiting_requests is not None
        or obs.oom_event
        or obs.contention_event
        or obs.llm_server is not None
    ):
        signals = AppSignals(
            kv_cache_usage=obs.kv_cache_usage,
            waiting_requests=obs.waiting_requests,
            oom_event=obs.oom_event,
            contention_event=obs.contention_event,
            llm_server=obs.llm_server,  # a family of mappings.py: validated here
            kv_pool_bytes=obs.kv_pool_bytes,
            kv_pool_tokens=obs.kv_pool_tokens,
            kv_max_sequence_tokens=obs.kv_max_sequence_tokens,
        )
    try:
        sample = UsageSample(
            sample_id=sample_id(source, workload, obs),
            workload=workload,
            pod=obs.pod.pod,
            container=obs.pod.container or "main",
            node=obs.node,
            gpu_uuid=obs.gpu_uuid,
            gpu_model=obs.gpu_model,
            timestamp=datetime.fromtimestamp(obs.timestamp, UTC),
            compute=obs.compute,
            memory_used_bytes=obs.memory_used_bytes,
            memory_total_bytes=obs.memory_total_bytes,
            allocated_fraction=allocated_fraction,
            source=source,
            attribution=Attribution.EXACT if obs.exact else Attribution.ESTIMATED,
            signals=signals,
        )
    except ValidationError as exc:
        return Rejection("invalid", f"{_where(obs)}: {describe_validation_error(exc)}")
    published.newest[key] = obs.timestamp
    return sample
