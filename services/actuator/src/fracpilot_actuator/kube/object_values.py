"""The names fracpilot and the GPU schedulers (KAI, HAMi) put on Kubernetes objects, and the
parsing of their values (timestamps, fractions, MiB, HAMi's device list). Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from fracpilot_libs.kai import SCALE_ADJUST_NAMESPACE

# --- names the backends and fracpilot use -----------------------------------------------------

GPU_RESOURCE = "nvidia.com/gpu"
NODE_GPU_MEMORY = "nvidia.com/gpu.memory"
NODE_GPU_COUNT = "nvidia.com/gpu.count"

KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_GROUP = "runai-gpu-group"
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"
KAI_RESERVED_GPU = "run.ai/reserve_for_gpu_index"
KAI_SCALE_ADJUST_NAMESPACE = SCALE_ADJUST_NAMESPACE

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"

OPT_OUT = "fracpilot.io/opt-out"
RESIZED_AT = "fracpilot.io/resized-at"  # written on an in-place change, with the decision id
DECISION_ID = "fracpilot.io/decision-id"
ROLE = "fracpilot.io/role"  # label; "capacity" on a scale-up's placeholder pod
CAPACITY_ROLE = "capacity"


def as_api_dict(obj: Any) -> Mapping[str, Any]:
    """An API object as the API's JSON: a dict as it is, a client model through its aliases."""
    if isinstance(obj, Mapping):
        return obj
    if isinstance(obj, BaseModel):
        dumped: dict[str, Any] = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
        return dumped
    raise TypeError(f"not a Kubernetes object: {type(obj).__name__}")


def get_path(obj: Mapping[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)  # type: ignore[assignment]
    return obj


def as_strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def parse_time(value: Any) -> datetime | None:
    """An API timestamp (``2026-03-02T10:00:00Z``) or a datetime, as aware UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


# --- values on pods ---------------------------------------------------------------------------


def parse_kai_fraction(value: str) -> float:
    """A ``gpu-fraction`` annotation; KAI's own webhook accepts only 0 < f < 1."""
    try:
        fraction = float(value.strip())
    except ValueError:
        raise ValueError(f"{KAI_FRACTION} {value!r} is not a number") from None
    if not math.isfinite(fraction) or not 0.0 < fraction < 1.0:
        raise ValueError(f"{KAI_FRACTION} {value!r} is not a portion of a GPU (0 < f < 1)")
    return fraction


def parse_mib(value: str, what: str) -> int:
    """A positive whole number of MiB without a suffix (``gpu-memory``, ``nvidia.com/gpumem``)."""
    text = value.strip()
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"{what} {value!r} is not a positive whole number of MiB")
    return int(text)


def parse_quantity_int(value: Any) -> int:
    """An extended-resource quantity (``"2"``); they are whole numbers."""
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"quantity {value!r} is not a whole number")
    return int(text)


@dataclass(frozen=True)
class HamiDevice:
    uuid: str
    type: str
    memory_mib: int
    cores: int


def parse_hami_devices(value: str) -> tuple[tuple[HamiDevice, ...], ...]:
    """``hami.io/vgpu-devices-allocated``: per container (``;``), its devices (``:``)."""
    containers: list[tuple[HamiDevice, ...]] = []
    for chunk in value.strip().split(";"):
        if not chunk.strip():
            continue
        devices = []
        for item in chunk.split(":"):
            if not item.strip():
                continue
            parts = [p.strip() for p in item.split(",")]
            # DecodeContainerDevices (HAMi 4707fb02, pkg/device/devices.go) reads the first
            # four fields and ignores any more.
            if len(parts) < 4 or not parts[0]:
                raise ValueError(f"{HAMI_ALLOCATED} device {item!r} is not UUID,type,memMiB,cores")
            try:
                memory, cores = int(parts[2]), int(parts[3])
            except ValueError:
                raise ValueError(
                    f"{HAMI_ALLOCATED} device {item!r} has a non-integer memory or cores"
                ) from None
            if memory < 0 or cores < 0:
                raise ValueError(f"{HAMI_ALLOCATED} device {item!r} has a negative amount")
            devices.append(HamiDevice(parts[0], parts[1], memory, cores))
        containers.append(tuple(devices))
    return tuple(containers)


def is_opted_out(*objects: Mapping[str, Any]) -> bool:
    """``fracpilot.io/opt-out: "true"`` as a label or annotation on any of the objects."""
    for obj in objects:
        meta = get_path(obj, "metadata") or {}
        for where in ("labels", "annotations"):
            if str((meta.get(where) or {}).get(OPT_OUT, "")).strip().lower() == "true":
                return True
    return False
