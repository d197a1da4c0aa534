"""Sizing a pod (or a pod template) to a target: the JSON Patch ops KAI or HAMi needs. Pure.

How a target is written (only forms the pod already uses are touched):

KAI (annotations; KAI refuses ``gpu-fraction`` >= 1 and any combination of ``gpu-fraction``,
``gpu-memory`` and an ``nvidia.com/gpu`` limit):

- a pod with ``gpu-memory`` gets ``gpu-memory`` = the target's MiB (no change when the target
  has no memory size);
- a pod with ``gpu-fraction`` gets ``gpu-fraction`` = the fraction (``"0.375"``). A whole GPU
  (fraction 1) cannot be a ``gpu-fraction``, so the pod becomes a whole-GPU pod:
  ``gpu-fraction``, ``gpu-fraction-num-devices`` and ``mps`` are removed and the fraction's
  container (``gpu-fraction-container-name``, else the first) gets the limit
  ``nvidia.com/gpu: <num-devices or 1>``, unless a container already has such a limit;
- a whole-GPU pod (an ``nvidia.com/gpu`` limit, no KAI annotation) with a fraction below 1
  becomes a fractional pod only when KAI schedules it (``schedulerName: kai-scheduler``):
  the limit and request are removed and ``gpu-fraction`` set (plus ``gpu-fraction-num-devices``
  for N > 1 GPUs and ``gpu-fraction-container-name`` when it is not the first container).
  Under another scheduler the annotation would lose the pod its GPU, so it is left alone;
- a pod without any GPU request is left alone.

HAMi (container limits): in the first container with an ``nvidia.com/gpu`` limit, each of
``nvidia.com/gpumem`` (the target's MiB in HAMi's units: divided by its ``memoryFactor``,
rounded up, as ``GenerateResourceRequests`` multiplies it back; Project-HAMi/HAMi 4707fb02
``pkg/device/nvidia/device.go``), ``nvidia.com/gpumem-percentage`` and
``nvidia.com/gpucores`` (the fraction in whole percent, rounded up) that the container already
sets is updated, in ``limits`` and, where present, ``requests`` (which must equal the limits
for extended resources). A container with none of them holds whole GPUs and is left alone.

LLM servers that preallocate (vLLM, SGLang, TGI; :mod:`fracpilot_libs.llm_servers`): when the
pod takes its target, the server's memory flag is rewritten so that it allocates within the
target's fraction (args, command or env, whole lists replaced). Under KAI alone CUDA reports
the whole card; wherever HAMi-core holds the container to a memory limit it reports the limit
(:mod:`fracpilot_libs.llm_servers`), so the flag is a share of the limit: HAMi's ``gpumem`` or
``gpumem-percentage``, and KAI's hamicore plugin, whose webhook adds ``CUDA_DEVICE_MEMORY_LIMIT``
to the fraction's container (from the pod's GPU-sharing ConfigMap, filled by the binder with
the fraction's hundredth of the card: :func:`fracpilot_libs.llm_servers.kai_hamicore_share`).
KAI's webhook sorts after this one (``mutating-kai-admission``) and ``reinvocationPolicy:
IfNeeded`` brings the pod back here once it added the env, so the second pass writes the flag
for the limit. A limit written in the pod by hand is a size the card's memory would turn
into a share, which the webhook does not know: the flag is then left with a reason. A flag
that asks for more than the fraction is reported (:attr:`Sizing.llm_warning`), whether it
could be rewritten or not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from fracpilot_actuator.admission.hamicore import (
    FRACTION_CONTAINER,
    MEMORY_LIMIT,
    env_var,
    fraction_container,
    fraction_container_at,
    parse_memory_limit,
)
from fracpilot_actuator.admission.json_patch import PatchBuilder, pointer
from fracpilot_actuator.admission.pods import (
    TARGET_ANNOTATION,
    annotations_of,
    as_list,
    as_mapping,
)
from fracpilot_libs.contracts import GpuSharing, WorkloadTarget
from fracpilot_libs.hami.fit import percent as percent  # HAMi's whole percents: one rule
from fracpilot_libs.llm_servers import (
    FlagRewrite,
    format_value,
    kai_hamicore_share,
    read_pod,
    rewrite_pod,
)

KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER = FRACTION_CONTAINER
KAI_MPS = "mps"
KAI_SCHEDULER = "kai-scheduler"
GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"

_INTEGER = re.compile(r"^\d+$")


def _int_quantity(value: Any) -> int | None:
    """A plain integer quantity ("3000", 3000); None for anything else ("3k", "1.5")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None


