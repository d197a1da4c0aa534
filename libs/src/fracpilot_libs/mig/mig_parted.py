"""The mig-parted configuration (``mig-configs``) that creates a layout, and mig-parted's own
checks on such a document.

The format is mig-parted's v1 spec (NVIDIA/mig-parted api/spec/v1/spec.go, commit bd7160f):
``version: v1`` and ``mig-configs``, a map from a config name to a list of entries, each with
``devices`` ("all" or a list of GPU indexes), ``mig-enabled``, ``mig-devices`` (profile name
-> count; required when enabled, empty when not) and optionally ``device-filter`` (PCI device
IDs). mig-parted applies an entry to every GPU whose index and device ID match it
(cmd/nvidia-mig-parted/assert/assert.go, WalkSelectedMigConfigForEachGPU) and leaves GPUs no
entry matches alone. It takes counts, not start slots: it tries the orders of creating the
instances until one succeeds (pkg/mig/config/config.go, iteratePermutationsUntilSuccess), so a
layout's start slots show that a valid placement exists, not the one the driver will pick.
The GPU Operator's MIG manager applies the config named by the node label
``nvidia.com/mig.config`` from the ConfigMap set in ClusterPolicy ``migManager.config.name``
(NVIDIA/gpu-operator controllers/state_manager.go, api/nvidia/v1/clusterpolicy_types.go).

The document is returned as plain data (dicts, lists, strings, ints); the caller writes it as
YAML or JSON.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fracpilot_libs.mig.layout import GpuLayout
from fracpilot_libs.mig.profiles import MigCard

VERSION = "v1"
NAME_PREFIX = "fracpilot-"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# mig-parted's profile names: "<c>c.<g>g.<m>gb" or "<g>g.<m>gb", then optionally "+" or "-"
# and comma-separated attributes of letters, digits and inner dots, not starting with a digit
# (go-nvlib pkg/nvlib/device/mig_profile.go, parseMigProfile, vendored in mig-parted bd7160f)
_ATTR = r"[A-Za-z](?:[A-Za-z0-9.]*[A-Za-z0-9])?"
_PROFILE_NAME = re.compile(rf"^(\d+c\.)?\d+g\.\d+gb(?:[+-]{_ATTR}(?:,{_ATTR})*)?$")


def config_name(node: str) -> str:
    """A config name for a node, usable as the value of the ``nvidia.com/mig.config`` label
    (63 characters at most, alphanumerics, '-', '_' and '.' inside)."""
    clean = re.sub(r"[^-A-Za-z0-9_.]", "-", node).strip("-_.") or "node"
    name = f"{NAME_PREFIX}{clean}"
    if len(name) > 63:
        digest = hashlib.sha256(node.encode()).hexdigest()[:8]
        name = f"{name[: 63 - 9].rstrip('-_.')}-{digest}"
    return name


def config_entries(gpus: Sequence[GpuLayout], card: MigCard) -> list[dict[str, Any]]:
    """One entry per distinct GPU set-up, naming the GPU indexes (the layout's order) it
    applies to."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for index, gpu in enumerate(gpus):
        shape = (gpu.mig_enabled, tuple(gpu.counts().items()))
        groups.setdefault(shape, []).append(index)
    entries = []
    for (enabled, counts), devices in groups.items():
        entry: dict[str, Any] = {
            "device-filter": list(card.device_ids),
            "devices": devices,
            "mig-enabled": enabled,
        }
        if enabled:
            entry["mig-devices"] = dict(counts)
        entries.append(entry)
    return entries


def mig_parted_config(nodes: Mapping[str, Sequence[GpuLayout]], card: MigCard) -> dict[str, Any]:
    """The ``mig-configs`` document with one config per node (see :func:`config_name`)."""
    return {
        "version": VERSION,
        "mig-configs": {
            config_name(node): config_entries(gpus, card) for node, gpus in nodes.items() if gpus
        },
    }


def spec_problems(document: Any) -> list[str]:
    """What mig-parted's v1 parser would reject in ``document`` ([] when nothing): the checks of
    api/spec/v1/spec.go (Spec and MigConfigSpec UnmarshalJSON) and of MigConfig
    AssertValidFormat (pkg/types/mig_config.go)."""
    if not isinstance(document, dict):
        return ["the document is not a map"]
    out = [f"unexpected field: {k}" for k in document if k not in ("version", "mig-configs")]
    if document.get("version") != VERSION:
        out.append(f"unknown version: {document.get('version')!r}")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        return [*out, "at least one entry in 'mig-configs' is required"]
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            out.append(f"at least one entry in {name!r} is required")
            continue
        for i, entry in enumerate(entries):
            out += [f"{name}[{i}]: {p}" for p in _entry_problems(entry)]
    return out


def _entry_problems(entry: Any) -> list[str]:
    if not isinstance(entry, dict):
        return ["not a map"]
    allowed = ("device-filter", "devices", "mig-enabled", "mig-devices")
    out = [f"unexpected field: {k}" for k in entry if k not in allowed]
    out += [f"missing required field: {k}" for k in ("devices", "mig-enabled") if k not in entry]
    devices = entry.get("devices")
    if (
        "devices" in entry
        and devices != "all"
        and (not isinstance(devices, list) or not all(_is_int(d) for d in devices))
    ):
        out.append(f"devices must be 'all' or a list of GPU indexes, not {devices!r}")
    flt = entry.get("device-filter")
    if "device-filter" in entry and not (
        isinstance(flt, str) or (isinstance(flt, list) and all(isinstance(f, str) for f in flt))
    ):
        out.append(f"device-filter must be a string or a list of strings, not {flt!r}")
    enabled = entry.get("mig-enabled")
    if "mig-enabled" in entry and not isinstance(enabled, bool):
        out.append(f"mig-enabled must be true or false, not {enabled!r}")
    mig_devices = entry.get("mig-devices")
    if enabled is True and mig_devices is None:
        out.append("missing required field 'mig-devices' when 'mig-enabled' is true")
    if enabled is False and mig_devices:
        out.append("MIG devices included when 'mig-enabled' is false")
    if isinstance(mig_devices, dict) and mig_devices:
        for profile, count in mig_devices.items():
            if not isinstance(profile, str) or not _PROFILE_NAME.match(profile):
                out.append(f"invalid format for {profile!r}")
            if not _is_int(count) or count < 0:
                out.append(f"invalid count for {profile!r}: {count!r}")
        if all(_is_int(c) and c == 0 for c in mig_devices.values()):
            out.append("all counts for all MigProfiles are 0")
    elif mig_devices is not None and not isinstance(mig_devices, dict):
        out.append(f"mig-devices must be a map, not {mig_devices!r}")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def label_value_ok(name: str) -> bool:
    """Whether ``name`` can be a Kubernetes label value (the ``nvidia.com/mig.config`` label)."""
    return bool(_LABEL_VALUE.match(name))
