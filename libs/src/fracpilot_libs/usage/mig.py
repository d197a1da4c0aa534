"""MIG GPU instances as dcgm-exporter labels them: each is a device of its own.

dcgm-exporter labels an instance's series with its parent's ``UUID`` plus ``GPU_I_ID`` (the
NVML GPU instance id) and ``GPU_I_PROFILE`` (the profile name, e.g. ``3g.40gb``)
(``internal/pkg/collector/gpu_collector.go``, ``render_metrics.go``); in the default (flex)
mode a GPU with instances exports only its instances' series. An instance's
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is relative to the instance and its FB figures are the
instance's own.

Scales (what a ``UsageSample`` of an instance carries):

- compute is a share of one *whole* GPU, as for any sample: the instance's ratio times its
  compute slices over the card's (``3g`` of 7 on A100/H100/H200/B200: times 3/7; A30 has 4);
- memory is the instance's own: its FB figures, or, when it exports none (some H100 set-ups,
  dcgm-exporter issues 380 and 512), the size its profile name gives, marked estimated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1024**3
INSTANCE_ID_LABEL = "GPU_I_ID"
PROFILE_LABEL = "GPU_I_PROFILE"
# Compute slices of a whole card by model: the A30 splits into 4, the others into 7.
_SLICES_BY_MODEL = (("A30", 4),)
_DEFAULT_SLICES = 7
# ``3g.40gb``, ``1g.10gb+me``, ``1c.3g.40gb`` (a compute-instance profile within a 3g).
_PROFILE = re.compile(r"^(?:\d+c\.)?(?P<slices>\d+)g\.(?P<gb>\d+)gb", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance: its parent's UUID, its id and its profile."""

    parent_uuid: str
    instance_id: str
    profile: str

    @property
    def device_id(self) -> str:
        """The instance's identity in samples (``gpu_uuid``): parent UUID and instance id."""
        return f"{self.parent_uuid}/GI{self.instance_id}"


def mig_instance(parent_uuid: str, labels: Mapping[str, str]) -> MigInstance | None:
    """The instance a series belongs to, or None for a whole GPU."""
    instance_id = labels.get(INSTANCE_ID_LABEL, "")
    profile = labels.get(PROFILE_LABEL, "")
    if not instance_id and not profile:
        return None
    return MigInstance(parent_uuid, instance_id, profile)


def card_slices(model: str) -> int:
    words = model.replace("-", " ").split()
    for name, slices in _SLICES_BY_MODEL:
        if name in words:
            return slices
    return _DEFAULT_SLICES


def compute_share(profile: str, model: str) -> float | None:
    """The instance's share of the whole card's compute (``3g.40gb`` on an A100: 3/7); None
    when the profile name does not say."""
    match = _PROFILE.match(profile)
    if match is None:
        return None
    slices = int(match.group("slices"))
    return min(1.0, slices / card_slices(model))


def profile_memory_bytes(profile: str) -> int | None:
    """The memory a profile's name gives (``3g.40gb``: 40 GiB); None when it does not say.

    The name rounds the instance's real size, so a total from it is an estimate.
    """
    match = _PROFILE.match(profile)
    return int(match.group("gb")) * GIB if match is not None else None
