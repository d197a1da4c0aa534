"""MIG GPU instances as dcgm-exporter labels them: each is a device of its own.

dcgm-exporter labels an instance's series with its parent's ``UUID``, ``gpu`` and ``modelName``
(the card's model: ``toMetric`` takes them from the parent's ``DeviceInfo``) plus ``GPU_I_ID``
(the NVML GPU instance id) and ``GPU_I_PROFILE`` (the profile name, e.g. ``3g.40gb``)
(NVIDIA/dcgm-exporter d5e5f510: ``internal/pkg/collector/gpu_collector.go`` ``toMetric``,
``internal/pkg/devicemonitoring/device_monitoring.go`` ``monitorAllGPUInstances``,
``internal/pkg/rendermetrics/render_metrics.go``); in the default (flex) mode a GPU with
instances exports only its instances' series. An instance's ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
is relative to the instance and its FB figures are the instance's own
(``shared/reference/kai-hami-semantics.md``, "dcgm-exporter details that matter").

One scale, the card's (docs/mig.md, "One scale"): a ``UsageSample`` of an instance says what
share of its *card* the pod uses, as every other sample does, so a fraction, a price and a MIG
profile's level (``sizing.grids.profile_level``) all speak of the same card.

- compute: the instance's ratio times its compute slices over the card's (``3g`` of 7 on
  A100/H100/H200/B200: times 3/7; the A30 and RTX PRO 6000 have 4), the card's slices from its
  profile table (:func:`fracpilot_libs.mig.profiles.card_for_model`), 7 for a card without one;
- memory: the bytes used as measured, and as total the instance's memory over its share of the
  card's memory slices (a ``3g.40gb`` holds 4 of 8: its 39.25 GiB count as a 78.5 GiB card), so
  used / total is the share of the card. The instance's own memory is its FB figures or, when it
  exports none (some H100 set-ups, dcgm-exporter issues 380 and 512), the size its profile name
  gives, marked estimated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fracpilot_libs.mig.profiles import COMPUTE_SLICES, MEMORY_SLICES, card_for_model

GIB = 1024**3
INSTANCE_ID_LABEL = "GPU_I_ID"
PROFILE_LABEL = "GPU_I_PROFILE"
# ``3g.40gb``, ``1g.10gb+me``, ``1c.3g.40gb`` (a compute-instance profile within a 3g).
_PROFILE = re.compile(r"^(?:\d+c\.)?(?P<slices>\d+)g\.(?P<gb>\d+)gb", re.IGNORECASE)
_GI_PROFILE = re.compile(r"^(?:\d+c\.)?(?P<gi>\d+g\.\d+gb(?:\+me)?)", re.IGNORECASE)
_CARD_GB = re.compile(r"(?<![\d.])(?P<gb>\d+)\s*GB\b", re.IGNORECASE)  # "A100-SXM4-80GB"


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


def card_of(device_id: str) -> str:
    """The card a sample's device is on: a MIG instance's parent (``UUID/GI2``: ``UUID``), else
    the device itself."""
    parent, sep, _ = device_id.rpartition("/GI")
    return parent if sep else device_id


def mig_instance(parent_uuid: str, labels: Mapping[str, str]) -> MigInstance | None:
    """The instance a series belongs to, or None for a whole GPU."""
    instance_id = labels.get(INSTANCE_ID_LABEL, "")
    profile = labels.get(PROFILE_LABEL, "")
    if not instance_id and not profile:
        return None
    return MigInstance(parent_uuid, instance_id, profile)


def card_slices(model: str) -> int:
    """The compute slices of a whole ``model`` card: its table's, else the usual 7."""
    card = card_for_model(model)
    return card.compute_slices if card is not None else COMPUTE_SLICES


@functools.cache
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


@functools.cache
def memory_share(profile: str, model: str, card_memory_bytes: int | None = None) -> float | None:
    """The instance's share of the card's memory: its memory slices over the card's.

    From the profile table when the card has one here (``1g.20gb``: 2 of 8). Else the profile's
    nominal size over the card's, to the nearest of the card's memory slices: the card's size
    from its table (its largest profile's "141gb": dcgm-exporter may name a profile otherwise
    than the table, ``7g.79gb`` for ``7g.80gb``, NVIDIA/dcgm-exporter issue 713), else its model
    name's "80GB", else ``card_memory_bytes``; the names round the sizes (``1g.12gb`` of 94 GB:
    1/8). A profile holding all the card's compute slices holds all its memory. None when
    nothing says.
    """
    match = _PROFILE.match(profile)
    if match is None:
        return None
    card = card_for_model(model)
    gi = _GI_PROFILE.match(profile)
    if card is not None and gi is not None:
        for p in card.profiles:
            if p.name == gi.group("gi").lower():
                return p.memory_slices / card.memory_slices
    if int(match.group("slices")) >= card_slices(model):
        return 1.0
    named = _CARD_GB.search(model)
    card_gb = (
        float(card.nominal_gb)
        if card is not None
        else float(named.group("gb"))
        if named is not None
        else (card_memory_bytes / GIB if card_memory_bytes else None)
    )
    if not card_gb:
        return None
    slices = card.memory_slices if card is not None else MEMORY_SLICES
    share = round(int(match.group("gb")) / card_gb * slices)
    return min(max(share, 1), slices) / slices


def card_memory_bytes(instance_memory_bytes: int, share: float) -> int:
    """The card-scale total of an instance: its own memory over its share of the card's."""
    return round(instance_memory_bytes / share)
