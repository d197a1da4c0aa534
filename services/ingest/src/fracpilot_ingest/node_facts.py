"""Device memory from HAMi's node register annotation: pure functions over node objects.

HAMi's device plugin registers each node's GPUs in the annotation ``hami.io/node-nvidia-register``;
:mod:`fracpilot_libs.hami.register` decodes both its encodings (the actuator reads the same
annotation for its inventory). ``devmem`` is NVML's memory times ``deviceMemoryScaling``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fracpilot_libs.hami.register import HAMI_REGISTER, parse_register
from fracpilot_libs.kube.store import metadata_only

log = logging.getLogger(__name__)
__all__ = ["HAMI_REGISTER", "hami_device_memory", "node_projection", "register_memory"]
MIB = 1024 * 1024


def node_projection(obj: dict[str, Any]) -> dict[str, Any]:
    """Identity and HAMi's register annotation only."""
    kept = metadata_only(obj)
    register = ((obj.get("metadata") or {}).get("annotations") or {}).get(HAMI_REGISTER)
    if register:
        kept["metadata"]["annotations"] = {HAMI_REGISTER: register}
    return kept


def register_memory(text: str) -> dict[str, int]:
    """GPU UUID -> device memory in bytes, from one node's annotation (either format);
    entries that do not parse are left out."""
    try:
        gpus = parse_register(text).gpus
    except ValueError:
        return {}
    return {g.uuid: g.memory_mib * MIB for g in gpus}


def hami_device_memory(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Every registered GPU's memory, over all nodes."""
    found: dict[str, int] = {}
    for node in nodes:
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(HAMI_REGISTER)
        if isinstance(text, str):
            found.update(register_memory(text))
    return found
