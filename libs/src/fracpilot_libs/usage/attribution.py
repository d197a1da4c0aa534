"""From raw metric points to per-pod usage: pure functions, no I/O, time passed in.

Per GPU, the most specific numbers win: a container's or a process's own numbers are exact;
when only whole-device numbers exist, a GPU used by one pod gives that pod the device's numbers
(exact), and a GPU shared by several pods is split between them by their allocated fractions
(equal shares when unknown) and marked *estimated*. A MIG GPU instance is a device of its own
(:mod:`fracpilot_libs.usage.mig`). Every point that cannot be used is rejected once, with one
reason (a pod left without numbers by a rejected point is not counted again), and one bad
series never stops the others.
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.mig.profiles import instance_model
from fracpilot_libs.usage.mappings import (
    LLM_SERVER_FAMILIES,
    Level,
    MappingTable,
    MetricMapping,
    Quantity,
    gpu_model_name,
)
from fracpilot_libs.usage.mig import (
    INSTANCE_ID_LABEL,
    PROFILE_LABEL,
    card_memory_bytes,
    compute_share,
    memory_share,
    mig_instance,
    profile_memory_bytes,
)

_EPS = 1e-9
_SHARES = frozenset({Quantity.COMPUTE, Quantity.KV_CACHE})  # 0..1
_MAX_SHARE = 1 + _EPS


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
class _Gpu:
    node: str = ""
    model: str = ""
    profile: str = ""  # a MIG instance's profile ("" for a whole GPU)
    memory_share: float = 1.0  # a MIG instance's share of its card's memory (usage.mig)
    unknown_profile: bool = False  # a MIG instance off the card's scale: none of it is used
    rejected: bool = False  # a point of this device was rejected (its cause is counted)
    device: dict[Quantity, tuple[int, float]] = field(default_factory=dict)  # (priority, v)
    pods: dict[PodKey, dict[Quantity, float]] = field(default_factory=dict)  # exact numbers
    seen_pods: set[PodKey] = field(default_factory=set)


def _role(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return ""


def _describe(point: MetricPoint) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(point.labels.items()))
    return f"{point.metric}{{{shown}}}={point.value!r}@{point.timestamp:.0f}"


def _target(point: MetricPoint) -> tuple[str, str]:
    return point.labels.get("job", ""), point.labels.get("instance", "")


def _renamed_instances(points: Iterable[MetricPoint]) -> set[tuple[str, str]]:
    """Scrape targets whose exporter labels Prometheus renamed to ``exported_*``."""
    return {
        (labels.get("job", ""), labels.get("instance", ""))
        for p in points
        if "exported_pod" in (labels := p.labels) or "exported_namespace" in labels
    }


def _pod_of(
    point: MetricPoint,
    mapping: MetricMapping,
    renamed: set[tuple[str, str]],
    exporters: dict[tuple[str, tuple[str, ...]], bool] | None = None,
) -> PodKey | None:
    """The pod a point names, if any. ``exporters``: what the exporter-pod check said of each
    pod name so far (an instant names each pod in several series; one regex search each)."""
    labels = point.labels
    roles = mapping.roles
    for pod_label in roles.pod:
        if pod := labels.get(pod_label):
            break
    else:
        return None
    if renamed and pod_label == "pod" and _target(point) in renamed:
        return None  # this target's exporter labels were renamed: ``pod`` is the exporter's
    prefixes = roles.exporter_pod_prefixes
    exporter = exporters.get((pod, prefixes)) if exporters is not None else None
    if exporter is None:
        exporter = _is_exporter_pod(pod, prefixes)
        if exporters is not None:
            exporters[pod, prefixes] = exporter
    if exporter:
        return None  # the exporter's own pod (an idle GPU): nobody uses this GPU
    for name in roles.namespace:
        if namespace := labels.get(name):
            break
    else:
        return None
    for name in roles.container:
        if container := labels.get(name):
            return PodKey(namespace, pod, container)
    return PodKey(namespace, pod, "")


def _is_exporter_pod(pod: str, names: tuple[str, ...]) -> bool:
    """``dcgm-exporter-x7k2p`` and a Helm release's ``gpu-mon-dcgm-exporter-x7k2p`` alike."""
    return _exporter_pod_pattern(names).search(pod) is not None


