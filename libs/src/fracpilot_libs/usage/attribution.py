"""From raw metric points to per-pod usage: pure functions, no I/O, time passed in.

Per GPU, the most specific numbers win: a container's or a process's own numbers are exact;
when only whole-device numbers exist, a GPU used by one pod gives that pod the device's numbers
(exact), and a GPU shared by several pods is split between them by their allocated fractions
(equal shares when unknown) and marked *estimated*. A MIG GPU instance is a device of its own
(:mod:`fracpilot_libs.usage.mig`). Every point that cannot be used is rejected once, with one
reason (a pod left without numbers by a rejected point is not counted again), and one bad
series never stops the others.

Here: the point loop (:func:`observe_points`). Its parts: the data types
(:mod:`~fracpilot_libs.usage.attribution_types`, re-exported here), what one point says
(:mod:`~fracpilot_libs.usage.point_reading`), one GPU's numbers split between its pods
(:mod:`~fracpilot_libs.usage.gpu_split`) and applications' own series
(:mod:`~fracpilot_libs.usage.app_series`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

from fracpilot_libs.contracts import WorkloadRef
from fracpilot_libs.usage.app_series import observe_app_point, with_app_signals
from fracpilot_libs.usage.attribution_types import GatheredGpu
from fracpilot_libs.usage.attribution_types import GpuInventory as GpuInventory
from fracpilot_libs.usage.attribution_types import MetricPoint as MetricPoint
from fracpilot_libs.usage.attribution_types import Observation as Observation
from fracpilot_libs.usage.attribution_types import PodKey as PodKey
from fracpilot_libs.usage.attribution_types import Rejection as Rejection
from fracpilot_libs.usage.gpu_split import split_gpu
from fracpilot_libs.usage.mappings import (
    Level,
    MappingTable,
    MetricMapping,
    Quantity,
    gpu_model_name,
)
from fracpilot_libs.usage.mig import (
    INSTANCE_ID_LABEL,
    PROFILE_LABEL,
    compute_share,
    memory_share,
    mig_instance,
)
from fracpilot_libs.usage.point_reading import (
    MAX_SHARE,
    SHARE_QUANTITIES,
    checked_value,
    describe_point,
    is_exporter_pod,
    renamed_targets,
    role_value,
    scrape_target,
)


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
                m.quantity in SHARE_QUANTITIES,
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
    gpus: dict[str, GatheredGpu] = defaultdict(GatheredGpu)
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
                renamed = renamed_targets(points)
            observe_app_point(point, rows, renamed, app, servers, rejections)
            continue
        scaled = raw * row.scale
        # A finite, non-negative number (at most 1 for a share) passes without a call; any
        # other is checked again for its reason.
        value: float | None = scaled
        rejection = None
        if not 0.0 <= scaled < math.inf or (scaled > MAX_SHARE and row.share):
            value, rejection = checked_value(point, mapping)
        uuid = ""
        for name in row.gpu_uuid:  # role_value, inline
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
        # pod_of, inline
        pod: PodKey | None = None
        name = ""
        for pod_label in row.pod:
            if name := labels.get(pod_label, ""):
                break
        if name:
            if pod_label == "pod":
                if renamed is None:
                    renamed = renamed_targets(points)
                if renamed and scrape_target(point) in renamed:
                    name = ""  # this target's exporter labels were renamed: it is the exporter's
            if name and (exporter := row.exporters.get(name)) is None:
                exporter = row.exporters[name] = is_exporter_pod(
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
            rejections.append(Rejection("no_pod", f"no pod label: {describe_point(point)}"))
            continue
        if not device:
            rejections.append(Rejection("no_gpu", f"no GPU UUID label: {describe_point(point)}"))
            continue
        gpu = gpus[device]
        gpu.node = gpu.node or role_value(labels, mapping.roles.node)
        gpu.model = gpu.model or gpu_model_name(role_value(labels, mapping.roles.model))
        quantity = row.quantity
        if instance is not None:
            # One scale, the card's (usage.mig): compute times the compute slices here, memory
            # by the instance's share of the card's memory in split_gpu.
            compute = compute_share(instance.profile, gpu.model)
            memory = memory_share(
                instance.profile,
                gpu.model,
                inventory.device_memory_bytes.get(instance.parent_uuid),
            )
            if compute is None or memory is None:
                if not gpu.unknown_profile:  # once per instance
                    rejections.append(
                        Rejection(
                            "unknown_mig_profile", f"MIG profile unknown: {describe_point(point)}"
                        )
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
    # 100,000 GPUs visited them scattered in memory in every later step (bench/ingest_phases.py:
    # the cycle 38.6-40.3 -> 32.0-36.0 µs a GPU, observe 11.3-13.0 -> 8.3-10.3). Batches sort
    # their samples by id; History sorts by UUID for the reports.
    for uuid, gpu in gpus.items():
        observations.extend(split_gpu(uuid, gpu, inventory, timestamp, rejections))
    if not app:  # no application series: nothing to add
        return observations, rejections
    return [
        with_app_signals(
            obs,
            app.get((obs.pod.namespace, obs.pod.pod)),
            servers.get((obs.pod.namespace, obs.pod.pod)),
        )
        for obs in observations
    ], rejections


OwnerLookup = Callable[[str, str], WorkloadRef]
