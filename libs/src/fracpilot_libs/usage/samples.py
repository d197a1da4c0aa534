"""Observations become validated ``UsageSample`` messages, or rejections with a reason.

Pure: the caller passes the time and the record of what was already published (so a stale or
repeated point is caught here and nowhere else).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from fracpilot_libs.contracts import (
    SCHEMA_VERSION,
    AppSignals,
    Attribution,
    UsageSample,
    WorkloadRef,
)
from fracpilot_libs.usage.attribution import Observation, Rejection
from fracpilot_libs.validation import describe_validation_error


@dataclass
class PublishedSeries:
    """The newest timestamp published per series, bounded by forgetting idle series."""

    newest: dict[tuple[str, str, str, str], float] = field(default_factory=dict)

    def forget_before(self, cutoff: float) -> None:
        for key in [k for k, ts in self.newest.items() if ts < cutoff]:
            del self.newest[key]


def sample_id(
    source: str, workload: WorkloadRef, obs: Observation, workload_key: str | None = None
) -> str:
    """Deterministic, so re-reading the same instant publishes a duplicate NATS drops.

    Readable when it fits the contract's 200 characters; long Kubernetes names are hashed.
    ``workload_key``: ``workload.key``, when the caller has it (a property that formats)."""
    key = workload.key if workload_key is None else workload_key
    readable = (
        f"{source}|{key}|{obs.pod.pod}|{obs.pod.container}|{obs.gpu_uuid}|{int(obs.timestamp)}"
    )
    if len(readable) <= 200:
        return readable
    digest = hashlib.sha256(readable.encode()).hexdigest()[:40]
    return f"{source}|{digest}|{int(obs.timestamp)}"


@functools.lru_cache(maxsize=64)
def _utc(timestamp: float) -> datetime:
    """The samples of an instant share its time: one datetime (immutable) for them all."""
    return datetime.fromtimestamp(timestamp, UTC)


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
    workload_key = workload.key  # a property formatting four fields: once a sample
    key = (workload_key, obs.pod.pod, obs.pod.container, obs.gpu_uuid)
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
    pod, node, uuid, model = obs.pod.pod, obs.node, obs.gpu_uuid, obs.gpu_model
    container = obs.pod.container or "main"
    compute, used, total = obs.compute, obs.memory_used_bytes, obs.memory_total_bytes
    sid = sample_id(source, workload, obs, workload_key)
    fields: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,  # the model's __dict__ as validation leaves it
        "sample_id": sid,
        "workload": workload,
        "pod": pod,
        "container": container,
        "node": node,
        "gpu_uuid": uuid,
        "gpu_model": model,
        "timestamp": _utc(obs.timestamp),
        "compute": compute,
        "memory_used_bytes": used,
        "memory_total_bytes": total,
        "allocated_fraction": allocated_fraction,
        "source": source,
        "attribution": Attribution.EXACT if obs.exact else Attribution.ESTIMATED,
        "signals": signals,
    }
    # Every field of the exact type the contract stores and within its bounds (checked on the
    # values at hand, not read back from the dict: 16 lookups and a call a sample).
    if (
        _typed_path
        and signals is None
        and type(workload) is WorkloadRef
        and type(sid) is str
        and 0 < len(sid) <= 200
        and type(pod) is str
        and 0 < len(pod) <= 253
        and type(container) is str
        and 0 < len(container) <= 63
        and type(node) is str
        and len(node) <= 253
        and type(uuid) is str
        and len(uuid) <= 128
        and type(model) is str
        and len(model) <= 128
        and type(source) is str
        and 0 < len(source) <= 63
        and type(compute) is float
        and 0.0 <= compute <= 1.0  # NaN fails every comparison
        and type(used) is int
        and type(total) is int
        and 0 <= used <= total
        and total > 0
        and (
            allocated_fraction is None
            or (type(allocated_fraction) is float and 0.0 < allocated_fraction <= 1.0)
        )
    ):
        sample = _checked(fields)
    else:
        try:
            del fields["schema_version"]  # its default: not among the fields set
            sample = UsageSample(**fields)
        except ValidationError as exc:
            return Rejection("invalid", f"{_where(obs)}: {describe_validation_error(exc)}")
    published.newest[key] = obs.timestamp
    return sample


# --- the typed path ----------------------------------------------------------------------------
# Validating a UsageSample with pydantic took 2.8 µs of an ingest cycle's ~50 per GPU. The
# values an observation gives are of known types, so the common sample (no application signals)
# is checked here against the contract's constraints, field by field, and made as
# ``UsageSample.model_construct`` makes a model, without its per-field Python loop. Anything
# this check does not plainly accept goes through pydantic, which accepts it or says why not
# (tests/unit/ingest/test_sample_fast_path.py holds the two paths equal, turning this one off).
_typed_path = True

_FIELDS_SET = frozenset(UsageSample.model_fields) - {"schema_version"}
# One set of the fields set, shared by every sample of the typed path: a set of 16 names per
# sample was 0.7 KB (past pymalloc's small objects: malloc and free) and a copy each. A
# sample is frozen, so pydantic never adds to it; ``model_copy`` copies it before an update.
_SHARED_FIELDS_SET = set(_FIELDS_SET)
_new_object = object.__new__
_set_attribute = object.__setattr__


def _checked(fields: dict[str, object]) -> UsageSample:
    """The model of fields :func:`to_sample` plainly accepted: what ``model_construct`` does
    (its ``__dict__``, the fields set, no extra, no private attributes)."""
    sample: UsageSample = _new_object(UsageSample)
    _set_attribute(sample, "__dict__", fields)
    _set_attribute(sample, "__pydantic_fields_set__", _SHARED_FIELDS_SET)
    _set_attribute(sample, "__pydantic_extra__", None)
    _set_attribute(sample, "__pydantic_private__", None)
    return sample