def _gpu_limit(container: Any) -> Any:
    return as_mapping(as_mapping(as_mapping(container).get("resources")).get("limits")).get(GPU)


_NANO = Decimal("1e-9")  # a Kubernetes quantity's finest precision
_MAX_PORTION = Decimal("0.999999999")


def format_fraction(fraction: float) -> str:
    """A KAI ``gpu-fraction``: plain decimal, at most 9 places, rounded up, 0 < value < 1.

    ``0.375`` -> ``"0.375"``, ``1e-05`` -> ``"0.00001"``. Rounding up never gives a pod less
    than its target; KAI refuses 1, so a fraction just below 1 stays below it.
    """
    if not 0.0 < fraction < 1.0 or not math.isfinite(fraction):
        raise ValueError(f"a gpu-fraction must be in (0, 1), not {fraction!r}")
    value = min(Decimal(repr(fraction)).quantize(_NANO, rounding=ROUND_CEILING), _MAX_PORTION)
    return format(value.normalize(), "f")


@dataclass
class Sizing:
    """The sizing ops for a pod; ``applies`` is False when the pod cannot take the target."""

    applies: bool
    reason: str
    builder: PatchBuilder
    changed: bool = field(default=False)
    llm: FlagRewrite | None = None  # the LLM server's flag rewrite, when the pod runs one
    llm_warning: str = ""  # the server's flag asks for more than the fraction


def _same_fraction(current: Any, wanted: str) -> bool:
    try:
        return isinstance(current, str) and Decimal(current) == Decimal(wanted)
    except ArithmeticError:
        return False


def _kai(pod: Mapping[str, Any], target: WorkloadTarget, patch: PatchBuilder) -> tuple[bool, str]:
    annotations = annotations_of(pod)
    spec = as_mapping(pod.get("spec"))
    containers = as_list(spec.get("containers"))
    ann = ("metadata", "annotations")

    if KAI_MEMORY in annotations:
        if target.memory_mib <= 0:
            return False, "the pod uses gpu-memory and the target has no memory size"
        patch.set((*ann, KAI_MEMORY), str(target.memory_mib))
        return True, f"gpu-memory {target.memory_mib} MiB"

    with_limit = [i for i, c in enumerate(containers) if _gpu_limit(c) is not None]
    if KAI_FRACTION not in annotations and not with_limit:
        return False, "the pod requests no GPU"

    if KAI_FRACTION in annotations:  # a fractional pod
        if target.fraction < 1.0:
            wanted = format_fraction(target.fraction)
            if not _same_fraction(annotations.get(KAI_FRACTION), wanted):
                patch.set((*ann, KAI_FRACTION), wanted)
            return True, f"gpu-fraction {wanted}"
        # A whole GPU: KAI refuses gpu-fraction 1, so the pod asks for whole GPUs instead.
        devices = _int_quantity(annotations.get(KAI_NUM_DEVICES)) or 1
        for key in (KAI_FRACTION, KAI_NUM_DEVICES, KAI_MPS):  # mps needs a fraction
            patch.remove((*ann, key))
        if not with_limit:
            where = fraction_container_at(spec, annotations)
            if where is None:
                return False, "the pod has no container for the GPU"
            patch.set(("spec", *where, "resources", "limits", GPU), str(devices))
        return True, f"whole GPU x{devices}"

    # A whole-GPU pod.
    if target.fraction >= 1.0:
        return True, "already whole GPUs"
    if spec.get("schedulerName") != KAI_SCHEDULER:
        return False, "a whole-GPU pod not scheduled by kai-scheduler cannot take a gpu-fraction"
    if len(with_limit) != 1:
        return False, "a gpu-fraction applies to one container; several request GPUs"
    index = with_limit[0]
    limits = as_mapping(as_mapping(as_mapping(containers[index]).get("resources")).get("limits"))
    if any(share in limits for share in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)):
        return False, "the pod holds HAMi shares, not KAI's"
    devices_wanted = _int_quantity(_gpu_limit(containers[index]))
    if devices_wanted is None or devices_wanted < 1:
        return False, f"unreadable nvidia.com/gpu limit {_gpu_limit(containers[index])!r}"
    resources = ("spec", "containers", index, "resources")
    patch.remove((*resources, "limits", GPU))
    patch.remove((*resources, "requests", GPU))
    wanted = format_fraction(target.fraction)
    patch.set((*ann, KAI_FRACTION), wanted)
    if devices_wanted > 1:
        patch.set((*ann, KAI_NUM_DEVICES), str(devices_wanted))
    if index != 0:
        patch.set((*ann, KAI_CONTAINER), str(as_mapping(containers[index]).get("name", "")))
    return True, f"gpu-fraction {wanted} (was whole GPUs)"


