"""HAMi's node register annotation ``hami.io/node-nvidia-register``: the node's real GPUs. Pure.

HAMi's device plugin registers each GPU once, with how many pods may share it
(``RegisterInAnnotation`` / ``getAPIDevices`` in
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go`` at 4707fb02):
``count`` = ``deviceSplitCount`` (default 10), ``devmem`` = NVML memory in MiB times
``deviceMemoryScaling``, ``devcore`` = 100 times ``deviceCoreScaling``, ``type`` = the NVML
name (prefixed ``NVIDIA-`` when it does not start with ``NVIDIA``). The node's
``nvidia.com/gpu`` is the kubelet's view of the same GPUs, each advertised ``count`` times
(``GetPluginDevices(deviceSplitCount, ...)`` in ``.../plugin/server.go``): a slot count, not GPUs.

Two encodings, both decoded here:

- current: a JSON array of ``DeviceInfo`` (``MarshalNodeDevices`` in ``pkg/device/devices.go``),
  fields ``id, index, count, devmem, devcore, type, numa, mode, health`` all ``omitempty``, so
  a missing field is Go's zero value (a missing ``health`` is an unhealthy GPU);
- older releases: ``UUID,count,memMiB,cores,type,numa,health[,index,mode]:`` per device
  (``EncodeNodeDevices``; ``DecodeNodeDevices`` reads 7 or 9 fields, mode ``hami-core`` when
  absent).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HAMI_REGISTER = "hami.io/node-nvidia-register"
DEFAULT_SPLIT_COUNT = 10  # charts/hami values.yaml devicePlugin.deviceSplitCount
HAMI_CORE_MODE = "hami-core"
MIG_MODE = "mig"


@dataclass(frozen=True)
class RegisteredGpu:
    """One physical GPU as HAMi registered it."""

    uuid: str
    count: int  # how many pods may share it (deviceSplitCount)
    memory_mib: int  # devmem: what HAMi's fit rules divide
    cores: int  # devcore: 100 unless deviceCoreScaling is set
    type: str
    health: bool
    index: int = 0
    numa: int = 0
    mode: str = HAMI_CORE_MODE


@dataclass(frozen=True)
class Register:
    """A node's register annotation, read: the GPUs, and the entries that did not parse."""

    gpus: tuple[RegisteredGpu, ...]
    problems: tuple[str, ...] = ()


def _int(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key, 0)  # omitempty: a missing number is 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} {value!r} is not an integer")
    return value


def _json_entry(entry: Any) -> RegisteredGpu:
    if not isinstance(entry, dict):
        raise ValueError(f"device {entry!r} is not an object")
    uuid, kind, mode = entry.get("id"), entry.get("type", ""), entry.get("mode", "")
    health = entry.get("health", False)  # omitempty: a missing health is false
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"device {entry!r} has no id")
    if not isinstance(kind, str) or not isinstance(mode, str) or not isinstance(health, bool):
        raise ValueError(f"device {uuid} has a type, mode or health of the wrong kind")
    return RegisteredGpu(
        uuid=uuid,
        count=_int(entry, "count"),
        memory_mib=_int(entry, "devmem"),
        cores=_int(entry, "devcore"),
        type=kind,
        health=health,
        index=_int(entry, "index"),
        numa=_int(entry, "numa"),
        mode=mode or HAMI_CORE_MODE,
    )


def _legacy_entry(text: str) -> RegisteredGpu:
    items = text.split(",")
    if len(items) not in (7, 9):
        raise ValueError(f"device {text!r} has {len(items)} fields, not 7 or 9")
    health = items[6].strip().lower()
    if health not in ("true", "false", "1", "0", "t", "f"):  # Go's strconv.ParseBool
        raise ValueError(f"device {text!r} has health {items[6]!r}")
    try:
        count, memory, cores, numa = (int(items[i]) for i in (1, 2, 3, 5))
        index = int(items[7]) if len(items) == 9 else 0
    except ValueError:
        raise ValueError(f"device {text!r} has a non-integer field") from None
    return RegisteredGpu(
        uuid=items[0],
        count=count,
        memory_mib=memory,
        cores=cores,
        type=items[4],
        health=health in ("true", "1", "t"),
        index=index,
        numa=numa,
        mode=items[8] if len(items) == 9 else HAMI_CORE_MODE,
    )


def parse_register(text: str) -> Register:
    """The GPUs of one node's annotation (either encoding). As in HAMi (``UnMarshalNodeDevices``
    / ``DecodeNodeDevices`` fail as a whole), one entry that does not decode makes the whole
    annotation unreadable: ValueError. A GPU registered without memory is left out and named
    in ``problems`` (nothing can be placed on it)."""
    text = text.strip()
    gpus: list[RegisteredGpu] = []
    problems: list[str] = []
    readers: list[tuple[Any, Callable[[Any], RegisteredGpu]]]
    if text.startswith("["):
        try:
            entries = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{HAMI_REGISTER} is not valid JSON: {exc}") from None
        if not isinstance(entries, list):
            raise ValueError(f"{HAMI_REGISTER} is not a JSON array")
        readers = [(e, _json_entry) for e in entries]
    elif ":" in text and "," in text:  # DecodeNodeDevices needs the device separator
        readers = [(e, _legacy_entry) for e in text.split(":") if e]
    else:
        raise ValueError(f"{HAMI_REGISTER} {text[:60]!r} is neither HAMi encoding")
    for entry, read in readers:
        try:
            gpu = read(entry)
        except ValueError as exc:
            raise ValueError(f"{HAMI_REGISTER}: {exc}") from None
        if gpu.memory_mib <= 0:
            problems.append(f"{HAMI_REGISTER}: device {gpu.uuid} registers no memory")
            continue
        gpus.append(gpu)
    return Register(tuple(gpus), tuple(problems))
