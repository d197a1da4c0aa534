"""Attribution's point loop as it was at commit 39f36e8 (before its rows were read at hand and
``pod_of`` inlined): what tests/unit/libs/usage/test_attribution_equal.py holds
``observe_points`` to. Test-only; it calls attribution's own helpers (point_reading, gpu_split,
app_series), renamed since but not changed."""

from __future__ import annotations

import math
from collections import defaultdict

from fracpilot_libs.usage.app_series import observe_app_point, with_app_signals
from fracpilot_libs.usage.attribution_types import (
    GatheredGpu,
    GpuInventory,
    MetricPoint,
    Observation,
    Rejection,
)
from fracpilot_libs.usage.gpu_split import split_gpu
from fracpilot_libs.usage.mappings import Level, MappingTable, Quantity, gpu_model_name
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
    pod_of,
    renamed_targets,
    role_value,
)


def reference_observe_points(
    points: list[MetricPoint], table: MappingTable, inventory: GpuInventory
) -> tuple[list[Observation], list[Rejection]]:
    """Turn the points of one instant into per-pod observations (see the module docstring)."""
    rejections: list[Rejection] = []
    renamed = renamed_targets(points)
    gpus: dict[str, GatheredGpu] = defaultdict(GatheredGpu)
    app: dict[tuple[str, str], dict[Quantity, float]] = defaultdict(dict)
    servers: dict[tuple[str, str], str] = {}  # pod -> the LLM server whose KV metrics it has
    timestamp = max((p.timestamp for p in points), default=0.0)
    # By identity: hashing a pydantic row hashes every field, once per point.
    priority = {id(row): i for i, row in enumerate(table.rows)}

    by_metric = table.rows_by_metric
    exporters: dict[tuple[str, tuple[str, ...]], bool] = {}  # what pod_of found of each pod
    for point in points:
        labels = point.labels
        # table.match, inline (once per point)
        for mapping in by_metric.get(point.metric, ()):
            if mapping.selects(labels):
                break
        else:
            continue
        if mapping.level is Level.APP:
            rows = table.app_rows(point.metric, labels)
            observe_app_point(point, rows, renamed, app, servers, rejections)
            continue
        scaled = point.value * mapping.scale
        # A finite, non-negative number (at most 1 for a share) passes without a call; any
        # other is checked again for its reason.
        value: float | None = scaled
        rejection = None
        if not 0.0 <= scaled < math.inf or (
            scaled > MAX_SHARE and mapping.quantity in SHARE_QUANTITIES
        ):
            value, rejection = checked_value(point, mapping)
        uuid = ""
        for name in mapping.roles.gpu_uuid:  # role_value, inline
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
        pod = pod_of(point, mapping, renamed, exporters)
        if pod is None and mapping.level is not Level.DEVICE:  # nobody to attribute it to
            rejections.append(Rejection("no_pod", f"no pod label: {describe_point(point)}"))
            continue
        if not device:
            rejections.append(Rejection("no_gpu", f"no GPU UUID label: {describe_point(point)}"))
            continue
        gpu = gpus[device]
        gpu.node = gpu.node or role_value(point.labels, mapping.roles.node)
        gpu.model = gpu.model or gpu_model_name(role_value(point.labels, mapping.roles.model))
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
            if mapping.quantity is Quantity.COMPUTE:
                value *= compute  # the instance's ratio as a share of the whole card
        if mapping.level is Level.DEVICE:
            rank = priority[id(mapping)]
            held = gpu.device.get(mapping.quantity)
            if held is None or rank < held[0]:  # earlier rows are preferred
                gpu.device[mapping.quantity] = (rank, value)
            if pod is not None:
                gpu.seen_pods.add(pod)
        elif pod is not None:
            own = gpu.pods.setdefault(pod, {})
            # Several processes of one pod add up; a container's numbers stand alone.
            if mapping.level is Level.PROCESS:
                own[mapping.quantity] = own.get(mapping.quantity, 0.0) + value
            else:
                own[mapping.quantity] = value
            gpu.seen_pods.add(pod)

    observations: list[Observation] = []
    for uuid, gpu in sorted(gpus.items()):
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
