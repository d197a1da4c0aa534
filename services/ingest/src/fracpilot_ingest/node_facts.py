"""Device memory from HAMi's node register annotation: pure functions over node objects.

HAMi's device plugin registers each node's GPUs in the annotation ``hami.io/node-nvidia-register``
(``RegisterInAnnotation``, ``pkg/device/devices.go`` at 4707fb02): today a JSON array of
``{"id": UUID, "count", "devmem": MiB, "devcore", "type", "numa", "mode", "health", ...}``
(``MarshalNodeDevices``); older releases wrote ``UUID,count,memMiB,cores,type,numa,health[,index,
mode]:`` per device, which HAMi still decodes. ``devmem`` is NVML's memory times
``deviceMemoryScaling``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fracpilot_libs.kube.store import metadata_only

log = logging.getLogger(__name__)
HAMI_REGISTER = "hami.io/node-nvidia-register"
MIB = 1024 * 1024


def node_projection(obj: dict[str, Any]) -> dict[str, Any]:
    """Identity and HAMi's register annotation only."""
    kept = metadata_only(obj)
    register = ((obj.get("metadata") or {}).get("annotations") or {}).get(HAMI_REGISTER)
    if register:
        kept["metadata"]["annotations"] = {HAMI_REGISTER: register}
    return kept


def _legacy(text: str) -> dict[str, int]:
    found = {}
    for entry in text.split(":"):
        items = entry.split(",")
        if len(items) not in (7, 9):
            continue
        try:
            memory = int(items[2])
        except ValueError:
            continue
        if items[0] and memory > 0:
            found[items[0]] = memory * MIB
    return found


def register_memory(text: str) -> dict[str, int]:
    """GPU UUID -> device memory in bytes, from one node's annotation (either format);
    entries that do not parse are left out."""
    text = text.strip()
    if not text.startswith("["):
        return _legacy(text)
    try:
        devices = json.loads(text)
    except ValueError:
        return {}
    found = {}
    for device in devices if isinstance(devices, list) else ():
        if not isinstance(device, dict):
            continue
        uuid, memory = device.get("id"), device.get("devmem")
        if isinstance(uuid, str) and uuid and isinstance(memory, int) and memory > 0:
            found[uuid] = memory * MIB
    return found


def hami_device_memory(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Every registered GPU's memory, over all nodes."""
    found: dict[str, int] = {}
    for node in nodes:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(HAMI_REGISTER)
        if isinstance(text, str):
            found.update(register_memory(text))
    return found
