"""The data attribution reads and makes: a source's metric points, the pods they name, the
observations and rejections made of them, what the cluster says about GPUs (the inventory), and
what the point loop gathers of one device (:class:`GatheredGpu`). The public ones (all but
:class:`GatheredGpu`) are re-exported by :mod:`fracpilot_libs.usage.attribution`; here so
that the point loop, the per-GPU split and the application series share them without importing
one another."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.usage.mappings import Quantity


class MetricPoint(NamedTuple):
    """One value of one series at one time (unix seconds), as a source read it. (A named
    tuple: a source makes one per series and instant, 300,000 for 100,000 GPUs, and a frozen
    dataclass's ``__init__`` costs twice a tuple's.)"""

    metric: str
    labels: Mapping[str, str]
    value: float
    timestamp: float


class PodKey(NamedTuple):
    """A pod (and container) a number belongs to. A named tuple: hashed several times per
    point, and a tuple's hash is C's where a dataclass's is Python's."""

    namespace: str
    pod: str
    container: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str  # a short code for counters: nan, negative, above_100_percent, ...
    detail: str  # what and where, for the log and the dead letter


@dataclass(slots=True)
class Observation:
    """One pod's usage of one GPU at one time, before identity and validation. Not changed
    once made (``dataclasses.replace`` makes another); not frozen, as a frozen dataclass of
    this many fields took 5 µs to make, a third of attribution's time per GPU."""

    pod: PodKey
    gpu_uuid: str
    node: str
    timestamp: float
    compute: float
    memory_used_bytes: int
    memory_total_bytes: int
    exact: bool
    kv_cache_usage: float | None = None
    waiting_requests: int | None = None
    gpu_model: str = ""  # as the exporter names the card (prices the GPU-hours)
    preemptions_total: float | None = None  # vLLM's counter (contention, see signals.py)
    llm_server: str | None = None  # the preallocating server whose KV metrics the pod exports
    kv_pool_bytes: int | None = None  # its KV pool, bytes, when the server says
    kv_pool_tokens: int | None = None  # its KV pool, tokens
    kv_max_sequence_tokens: int | None = None  # the longest sequence it serves, tokens
    oom_event: bool = False
    contention_event: bool = False


@dataclass
class GpuInventory:
    """What the cluster says about GPUs: device memory, who holds which fraction (None: a pod
    known to share the GPU, its fraction not), and the workload each of those pods belongs to
    (as the actuator recorded it)."""

    device_memory_bytes: dict[str, int] = field(default_factory=dict)
    fractions: dict[str, dict[PodKey, float | None]] = field(default_factory=dict)  # gpu -> pod
    default_device_memory_bytes: int | None = None
    workloads: dict[PodKey, WorkloadRef] = field(default_factory=dict)  # (ns, pod) -> owner


@dataclass(slots=True)
class GatheredGpu:
    """What the point loop gathers of one device (a GPU, or a MIG instance), from which
    :func:`~fracpilot_libs.usage.gpu_split.split_gpu` makes its pods' observations."""

    node: str = ""
    model: str = ""
    profile: str = ""  # a MIG instance's profile ("" for a whole GPU)
    memory_share: float = 1.0  # a MIG instance's share of its card's memory (usage.mig)
    unknown_profile: bool = False  # a MIG instance off the card's scale: none of it is used
    rejected: bool = False  # a point of this device was rejected (its cause is counted)
    device: dict[Quantity, tuple[int, float]] = field(default_factory=dict)  # (priority, v)
    pods: dict[PodKey, dict[Quantity, float]] = field(default_factory=dict)  # exact numbers
    seen_pods: set[PodKey] = field(default_factory=set)
