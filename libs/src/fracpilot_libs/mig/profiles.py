"""The MIG profile tables of the A100 80GB and H100 80GB: what each GPU instance profile holds
and where MIG lets it start.

A MIG-capable card has 7 compute (SM) slices and 8 memory slices. A GPU instance profile takes
``compute_slices`` of the 7 and a contiguous run of ``memory_slices`` of the 8, starting at one
of its valid start slots (``starts``); two instances on a card may not share a memory slice.
That is the whole placement rule NVML enforces (nvmlDeviceGetGpuInstancePossiblePlacements_v2:
"A created GPU instance occupies memory slices described by its placement. Creation of new GPU
instance will fail if there is overlap with the already occupied memory slices";
nvmlGpuInstancePlacement_t: ``start`` = index of the first occupied memory slice, ``size`` =
number of memory slices occupied; NVML API reference, docs.nvidia.com/deploy/nvml-api).

Sources, upstream:
- Fractions, instance counts and names: NVIDIA MIG User Guide (v580), "Supported MIG Profiles",
  Table 7 "GPU Instance Profiles on H100" (1g.10gb x7, 1g.10gb+me x1, 1g.20gb x4, 2g.20gb x3,
  3g.40gb x2, 4g.40gb x1, 7g.80gb x1; SMs 1/7, 1/7, 1/7, 2/7, 3/7, 4/7, 7/7) and its note that
  on A100-SXM4-80GB the A100-40GB profiles are named 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb,
  3g.40gb, 4g.40gb, 7g.80gb with the same fractions (Table 6, "GPU Instance Profiles on A100").
  The same names and per-GPU counts for both 80GB cards are in the GPU Operator's default
  mig-parted config (NVIDIA/gpu-operator assets/state-mig-manager/0400_configmap.yaml, commit
  a22dbf6: all-1g.10gb 7, all-1g.10gb.me 1, all-1g.20gb 4, all-2g.20gb 3, all-3g.40gb 2,
  all-4g.40gb 1, all-7g.80gb 1, under "H100-80GB, H800-80GB, A100-80GB, A800-80GB").
- Placements (start slots and sizes, in memory slices): ``nvidia-smi mig -lgipp`` as printed in
  the MIG User Guide ("Getting Started with MIG", A100) and in captures on an
  "NVIDIA H100 80GB HBM3", identical on both: profile 19 (1g.10gb) {0..6}:1, 20 (1g.10gb+me)
  {0..6}:1, 15 (1g.20gb) {0,2,4,6}:2, 14 (2g.20gb) {0,2,4}:2, 9 (3g.40gb) {0,4}:4,
  5 (4g.40gb) {0}:4, 0 (7g.80gb) {0}:8. NVIDIA/go-nvml's mock (pkg/nvml/mock/gpus/a100.go,
  vendored in NVIDIA/mig-parted bd7160f) has the same A100 placements; its H100 mock
  (gpus/h100.go) lists sizes 1/3/7 for 1g.20gb/3g/7g, which contradicts the -lgipp captures and
  the memory fractions above, so it is not used.
- Instance memory (MiB, what a workload inside sees): NVML's MemorySizeMB per profile as in the
  go-nvml A100-80GB mock (9856, 19968, 40192, 80384), which matches ``nvidia-smi mig -lgip``
  captures (9.62 / 19.50 / 39.25 / 78.50 GiB). H100 80GB captures show 9.62-9.75, 19.50-19.62,
  39.25-39.50 and (one capture) 79.25 GiB depending on the driver: the lower figure is used, and
  for 7g.80gb, whose lower figure was not found, the A100's 80384 MiB (a conservative guess,
  not an observed H100 value). Memory is a hard limit, so the table errs low.
- SM counts (for reference; the compute share used for sizing is slices / 7): A100 14, 14, 14,
  28, 42, 56, 98 and H100 16, 16, 26, 32, 60, 64, 132 (-lgip captures and the go-nvml mocks).
- PCI device IDs (mig-parted's ``device-filter``): A100-SXM4-80GB 0x20B210DE and
  A100-PCIE-80GB 0x20B510DE (go-nvml mock gpus/a100.go); the GPU Operator's default config
  groups 0x233010DE, 0x233110DE and 0x232210DE as "H100-80GB, H800-80GB" (0x233010DE is
  "NVIDIA H100 80GB HBM3" in gpus/h100.go; which of the other two is the H800 was not found).
- A card holds at most 7 instances (MIG User Guide, "Supported GPUs", Max Number of Instances).
  Before driver R510 a 4g and a 3g profile could not share a card (MIG User Guide, Concepts);
  newer drivers allow it, and these tables assume them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1024 * 1024
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a card."""

    name: str  # as mig-parted and the device plugin name it: "1g.10gb", "1g.10gb+me"
    profile_id: int  # NVML's GPU instance profile ID (nvidia-smi mig -lgip)
    compute_slices: int  # of COMPUTE_SLICES
    memory_slices: int  # of MEMORY_SLICES: the size of its placement
    memory_mib: int  # the instance's memory as NVML reports it (see the module notes)
    max_instances: int  # per card
    starts: tuple[int, ...]  # valid first memory slices
    sm_count: int  # streaming multiprocessors, for reference
    media_extensions: bool = False  # "+me": the card's only OFA/JPEG; never recommended

    @property
    def compute_share(self) -> float:
        """The share of the card's compute the profile holds: its slices of 7."""
        return self.compute_slices / COMPUTE_SLICES

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    def slots(self, start: int) -> range:
        """The memory slices an instance starting at ``start`` occupies."""
        return range(start, start + self.memory_slices)


