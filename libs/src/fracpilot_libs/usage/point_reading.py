"""What one metric point says, for attribution: the pod it names (not the exporter's own pod,
not a target whose exporter labels Prometheus renamed), a role label's value, and its value
checked (finite, not negative, a share at most 1), with a rejection saying why not."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping

from fracpilot_libs.usage.attribution_types import MetricPoint, PodKey, Rejection
from fracpilot_libs.usage.mappings import MetricMapping, Quantity

_EPS = 1e-9
SHARE_QUANTITIES = frozenset({Quantity.COMPUTE, Quantity.KV_CACHE})  # 0..1
MAX_SHARE = 1 + _EPS  # a share just above 1 is float noise, not a bad point


def role_value(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return ""


def describe_point(point: MetricPoint) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(point.labels.items()))
    return f"{point.metric}{{{shown}}}={point.value!r}@{point.timestamp:.0f}"


def scrape_target(point: MetricPoint) -> tuple[str, str]:
    return point.labels.get("job", ""), point.labels.get("instance", "")


def renamed_targets(points: Iterable[MetricPoint]) -> set[tuple[str, str]]:
    """Scrape targets whose exporter labels Prometheus renamed to ``exported_*``."""
    return {
        (labels.get("job", ""), labels.get("instance", ""))
        for p in points
        if "exported_pod" in (labels := p.labels) or "exported_namespace" in labels
    }


def pod_of(
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
    if renamed and pod_label == "pod" and scrape_target(point) in renamed:
        return None  # this target's exporter labels were renamed: ``pod`` is the exporter's
    prefixes = roles.exporter_pod_prefixes
    exporter = exporters.get((pod, prefixes)) if exporters is not None else None
    if exporter is None:
        exporter = is_exporter_pod(pod, prefixes)
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


def is_exporter_pod(pod: str, names: tuple[str, ...]) -> bool:
    """``dcgm-exporter-x7k2p`` and a Helm release's ``gpu-mon-dcgm-exporter-x7k2p`` alike."""
    return _exporter_pod_pattern(names).search(pod) is not None


@functools.cache
def _exporter_pod_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in names)
    return re.compile(f"(?:^|-)(?:{alternatives})-")


def checked_value(
    point: MetricPoint, mapping: MetricMapping, raw: float | None = None
) -> tuple[float | None, Rejection | None]:
    value = (point.value if raw is None else raw) * mapping.scale
    if math.isnan(value) or math.isinf(value):
        return None, Rejection("nan", f"not a finite number: {describe_point(point)}")
    if value < 0:
        return None, Rejection("negative", f"negative value: {describe_point(point)}")
    if mapping.quantity in SHARE_QUANTITIES and value > MAX_SHARE:
        return None, Rejection("above_100_percent", f"above 100%: {describe_point(point)}")
    return value, None