def _hami(
    pod: Mapping[str, Any], target: WorkloadTarget, patch: PatchBuilder, memory_factor: int = 1
) -> tuple[bool, str]:
    containers = as_list(as_mapping(pod.get("spec")).get("containers"))
    index = next((i for i, c in enumerate(containers) if _gpu_limit(c) is not None), None)
    if index is None:
        return False, "no container has an nvidia.com/gpu limit"
    resources = as_mapping(as_mapping(containers[index]).get("resources"))
    wanted: dict[str, int] = {HAMI_MEMORY_PERCENT: percent(target.fraction)}
    wanted[HAMI_CORES] = wanted[HAMI_MEMORY_PERCENT]
    if target.memory_mib > 0:
        wanted[HAMI_MEMORY] = math.ceil(target.memory_mib / max(memory_factor, 1))
    limits = as_mapping(resources.get("limits"))
    used = [r for r in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES) if r in limits]
    applied = [r for r in used if r in wanted]
    if not applied:
        if used:
            return False, "the pod sets only nvidia.com/gpumem and the target has no memory size"
        return False, "the GPU container sets no HAMi share (gpumem, gpumem-percentage, gpucores)"
    for resource in applied:
        for section in ("limits", "requests"):
            current = as_mapping(resources.get(section)).get(resource)
            if current is None or _int_quantity(current) == wanted[resource]:
                continue
            path = ("spec", "containers", index, "resources", section, resource)
            patch.set(path, str(wanted[resource]))
    return True, ", ".join(f"{r}={wanted[r]}" for r in applied)


def sizing_patch(
    pod: Mapping[str, Any], target: WorkloadTarget, *, hami_memory_factor: int = 1
) -> Sizing:
    """The ops that give ``pod`` the target, and whether the pod can take it at all
    (``hami_memory_factor``: HAMi's ``memoryFactor``)."""
    builder = PatchBuilder(pod)
    if target.backend is GpuSharing.KAI:
        applies, reason = _kai(pod, target, builder)
    else:
        applies, reason = _hami(pod, target, builder, hami_memory_factor)
    llm: FlagRewrite | None = None
    warning = ""
    if applies:
        llm, warning = _llm_server(pod, target, builder)
        if llm is not None and llm.changes:
            reason = f"{reason}; {llm.reading.server} memory flag {llm.value}"
    return Sizing(
        applies=applies,
        reason=reason,
        builder=builder,
        changed=bool(builder.ops),
        llm=llm,
        llm_warning=warning,
    )


