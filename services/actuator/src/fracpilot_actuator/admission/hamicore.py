"""KAI's HAMi-core memory limit as a pod (or a pod template) spells it. Pure.

One reading for the webhook (:func:`.sizing.visible_share`: what CUDA reports as the card
inside a pod being created) and the actuator (:mod:`fracpilot_actuator.kube.enforcement`: what
a running container is held to, where the upstream sources are cited): which container holds
the fraction, its ``CUDA_DEVICE_MEMORY_LIMIT``, and HAMi-core's reading of a size. It lives
here, not in ``kube``, because ``kube`` imports ``admission`` (the executor sizes templates
with :func:`.sizing.template_patch`) and the import-linter contracts forbid the circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fracpilot_actuator.admission.pods import as_list, as_mapping
from fracpilot_libs.contracts import MIB

MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"  # KAI's hamicore env (HAMi's own is ..._<i>)
FRACTION_CONTAINER = "gpu-fraction-container-name"  # KAI: which container holds the share


def fraction_container_at(
    spec: Mapping[str, Any], annotations: Mapping[str, Any]
) -> tuple[str, int] | None:
    """Where KAI's fraction lives, as (``containers`` or ``initContainers``, index): the
    container ``gpu-fraction-container-name`` names, an init container too (KAI binder's
    ``GetFractionContainerRef``; names are unique across both lists), else the first
    container; None without one."""
    name = annotations.get(FRACTION_CONTAINER)
    if isinstance(name, str) and name:
        for section in ("containers", "initContainers"):
            for i, container in enumerate(as_list(spec.get(section))):
                if as_mapping(container).get("name") == name:
                    return section, i
    return ("containers", 0) if as_list(spec.get("containers")) else None


def fraction_container(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> dict[str, Any]:
    """The container :func:`fraction_container_at` names; {} without one."""
    where = fraction_container_at(spec, annotations)
    if where is None:
        return {}
    section, index = where
    return as_mapping(as_list(spec.get(section))[index])


def env_var(container: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The container's env entry ``name``; None when it sets none."""
    return next(
        (e for e in map(as_mapping, as_list(container.get("env"))) if e.get("name") == name),
        None,
    )


def parse_memory_limit(text: str) -> int | None:
    """HAMi-core's memory limit in whole MiB (``40960m``, ``40g``, ``1048576k``, bytes; a
    limit under a MiB is 1, never "unlimited"); None for 0 in any unit (``0``, ``0m``,
    ``0g``: HAMi-core's no limit). Raises ValueError for anything else."""
    value = text.strip().lower()
    scale = {"k": 1024, "m": MIB, "g": 1024 * MIB}.get(value[-1:], 1) if value else 1
    digits = value[:-1] if scale != 1 else value
    if not digits.isdigit():
        raise ValueError(f"{MEMORY_LIMIT} {text!r} is not a size (1g, 1024m, 1048576k, bytes)")
    size = int(digits) * scale
    return max(size // MIB, 1) if size else None