@functools.cache
def _exporter_pod_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in names)
    return re.compile(f"(?:^|-)(?:{alternatives})-")


def _checked_value(
    point: MetricPoint, mapping: MetricMapping, raw: float | None = None
) -> tuple[float | None, Rejection | None]:
    value = (point.value if raw is None else raw) * mapping.scale
    if math.isnan(value) or math.isinf(value):
        return None, Rejection("nan", f"not a finite number: {_describe(point)}")
    if value < 0:
        return None, Rejection("negative", f"negative value: {_describe(point)}")
    if mapping.quantity in _SHARES and value > _MAX_SHARE:
        return None, Rejection("above_100_percent", f"above 100%: {_describe(point)}")
    return value, None


class _Row(NamedTuple):
    """What the point loop reads of a mapping row, at hand (the attributes of a pydantic row
    looked up a dozen times per point were a tenth of attribution)."""

    mapping: MetricMapping
    rank: int  # its place in the table: earlier rows are preferred
    requires: tuple[str, ...]
    excludes: tuple[str, ...]
    level: Level
    quantity: Quantity
    scale: float
    share: bool  # a 0..1 quantity
    gpu_uuid: tuple[str, ...]
    pod: tuple[str, ...]
    namespace: tuple[str, ...]
    container: tuple[str, ...]
    exporters: dict[str, bool]  # what the exporter-pod check said of each pod name


def _rows(table: MappingTable) -> dict[str, tuple[_Row, ...]]:
    """The table's rows by metric as :class:`_Row`; rows with the same exporter-pod prefixes
    share what the check said of a pod name (an instant names each pod in several series)."""
    rank = {id(row): i for i, row in enumerate(table.rows)}
    checked: dict[tuple[str, ...], dict[str, bool]] = {}
    return {
        metric: tuple(
            _Row(
                m,
                rank[id(m)],
                m.requires_labels,
                m.excludes_labels,
                m.level,
                m.quantity,
                m.scale,
                m.quantity in _SHARES,
                m.roles.gpu_uuid,
                m.roles.pod,
                m.roles.namespace,
                m.roles.container,
                checked.setdefault(m.roles.exporter_pod_prefixes, {}),
            )
            for m in mappings
        )
        for metric, mappings in table.rows_by_metric.items()
    }