def visible_share(pod: Mapping[str, Any], target: WorkloadTarget) -> float | str:
    """The share of the card that CUDA reports as total inside the pod, or why it is unknown:
    HAMi-core reports a memory limit (HAMi's gpumem or gpumem-percentage, KAI's hamicore
    ``CUDA_DEVICE_MEMORY_LIMIT``) as the total; KAI's fractions alone do not limit."""
    if target.backend is GpuSharing.KAI:
        return _kai_visible_share(pod, target.fraction)
    for container in as_list(as_mapping(pod.get("spec")).get("containers")):
        limits = as_mapping(as_mapping(as_mapping(container).get("resources")).get("limits"))
        if HAMI_MEMORY in limits or HAMI_MEMORY_PERCENT in limits:
            return min(max(target.fraction, 1e-9), 1.0)
    return 1.0


def _kai_visible_share(pod: Mapping[str, Any], fraction: float) -> float | str:
    """KAI's share, read as the actuator reads a running pod (:mod:`.hamicore`): the fraction
    container's ``CUDA_DEVICE_MEMORY_LIMIT``, from the binder (the fraction's hundredth) or
    written in the pod (a size whose share of the card is not known here)."""
    container = fraction_container(as_mapping(pod.get("spec")), annotations_of(pod))
    limit = env_var(container, MEMORY_LIMIT)
    if limit is None:
        return 1.0
    if "valueFrom" in limit:  # KAI's hamicore: the binder fills it from the fraction
        return kai_hamicore_share(fraction)
    text = str(limit.get("value", "")).strip()
    if not text:  # an empty value sets no limit
        return 1.0
    try:
        if parse_memory_limit(text) is None:  # 0, 0m, 0g: HAMi-core's no limit
            return 1.0
    except ValueError as exc:
        return f"{exc}: what CUDA reports inside the pod is unknown here"
    return (
        f"{MEMORY_LIMIT}={text} is set in the pod: CUDA reports that size as the total, "
        "and its share of the card is unknown here"
    )


def _llm_server(
    pod: Mapping[str, Any], target: WorkloadTarget, patch: PatchBuilder
) -> tuple[FlagRewrite | None, str]:
    spec = as_mapping(pod.get("spec"))
    view = visible_share(pod, target)
    if isinstance(view, str):
        reading = read_pod(spec)
        if reading.server is None:
            return None, ""
        rewrite = FlagRewrite(reading, problem=view)
        return rewrite, f"{reading.server} memory flag not rewritten: {view}"
    rewrite = rewrite_pod(spec, target.fraction, visible_share=view)
    reading = rewrite.reading
    if reading.server is None:
        return None, ""
    warning = ""
    if reading.asks_more_than(target.fraction, view):
        asked = reading.asked_share(view)
        what = "sizes itself from the card" if asked is None else f"asks {format_value(asked)}"
        done = f"rewritten to {rewrite.value}" if rewrite.changes else "left as it is"
        warning = (
            f"{reading.server} in container {reading.container_name!r} {what} of the GPU, "
            f"more than its fraction {format_value(target.fraction)}: {done}"
        )
    elif reading.problem and target.fraction < 1.0:
        warning = f"{reading.server} memory flag not rewritten: {reading.problem}"
    for section, values in rewrite.changes.items():
        patch.set(("spec", "containers", reading.container or 0, section), values)
    return rewrite, warning


def template_patch(
    workload: Mapping[str, Any], target: WorkloadTarget, *, hami_memory_factor: int = 1
) -> tuple[Sizing, list[dict[str, Any]]]:
    """The sizing of a Deployment's or StatefulSet's pod template, as ops on the workload.

    ``spec.template`` is shaped like a pod, so :func:`sizing_patch` sizes it as it sizes a pod
    (the same forms, the same refusals); the template also gets ``fracpilot.io/target`` when
    anything changes. The ops' paths start at the workload object (``/spec/template/...``);
    no ops when the template holds the target already or cannot take it.
    """
    template = as_mapping(as_mapping(workload.get("spec")).get("template"))
    sizing = sizing_patch(template, target, hami_memory_factor=hami_memory_factor)
    if not (sizing.applies and sizing.changed):
        return sizing, []
    sizing.builder.set(("metadata", "annotations", TARGET_ANNOTATION), target.decision_id)
    prefix = pointer(("spec", "template"))
    return sizing, [{**op, "path": prefix + op["path"]} for op in sizing.builder.ops]