@dataclass(frozen=True, slots=True)
class MigCard:
    """A MIG-capable GPU model and its profile table."""

    key: str  # "a100-80gb"
    name: str  # "A100 80GB"
    device_ids: tuple[str, ...]  # PCI device IDs, as mig-parted's device-filter wants them
    profiles: tuple[MigProfile, ...]  # smallest first
    max_instances: int = 7
    compute_slices: int = COMPUTE_SLICES
    memory_slices: int = MEMORY_SLICES

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no MIG profile {name!r}")

    @property
    def candidates(self) -> tuple[MigProfile, ...]:
        """The profiles a recommendation picks from, smallest first: all but the media
        extension ones (which hold no more memory or compute than their plain twin)."""
        return tuple(p for p in self.profiles if not p.media_extensions)

    @property
    def largest(self) -> MigProfile:
        return self.candidates[-1]


_ALL = (0, 1, 2, 3, 4, 5, 6)


def _table(
    sms: tuple[int, int, int, int, int, int, int], memory: tuple[int, ...]
) -> tuple[MigProfile, ...]:
    """The seven profiles of an 80GB A100/H100: the same slices and placements on both."""
    m10, m20, m40, m80 = memory
    s1, s1me, s1x20, s2, s3, s4, s7 = sms
    return (
        MigProfile("1g.10gb", 19, 1, 1, m10, 7, _ALL, s1),
        MigProfile("1g.10gb+me", 20, 1, 1, m10, 1, _ALL, s1me, media_extensions=True),
        MigProfile("1g.20gb", 15, 1, 2, m20, 4, (0, 2, 4, 6), s1x20),
        MigProfile("2g.20gb", 14, 2, 2, m20, 3, (0, 2, 4), s2),
        MigProfile("3g.40gb", 9, 3, 4, m40, 2, (0, 4), s3),
        MigProfile("4g.40gb", 5, 4, 4, m40, 1, (0,), s4),
        MigProfile("7g.80gb", 0, 7, 8, m80, 1, (0,), s7),
    )


A100_80GB = MigCard(
    key="a100-80gb",
    name="A100 80GB",
    device_ids=("0x20B210DE", "0x20B510DE"),
    profiles=_table((14, 14, 14, 28, 42, 56, 98), (9856, 19968, 40192, 80384)),
)
H100_80GB = MigCard(
    key="h100-80gb",
    name="H100 80GB",
    device_ids=("0x233010DE", "0x233110DE", "0x232210DE"),
    profiles=_table((16, 16, 26, 32, 60, 64, 132), (9856, 19968, 40192, 80384)),
)
CARDS: dict[str, MigCard] = {c.key: c for c in (A100_80GB, H100_80GB)}

_A100_80 = re.compile(r"a100\b.*\b80\s*gb", re.IGNORECASE)
# H100 NVL (94GB) and GH200 (96GB) have other tables; only the 80GB H100 is modelled here.
_H100_80 = re.compile(r"h100\b(?!.*\bnvl\b).*\b80\s*gb", re.IGNORECASE)


# A MIG device's model name: the card's with the profile after "MIG", as fracpilot's samples name
# it ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", nvidia-smi's style) and as GPU feature discovery's
# mixed-strategy product label does ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb").
_MIG_SUFFIX = re.compile(r"[\s_-]+MIG[\s_-]+(?:\d+c\.)?\d+g\.\d+gb\S*\s*$", re.IGNORECASE)


def instance_model(model: str, profile: str) -> str:
    """The model name of a MIG instance of a ``model`` card: ``"<model> MIG <profile>"``."""
    return f"{model} MIG {profile}" if profile else model


def base_model(model: str) -> str:
    """The card's model without a MIG profile suffix (prices are per whole card of a model)."""
    return _MIG_SUFFIX.sub("", model)


def card_for_model(model: str) -> MigCard | None:
    """The profile table of a GPU model name (DCGM's ``modelName``, e.g. "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 80GB HBM3", or a card key such as "h100-80gb"); None when it has none here."""
    text = base_model(model.strip())
    if text.lower() in CARDS:
        return CARDS[text.lower()]
    spaced = re.sub(r"[-_]", " ", text)
    if _A100_80.search(spaced):
        return A100_80GB
    if _H100_80.search(spaced):
        return H100_80GB
    return None