def observe_points(
    points: list[MetricPoint], table: MappingTable, inventory: GpuInventory
) -> tuple[list[Observation], list[Rejection]]:
    """Turn the points of one instant into per-pod observations (see the module docstring)."""
    rejections: list[Rejection] = []
    # Targets whose exporter labels were renamed: looked for only once a point's pod comes
    # from the plain ``pod`` label (a pass over every point; with ``exported_pod``, never).
    renamed: set[tuple[str, str]] | None = None
    gpus: dict[str, _Gpu] = defaultdict(_Gpu)
    app: dict[tuple[str, str], dict[Quantity, float]] = defaultdict(dict)
    servers: dict[tuple[str, str], str] = {}  # pod -> the LLM server whose KV metrics it has
    timestamp = max((p.timestamp for p in points), default=0.0)
    by_metric = _rows(table)
    new_tuple, pod_type, device_level, app_level = tuple.__new__, PodKey, Level.DEVICE, Level.APP
    for point in points:
        metric, labels, raw, _ = point
        # table.match, inline (once per point)
        for row in by_metric.get(metric, ()):
            if row.requires and not all(labels.get(name) for name in row.requires):
                continue
            for name in row.excludes:
                if labels.get(name):
                    break
            else:
                break
        else:
            continue
        mapping, level = row.mapping, row.level
        if level is app_level:
            rows = table.app_rows(metric, labels)
            if renamed is None:
                renamed = _renamed_instances(points)
            _observe_app(point, rows, renamed, app, servers, rejections)
            continue
        scaled = raw * row.scale
        # A finite, non-negative number (at most 1 for a share) passes without a call; any
        # other is checked again for its reason.
        value: float | None = scaled
        rejection = None
        if not 0.0 <= scaled < math.inf or (scaled > _MAX_SHARE and row.share):
            value, rejection = _checked_value(point, mapping)
        uuid = ""
        for name in row.gpu_uuid:  # _role, inline
            if uuid := labels.get(name, ""):
                break
        # mig_instance, called only for a series that names an instance (one in many)
        if uuid and (labels.get(INSTANCE_ID_LABEL) or labels.get(PROFILE_LABEL)):
            instance = mig_instance(uuid, labels)
        else:
            instance = None
        device = instance.device_id if instance is not None else uuid  # MIG: the instance
        if rejection is not None:
            rejections.append(rejection)
            if device:
                gpus[device].rejected = True
            continue
        assert value is not None
        # _pod_of, inline
        pod: PodKey | None = None
        name = ""
        for pod_label in row.pod:
            if name := labels.get(pod_label, ""):
                break
        if name:
            if pod_label == "pod":
                if renamed is None:
                    renamed = _renamed_instances(points)
                if renamed and _target(point) in renamed:
                    name = ""  # this target's exporter labels were renamed: it is the exporter's
            if name and (exporter := row.exporters.get(name)) is None:
                exporter = row.exporters[name] = _is_exporter_pod(
                    name, mapping.roles.exporter_pod_prefixes
                )
            if name and not exporter:  # else the exporter's own pod: nobody uses this GPU
                for label in row.namespace:
                    if namespace := labels.get(label):
                        for label in row.container:
                            if container := labels.get(label):
                                break
                        else:
                            container = ""
                        pod = new_tuple(pod_type, (namespace, name, container))
                        break
        if pod is None and level is not device_level:  # nobody to attribute it to
            rejections.append(Rejection("no_pod", f"no pod label: {_describe(point)}"))
            continue
        if not device:
            rejections.append(Rejection("no_gpu", f"no GPU UUID label: {_describe(point)}"))
            continue
        gpu = gpus[device]
        gpu.node = gpu.node or _role(labels, mapping.roles.node)
        gpu.model = gpu.model or gpu_model_name(_role(labels, mapping.roles.model))
        quantity = row.quantity
        if instance is not None:
            # One scale, the card's (usage.mig): compute times the compute slices here, memory
            # by the instance's share of the card's memory in _split_gpu.
            compute = compute_share(instance.profile, gpu.model)
            memory = memory_share(
                instance.profile,
                gpu.model,
                inventory.device_memory_bytes.get(instance.parent_uuid),
            )
            if compute is None or memory is None:
                if not gpu.unknown_profile:  # once per instance
                    rejections.append(
                        Rejection("unknown_mig_profile", f"MIG profile unknown: {_describe(point)}")
                    )
                gpu.unknown_profile = gpu.rejected = True
                continue
            gpu.profile = instance.profile
            gpu.memory_share = memory
            if quantity is Quantity.COMPUTE:
                value *= compute  # the instance's ratio as a share of the whole card
        if level is device_level:
            held = gpu.device.get(quantity)
            if held is None or row.rank < held[0]:  # earlier rows are preferred
                gpu.device[quantity] = (row.rank, value)
            if pod is not None:
                gpu.seen_pods.add(pod)
        elif pod is not None:
            own = gpu.pods.setdefault(pod, {})
            # Several processes of one pod add up; a container's numbers stand alone.
            if level is Level.PROCESS:
                own[quantity] = own.get(quantity, 0.0) + value
            else:
                own[quantity] = value
            gpu.seen_pods.add(pod)

    observations: list[Observation] = []
    # In the order the GPUs first came (the source's order): not sorted by UUID, which at
    # 100,000 GPUs visited them scattered in memory (4.5 of ~13 µs a GPU, bench/ingest_phases).
    # Batches sort their samples by id, so what is published does not depend on it.
    for uuid, gpu in gpus.items():
        observations.extend(_split_gpu(uuid, gpu, inventory, timestamp, rejections))
    if not app:  # no application series: nothing to add
        return observations, rejections
    return [
        _with_signals(
            obs,
            app.get((obs.pod.namespace, obs.pod.pod)),
            servers.get((obs.pod.namespace, obs.pod.pod)),
        )
        for obs in observations
    ], rejections


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


def _observe_app(
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
        value, rejection = _checked_value(point, row, raw)
        if rejection is not None:
            rejections.append(rejection)
            return
        assert value is not None
        pod = _pod_of(point, row, renamed)
        if pod is None:  # nobody to attribute it to
            rejections.append(Rejection("no_pod", f"no pod label: {_describe(point)}"))
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


def _with_signals(
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


def _device_total(uuid: str, gpu: _Gpu, inventory: GpuInventory) -> tuple[int | None, bool]:
    """The device's memory and whether it is measured (False: a MIG profile's nominal size).

    dcgm-exporter: FB_TOTAL when exported, else used + free + reserved (the driver's reserve
    is part of the card; without FB_RESERVED, older exporters, used + free)."""
    used = gpu.device.get(Quantity.MEMORY_USED)
    free = gpu.device.get(Quantity.MEMORY_FREE)
    total = gpu.device.get(Quantity.MEMORY_TOTAL)
    if total is not None:
        return int(total[1]), True
    if used is not None and free is not None:
        reserved = gpu.device.get(Quantity.MEMORY_RESERVED)
        summed = used[1] + free[1] + (reserved[1] if reserved is not None else 0.0)
        return (int(summed) if math.isfinite(summed) else None), True  # huge numbers: none
    if gpu.profile and (nominal := profile_memory_bytes(gpu.profile)) is not None:
        return nominal, False
    known = inventory.device_memory_bytes.get(uuid) or inventory.default_device_memory_bytes
    return known, True


def _pod_order(pod: PodKey) -> tuple[str, str, str]:
    return (pod.namespace, pod.pod, pod.container)


_NO_FRACTIONS: dict[PodKey, float | None] = {}  # a GPU no allocation names (never written)


def _split_gpu(
    uuid: str, gpu: _Gpu, inventory: GpuInventory, timestamp: float, rejections: list[Rejection]
) -> list[Observation]:
    if gpu.unknown_profile:
        return []
    total, measured = _device_total(uuid, gpu, inventory)
    if total is not None and gpu.profile:
        total = card_memory_bytes(total, gpu.memory_share)  # the card's scale (usage.mig)
    allocated = inventory.fractions.get(uuid) or _NO_FRACTIONS  # read only
    # Pods seen in the series, plus pods the inventory places on this GPU that no series
    # names (dcgm without virtual GPUs labels one sharing pod or none).
    if allocated:
        seen = {(p.namespace, p.pod) for p in gpu.seen_pods}
        pods = sorted(
            gpu.seen_pods | {p for p in allocated if (p.namespace, p.pod) not in seen},
            key=_pod_order,
        )
    else:  # most GPUs: nothing to add, often one pod to sort
        pods = sorted(gpu.seen_pods, key=_pod_order) if len(gpu.seen_pods) > 1 else [*gpu.seen_pods]
    if not pods:
        return []
    # A rejected point of this device is counted already; a missing total or number that
    # follows from it is not counted again.
    follow_ups: list[Rejection] = [] if gpu.rejected else rejections
    if total is None:
        follow_ups.append(
            Rejection(
                "unknown_device_memory",
                f"GPU {uuid}: device memory unknown (no FB_FREE, no inventory, no default)",
            )
        )
        return []
    model = (instance_model(gpu.model, gpu.profile) if gpu.profile else gpu.model)[:128]
    if len(pods) == 1 and not gpu.pods:
        # The common case (one pod, device numbers only), as _per_pod would split it and the
        # loop below make it: the lone pod has the device's numbers, exact.
        pod = pods[0]
        device_compute = gpu.device.get(Quantity.COMPUTE)
        device_memory = gpu.device.get(Quantity.MEMORY_USED)
        if device_compute is None or device_memory is None:
            follow_ups.append(_incomplete(uuid, pod, device_compute is None, timestamp))
            return []
        return [
            Observation(
                pod,
                uuid,
                gpu.node,
                timestamp,
                min(max(0.0, device_compute[1]), 1.0),
                int(max(0.0, device_memory[1])),
                total,
                measured,
                gpu_model=model,
            )
        ]
    values: dict[Quantity, dict[PodKey, tuple[float, bool]]] = {}
    for quantity in (Quantity.COMPUTE, Quantity.MEMORY_USED):
        values[quantity] = _per_pod(quantity, pods, gpu, allocated)
    out = []
    for pod in pods:
        compute = values[Quantity.COMPUTE].get(pod)
        memory = values[Quantity.MEMORY_USED].get(pod)
        if compute is None or memory is None:
            follow_ups.append(_incomplete(uuid, pod, compute is None, timestamp))
            continue
        out.append(
            Observation(
                pod=pod,
                gpu_uuid=uuid,
                node=gpu.node,
                timestamp=timestamp,
                compute=min(compute[0], 1.0),
                memory_used_bytes=int(memory[0]),
                memory_total_bytes=total,
                exact=compute[1] and memory[1] and measured,
                # the card's model and the profile; prices look up the card's (pricing)
                gpu_model=model,
            )
        )
    return out


def _incomplete(uuid: str, pod: PodKey, no_compute: bool, timestamp: float) -> Rejection:
    """A pod of a GPU whose compute (else memory) number is missing at this instant."""
    missing = "compute" if no_compute else "memory"
    return Rejection(
        "incomplete",
        f"GPU {uuid} pod {pod.namespace}/{pod.pod}: no {missing} number at {timestamp:.0f}",
    )


def _per_pod(
    quantity: Quantity, pods: list[PodKey], gpu: _Gpu, allocated: dict[PodKey, float | None]
) -> dict[PodKey, tuple[float, bool]]:
    """Each pod's value and whether it is exact: its own number when it has one; otherwise
    its share (by allocated fraction, equal when unknown) of what the device number leaves
    after the pods with their own numbers. A device number for a lone pod is exact."""
    result: dict[PodKey, tuple[float, bool]] = {}
    rest = []
    for pod in pods:
        own = gpu.pods.get(pod, {}).get(quantity)
        if own is not None:
            result[pod] = (own, True)
        else:
            rest.append(pod)
    device = gpu.device.get(quantity)
    if not rest or device is None:
        return result
    remainder = max(0.0, device[1] - sum(v for v, _ in result.values()))
    weights = [_fraction_of(p, allocated) for p in rest] if len(rest) > 1 else []
    if len(rest) == 1:  # the whole remainder, whatever its weight (the common case)
        shares = [1.0]
    elif all(w is not None for w in weights) and sum(w or 0.0 for w in weights) > 0:
        norm = sum(w or 0.0 for w in weights)
        shares = [(w or 0.0) / norm for w in weights]
    else:
        shares = [1.0 / len(rest)] * len(rest)
    lone = len(pods) == 1
    for pod, share in zip(rest, shares, strict=True):
        result[pod] = (remainder * share, lone)
    return result


def _fraction_of(pod: PodKey, allocated: dict[PodKey, float | None]) -> float | None:
    if pod in allocated:
        return allocated[pod]
    for key, fraction in allocated.items():  # inventory keys may lack the container
        if key.namespace == pod.namespace and key.pod == pod.pod:
            return fraction
    return None


OwnerLookup = Callable[[str, str], WorkloadRef]
