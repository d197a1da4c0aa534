"""The MIG profile tables of the A100 80GB and 40GB (and A800s), A30 24GB, H100 80GB (and H800),
H100 NVL 94GB, H100 96GB (GH200 96GB, H20), GH200 144GB, H200 141GB (SXM and NVL), B200 180GB,
GB200 186GB, B300 and GB300 288GB and RTX PRO 6000 Blackwell 96GB: what each GPU instance profile
holds and where MIG lets it start.

A MIG-capable card here has 7 compute (SM) slices and 8 memory slices, except the A30 and the RTX
PRO 6000: 4 and 4 (MIG User Guide, "Supported MIG Profiles", A30 table: fractions in quarters;
"Supported GPUs": at most 4 instances on the A30 and on every RTX PRO 6000 Blackwell edition). A
GPU instance profile takes ``compute_slices`` of the card's and a contiguous run of
``memory_slices`` of its memory slices, starting at one of its valid start slots (``starts``);
two instances on a card may not share a memory slice. That is the whole placement
rule NVML enforces (nvmlDeviceGetGpuInstancePossiblePlacements_v2: "A created GPU instance
occupies memory slices described by its placement. Creation of new GPU instance will fail if
there is overlap with the already occupied memory slices"; nvmlGpuInstancePlacement_t: ``start``
= index of the first occupied memory slice, ``size`` = number of memory slices occupied; NVML API
reference, docs.nvidia.com/deploy/nvml-api).

Sources, upstream. "-lgip capture" means ``nvidia-smi mig -lgip`` output pasted by NVIDIA's
maintainers in NVIDIA/mig-parted and NVIDIA/gpu-operator issues and pull requests (cited per
card); its memory column is GiB with two decimals, so a figure taken from it is the least MiB the
printed figure admits (``_shown_gib``: printed - 0.005 GiB, rounded up to a MiB). Memory is a
hard limit, so every table errs low.

- Names and per-GPU instance counts of every card: the GPU Operator's default mig-parted config
  (NVIDIA/gpu-operator assets/state-mig-manager/0400_configmap.yaml, commit a22dbf6) and
  mig-parted's table of profiles per GPU (NVIDIA/mig-parted pkg/mig/builder/builder_test.go,
  ``gpuProfiles``, commit bd7160f, "Reference: .../mig-user-guide/supported-mig-profiles.html":
  "A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB", "B200-180GB").
- A100 80GB, H100 80GB. Fractions and names: NVIDIA MIG User Guide (v580), "Supported MIG
  Profiles", Table 7 "GPU Instance Profiles on H100" (1g.10gb x7, 1g.10gb+me x1, 1g.20gb x4,
  2g.20gb x3, 3g.40gb x2, 4g.40gb x1, 7g.80gb x1; SMs 1/7, 1/7, 1/7, 2/7, 3/7, 4/7, 7/7) and its
  note that on A100-SXM4-80GB the A100-40GB profiles are named 1g.10gb, 1g.10gb+me, 1g.20gb,
  2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb with the same fractions (Table 6, "GPU Instance Profiles on
  A100"); the operator's config groups them "H100-80GB, H800-80GB, A100-80GB, A800-80GB".
  Placements (start slots and sizes, in memory slices): ``nvidia-smi mig -lgipp`` as printed in
  the MIG User Guide ("Getting Started with MIG", A100) and in captures on an "NVIDIA H100 80GB
  HBM3", identical on both: profile 19 (1g.10gb) {0..6}:1, 20 (1g.10gb+me) {0..6}:1,
  15 (1g.20gb) {0,2,4,6}:2, 14 (2g.20gb) {0,2,4}:2, 9 (3g.40gb) {0,4}:4, 5 (4g.40gb) {0}:4,
  0 (7g.80gb) {0}:8. NVIDIA/go-nvml's mock (pkg/nvml/mock/gpus/a100.go, commit 2f9e261) has the
  same A100 placements; its H100 mock (gpus/h100.go) lists sizes 1/3/7 for 1g.20gb/3g/7g, which
  contradicts the -lgipp captures and the memory fractions above, so it is not used. Instance
  memory: NVML's MemorySizeMB per profile as in the go-nvml A100-80GB mock (9856, 19968, 40192,
  80384), which matches -lgip captures (9.62 / 19.50 / 39.25 / 78.50 GiB). H100 80GB captures
  show 9.62-9.75, 19.50-19.62, 39.25-39.50 and (one capture) 79.25 GiB depending on the driver:
  the lower figure is used, and for 7g.80gb, whose lower figure was not found, the A100's 80384
  MiB (a conservative guess, not an observed H100 value). SMs: A100 14, 14, 14, 28, 42, 56, 98
  and H100 16, 16, 26, 32, 60, 64, 132 (-lgip captures and the go-nvml mocks). PCI device IDs:
  A100-SXM4-80GB 0x20B210DE and A100-PCIE-80GB 0x20B510DE (go-nvml gpus/a100.go); the operator
  groups 0x233010DE, 0x233110DE, 0x232210DE and 0x232410DE as "H100-80GB, H800-80GB" (the
  driver's table, below: 2330 "NVIDIA H100 80GB HBM3", 2331 "NVIDIA H100 PCIe", 2322 "NVIDIA H800
  PCIe", 2324 "NVIDIA H800").
- A100 40GB: names 1g.5gb x7, 1g.5gb+me x1, 1g.10gb x4, 2g.10gb x3, 3g.20gb x2, 4g.20gb x1,
  7g.40gb x1 (operator config, "A100-40GB, A800-40GB"; builder_test.go "A100-40GB"), the A100
  fractions of Table 6. Instance memory 4864, 4864, 9856, 9856, 19968, 19968, 40192 MiB, SMs 14,
  14, 14, 28, 42, 56, 98 and the placements above: go-nvml gpus/a100.go (a100_40gb profiles; one
  placement table for both A100s). Device IDs: A100-SXM4-40GB 0x20B010DE, A100-PCIE-40GB
  0x20F110DE (gpus/a100.go), A800 40GB Active 0x20F610DE (the driver's table, below); the
  operator's 40GB group also holds 0x20B110DE, which that table does not name: left out.
  Profile IDs: no A100-40GB -lgip capture found (the mock's IDs are NVML's enum constants, not
  the -lgip IDs), so None.
- A30 24GB: MIG User Guide, "Supported MIG Profiles", A30 table: 1g.6gb x4 (memory 1/4, SMs
  1/4), 1g.6gb+me x1, 2g.12gb x2 (2/4), 2g.12gb+me x1, 4g.24gb x1 (full). Instance memory 5836,
  11672, 23344 MiB, SMs 14, 28, 56 and placements {0..3}:1, {0,2}:2, {0}:4: go-nvml gpus/a30.go
  (A30_PCIE_24GB, "NVIDIA A30-PCIE-24GB", device ID 0x20B710DE, as the operator's "A30-24GB"
  device-filter). Profile IDs: none found, so None.
- H100 NVL 94GB (also H800 NVL: operator "H100 NVL, H800 NVL", device IDs 0x232110DE,
  0x233A10DE; mig-parted's "H100-94GB" has the same names): 1g.12gb x7, 1g.12gb+me x1, 1g.24gb
  x4, 2g.24gb x3, 3g.47gb x2, 4g.47gb x1, 7g.94gb x1. -lgip capture (NVIDIA/gpu-operator PRs 900
  and 903, 2024-08): 19/20 (1g.12gb, +me) 10.75 GiB, SM 16; 15 (1g.24gb) 21.62 GiB, SM 26; 14
  (2g.24gb) 21.62 GiB, SM 32; the maintainer's sum in NVIDIA/mig-parted PR 101 gives 3g.47gb
  46.38 GiB. Not found: the 3g/4g/7g rows' IDs and SMs (None) and the 4g.47gb's and 7g.94gb's
  memory: the 4g is given the 3g's (the two share 4 memory slices and one size on every card
  with a full capture) and the 7g twice that (on every full capture the 7g holds at least twice
  the 4-slice figure), conservative guesses, not observed values. The model name is "NVIDIA H100
  NVL" (nvidia-smi in NVIDIA/dcgm-exporter issue 544).
- H200 141GB: -lgip capture in NVIDIA/mig-parted issue 120 (2024-09-04, "Product Name: NVIDIA
  H200", "Device Id: 0x233510DE"): 19 1g.18gb 7/7 16.00 GiB SM 16; 20 1g.18gb+me 1/1 16.00 SM
  16; 15 1g.35gb 4/4 32.25 SM 26; 14 2g.35gb 3/3 32.25 SM 32; 9 3g.71gb 2/2 69.50 SM 60; 5
  4g.71gb 1/1 69.50 SM 64; 0 7g.141gb 1/1 139.75 SM 132. Memory slices 1, 1, 2, 2, 4, 4, 8 from
  the names' sizes over 141 GB and the capture (32.25 = 2 x 16.00 and so on), as the operator's
  all-balanced 1g.18gb x2 + 2g.35gb + 3g.71gb fills 8. H200 NVL (0x233B10DE): the operator
  groups it with the H200 in all-balanced, but its all-1g.35gb names 0x233510DE only, so the
  NVL's table is the H200's without 1g.35gb.
- B200 180GB (device ID 0x290110DE: operator and mig-parted "B200" device-filter): -lgip
  captures in NVIDIA/gpu-operator PR 1242 (2025-01-29) and PR 1351 (2025-03-20, 4g.90gb added):
  19 1g.23gb 7/7 22.00 and 20.50 GiB (the lower is used), SM 18; 20 1g.23gb+me 1/1 same; 15
  1g.45gb 4/4 44.25, SM 30; 14 2g.45gb 3/3 44.25, SM 36. Memory slices as the H200's (names over
  180 GB; all-balanced 1g.23gb x2 + 2g.45gb + 3g.90gb). Not found: the 3g.90gb, 4g.90gb and
  7g.180gb rows (IDs and SMs None); their memory is twice and four times the 2-slice figure, a
  conservative guess (on every full capture a 4-slice profile holds at least twice the 2-slice
  figure). go-nvml's gpus/b200.go and gpus/h200.go mocks give round sizes (23552, 18432 MiB:
  the names times 1024, above every capture), other device IDs (0x2B0010DE, 0x233310DE) and
  1-slice placements for 1g.45gb/1g.35gb that contradict their 4 instances, so they are not used.
- Start slots on the H100 NVL, H200, B200 and the 7 x 8 cards below (H100 96GB, GH200 144GB,
  GB200, B300, GB300): no ``-lgipp`` capture found. They are taken as the A100/H100 80GB's,
  which give each profile its instance count with its memory slices (an assumption, not observed
  on these cards; mig-parted takes counts, not starts, and tries the orders until one succeeds);
  go-nvml's H200/B200 mocks list the same starts for the 1g, 2g, 3g, 4g and 7g profiles.
- A card holds at most 7 instances, the A30 and the RTX PRO 6000 4 (MIG User Guide, "Supported
  GPUs", Max Number of Instances). Before driver R510 a 4g and a 3g profile could not share a
  card (MIG User Guide, Concepts); newer drivers allow it, and these tables assume them.
- Model names and PCI device IDs of the cards below and of the A800s / H800s: the NVIDIA driver's
  table of supported GPUs (NVIDIA/open-gpu-kernel-modules README.md, commit df1c9a3, 595.45.04):
  "NVIDIA A800-SXM4-80GB" 20F3, "NVIDIA A800 80GB PCIe" 20F5, "NVIDIA A800-SXM4-40GB" 20BD,
  "NVIDIA A800 40GB Active" 20F6, "NVIDIA H800 PCIe" 2322, "NVIDIA H800" 2324, "NVIDIA H800 NVL"
  233A, "NVIDIA H20" 2329, "NVIDIA GH200 120GB" and "NVIDIA GH200 480GB" 2342, "NVIDIA GH200 144G
  HBM3e" 2348, "NVIDIA GB200" 2941, "NVIDIA B300 SXM6 AC" 3182, "NVIDIA GB300" 31C2, "NVIDIA RTX
  PRO 6000 Blackwell Server Edition" 2BB5, "... Workstation Edition" 2BB1, "... Max-Q Workstation
  Edition" 2BB4. The operator config groups "A100-80GB, A800-80GB" (0x20F310DE, 0x20F510DE in
  its filter), "H100-80GB, H800-80GB" (0x232410DE too), "A100-40GB, A800-40GB" (0x20F610DE; not
  0x20BD) and "H100 NVL, H800 NVL", so an A800 / H800 takes its A100 / H100 table.
- H100 96GB: "H100 on GH200" and the H20 (MIG User Guide, "Supported GPUs": 96GB, 7 instances).
  Names and counts: builder_test.go "H100-96GB" (1g.12gb x7, 1g.12gb+me x1, 1g.24gb x4, 2g.24gb
  x3, 3g.48gb x2, 4g.48gb x1, 7g.96gb x1) and the operator's all-balanced entry "H100-96GB,
  PG506-96GB, GH200, H20" (0x234210DE, 0x233D10DE, 0x20B610DE, 0x232910DE: 1g.12gb x2 + 2g.24gb
  + 3g.48gb). No -lgip capture found: memory, IDs and SMs as ``_named_guess`` / None.
- GH200 144GB (0x234810DE, operator "GH200 144G HBM3e"): 1g.18gb x7, 1g.18gb+me, 1g.36gb x4,
  2g.36gb x3, 3g.72gb x2, 4g.72gb, 7g.144gb (operator config; all-balanced 1g.18gb x2 + 2g.36gb
  + 3g.72gb). -lgip capture in NVIDIA/mig-parted PR 139 and NVIDIA/gpu-operator PR 1057
  (2024-10-23): 19/20 1g.18gb(+me) 17.50 GiB SM 16; 15 1g.36gb 35.25 SM 26; 14 2g.36gb 35.25 SM
  32. The 3g/4g/7g rows were not seen: memory twice and four times the 2-slice figure, as the
  B200's.
- GB200 186GB (0x294110DE, "GB200 HGX"): 1g.23gb x7, 1g.23gb+me, 1g.47gb x4, 2g.47gb x3,
  3g.93gb x2, 4g.93gb, 7g.186gb (mig-parted deployments/systemd/config-default.yaml at bd7160f,
  as fixed by NVIDIA/mig-parted PR 228 "to match the production boards"; the operator's config
  at a22dbf6 has the same all-balanced 1g.23gb x2 + 2g.47gb + 3g.93gb; its 3g.95gb, 4g.95gb and
  7g.189gb are the pre-production names PR 228 replaced). -lgip capture of a production board in
  NVIDIA/mig-parted issue 227 (2025-08-07): 19/20 1g.23gb(+me) 22.00 GiB SM 18; 15 1g.47gb 45.50
  SM 32; 14 2g.47gb 45.50 SM 38 (an earlier board's, gpu-operator PR 1303, named its 1-slice
  profile 1g.24gb: not used). The 3g/4g/7g rows as the GH200 144GB's.
- B300 (0x318210DE): 1g.34gb x7, 1g.34gb+me, 1g.67gb x4, 2g.67gb x3, 3g.135gb x2, 4g.135gb,
  7g.269gb; GB300 (0x31C210DE): 1g.35gb x7 (its all-1g.35gb entry, filtered to 0x31C210DE; the
  H200's 1g.35gb is another profile), 1g.35gb+me, 1g.70gb x4, 2g.70gb x3, 3g.139gb x2, 4g.139gb,
  7g.278gb (operator config; mig-parted commits 47c56d9 and 7544911). No -lgip capture found:
  memory, IDs and SMs as ``_named_guess`` / None.
- RTX PRO 6000 Blackwell 96GB, 4 x 4: names and counts 1g.24gb x4, 1g.24gb+me x1, 2g.48gb x2,
  4g.96gb x1 (builder_test.go "RTX-PRO-6000", device ID 0x2BB510DE; operator all-balanced
  1g.24gb x2 + 2g.48gb for 0x2BB510DE, which fills 4 of 4). Its +gfx, -me and +me.all variants
  (same slices, other engines) are read by their base name (:mod:`fracpilot_libs.usage.mig`)
  and not recommended. -lgip capture of a "RTX PRO 6000 Blackwell Server Edition" in
  bigstack-oss/cubecos issue 312: 14 1g.24gb 4/4 23.12 GiB SM 46; 21 1g.24gb+me 1/1 23.12; 5
  2g.48gb 2/2 46.50 SM 94 (captures in GoogleCloudPlatform/container-engine-accelerators PR 564
  and bottlerocket-os/bottlerocket-kernel-kit PR 300 show 23.62 for 1g.24gb on another driver;
  the lower is used). Not found: the 4g.96gb row (memory twice the 2g's, ID and SMs None) and
  the start slots, taken as the A30's {0..3}:1, {0,2}:2, {0}:4 (each profile's count from its
  memory slices; an assumption). The Workstation editions (0x2BB110DE, 0x2BB410DE) are found by
  name and given the Server Edition's table, an assumption from the MIG User Guide's "Supported
  GPUs" (same GB202 chip, 96GB, 4 instances); their IDs stay out of ``device_ids``, which the
  operator's filter does not name.
- ``_named_guess``: where no capture of a card was found, its 1-memory-slice profile's memory is
  the name's GB times 0.88, in GiB (below every captured 1-slice profile's share of its name;
  least: the H200's 1g.18gb, 16.00 GiB of 18, 0.889), and a profile of n memory slices n times
  that (every capture here shows at least n times its 1-slice figure, and so no layout of the
  smaller profiles holds more than the full one). An assumption, not an observed value; erring
  low.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MIB = 1024 * 1024
# The split of every card here but the A30 and the RTX PRO 6000 (4 and 4); per card,
# MigCard.compute_slices and MigCard.memory_slices say it.
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a card."""

    name: str  # as mig-parted and the device plugin name it: "1g.10gb", "1g.10gb+me"
    profile_id: int | None  # NVML's GPU instance profile ID (-lgip); None: not found upstream
    compute_slices: int  # of the card's compute slices
    memory_slices: int  # of the card's memory slices: the size of its placement
    memory_mib: int  # the instance's memory as NVML reports it (see the module notes)
    max_instances: int  # per card
    starts: tuple[int, ...]  # valid first memory slices
    sm_count: int | None  # streaming multiprocessors, for reference; None: not found upstream
    media_extensions: bool = False  # "+me": the card's only OFA/JPEG; never recommended
    card_compute_slices: int = COMPUTE_SLICES  # the card's, so a share needs no card

    @property
    def compute_share(self) -> float:
        """The share of the card's compute the profile holds: its slices of the card's."""
        return self.compute_slices / self.card_compute_slices

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

    def __post_init__(self) -> None:
        for p in self.profiles:
            if p.card_compute_slices != self.compute_slices:
                raise ValueError(f"{self.name} {p.name}: a share of another card's compute")
            if not 0 < p.compute_slices <= self.compute_slices or not all(
                s >= 0 and s + p.memory_slices <= self.memory_slices for s in p.starts
            ):
                raise ValueError(f"{self.name} {p.name}: past the card's slices")

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

    @property
    def nominal_gb(self) -> int:
        """The card's memory as its profile names count it: the largest profile's "<n>gb"."""
        match = _NAME_GB.search(self.largest.name)
        if match is None:
            raise ValueError(f"{self.largest.name} names no size")
        return int(match.group("gb"))


_NAME_GB = re.compile(r"\.(?P<gb>\d+)gb")
_ALL = (0, 1, 2, 3, 4, 5, 6)


def _shown_gib(gib: float) -> int:
    """The least MiB an ``nvidia-smi mig -lgip`` figure (GiB, two decimals) admits: the shown
    figure may be rounded up by up to 0.005 GiB. Memory is a hard limit, so the table errs low."""
    return math.ceil(round((gib - 0.005) * 1024, 6))


def _named_guess(gb1: int) -> tuple[int, int, int, int]:
    """The 1-, 2-, 4- and 8-memory-slice profiles' memory (MiB) of a card no capture was found
    for, from its 1-slice profile's name (``gb1``): that GB times 0.88, in GiB, then n times it
    for n slices (module notes). An assumption, erring low."""
    m1 = math.floor(gb1 * 1024 * 0.88)
    return m1, 2 * m1, 4 * m1, 8 * m1


def _table(
    names: tuple[str, str, str, str],
    memory: tuple[int, int, int, int],
    sms: tuple[int | None, int | None, int | None, int | None, int | None, int | None, int | None],
    ids: tuple[
        int | None, int | None, int | None, int | None, int | None, int | None, int | None
    ] = (
        19,
        20,
        15,
        14,
        9,
        5,
        0,
    ),
) -> tuple[MigProfile, ...]:
    """The seven profiles of a card split 7 x 8: the same slices and placements on every such
    card here, named by its memory (``names``: the 1-, 2-, 4- and 8-memory-slice sizes, e.g.
    ``("10gb", "20gb", "40gb", "80gb")``) with its instance memory (MiB, same order)."""
    g1, g2, g4, g8 = names
    m1, m2, m4, m8 = memory
    s1, s1me, s1x2, s2, s3, s4, s7 = sms
    i1, i1me, i1x2, i2, i3, i4, i7 = ids
    return (
        MigProfile(f"1g.{g1}", i1, 1, 1, m1, 7, _ALL, s1),
        MigProfile(f"1g.{g1}+me", i1me, 1, 1, m1, 1, _ALL, s1me, media_extensions=True),
        MigProfile(f"1g.{g2}", i1x2, 1, 2, m2, 4, (0, 2, 4, 6), s1x2),
        MigProfile(f"2g.{g2}", i2, 2, 2, m2, 3, (0, 2, 4), s2),
        MigProfile(f"3g.{g4}", i3, 3, 4, m4, 2, (0, 4), s3),
        MigProfile(f"4g.{g4}", i4, 4, 4, m4, 1, (0,), s4),
        MigProfile(f"7g.{g8}", i7, 7, 8, m8, 1, (0,), s7),
    )


_80GB = ("10gb", "20gb", "40gb", "80gb")
A100_80GB = MigCard(
    key="a100-80gb",
    name="A100 80GB",
    device_ids=("0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE"),  # A800 80GB: 20F3/5
    profiles=_table(_80GB, (9856, 19968, 40192, 80384), (14, 14, 14, 28, 42, 56, 98)),
)
H100_80GB = MigCard(
    key="h100-80gb",
    name="H100 80GB",
    device_ids=("0x233010DE", "0x233110DE", "0x232210DE", "0x232410DE"),  # H800: 2322, 2324
    profiles=_table(_80GB, (9856, 19968, 40192, 80384), (16, 16, 26, 32, 60, 64, 132)),
)
A100_40GB = MigCard(
    key="a100-40gb",
    name="A100 40GB",
    device_ids=("0x20B010DE", "0x20F110DE", "0x20F610DE"),  # A800 40GB Active: 20F6
    profiles=_table(
        ("5gb", "10gb", "20gb", "40gb"),
        (4864, 9856, 19968, 40192),
        (14, 14, 14, 28, 42, 56, 98),
        (None,) * 7,
    ),
)
_H100_94_M4 = _shown_gib(46.38)  # 3g.47gb; the 4g.47gb's and 7g.94gb's were not found
H100_94GB = MigCard(
    key="h100-94gb",
    name="H100 NVL 94GB",
    device_ids=("0x232110DE", "0x233A10DE"),
    profiles=_table(
        ("12gb", "24gb", "47gb", "94gb"),
        (_shown_gib(10.75), _shown_gib(21.62), _H100_94_M4, 2 * _H100_94_M4),
        (16, 16, 26, 32, None, None, None),
        (19, 20, 15, 14, None, None, None),
    ),
)
_H200 = _table(
    ("18gb", "35gb", "71gb", "141gb"),
    (_shown_gib(16.00), _shown_gib(32.25), _shown_gib(69.50), _shown_gib(139.75)),
    (16, 16, 26, 32, 60, 64, 132),
)
H200 = MigCard(key="h200-141gb", name="H200 141GB", device_ids=("0x233510DE",), profiles=_H200)
# The GPU Operator lists 1g.35gb for 0x233510DE only: without a source for it on the NVL, the
# NVL's table leaves it out (a layout without it is valid either way).
H200_NVL = MigCard(
    key="h200-nvl",
    name="H200 NVL 141GB",
    device_ids=("0x233B10DE",),
    profiles=tuple(p for p in _H200 if p.name != "1g.35gb"),
)
_B200_M2 = _shown_gib(44.25)
B200 = MigCard(
    key="b200-180gb",
    name="B200 180GB",
    device_ids=("0x290110DE",),
    profiles=_table(
        ("23gb", "45gb", "90gb", "180gb"),
        (_shown_gib(20.50), _B200_M2, 2 * _B200_M2, 4 * _B200_M2),
        (18, 18, 30, 36, None, None, None),
        (19, 20, 15, 14, None, None, None),
    ),
)
# GH200 96GB, H20, H100 96GB, PG506-96GB: one operator group, one table; no -lgip capture found.
H100_96GB = MigCard(
    key="h100-96gb",
    name="H100 96GB (GH200 96GB, H20)",
    device_ids=("0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"),
    profiles=_table(
        ("12gb", "24gb", "48gb", "96gb"),
        _named_guess(12),
        (None,) * 7,
        (None,) * 7,
    ),
)
_GH200_144_M2 = _shown_gib(35.25)
GH200_144GB = MigCard(
    key="gh200-144gb",
    name="GH200 144GB HBM3e",
    device_ids=("0x234810DE",),
    profiles=_table(
        ("18gb", "36gb", "72gb", "144gb"),
        (_shown_gib(17.50), _GH200_144_M2, 2 * _GH200_144_M2, 4 * _GH200_144_M2),
        (16, 16, 26, 32, None, None, None),
        (19, 20, 15, 14, None, None, None),
    ),
)
_GB200_M2 = _shown_gib(45.50)
GB200 = MigCard(
    key="gb200-186gb",
    name="GB200 186GB",
    device_ids=("0x294110DE",),
    profiles=_table(
        ("23gb", "47gb", "93gb", "186gb"),
        (_shown_gib(22.00), _GB200_M2, 2 * _GB200_M2, 4 * _GB200_M2),
        (18, 18, 32, 38, None, None, None),
        (19, 20, 15, 14, None, None, None),
    ),
)
B300 = MigCard(
    key="b300-288gb",
    name="B300 288GB",
    device_ids=("0x318210DE",),
    profiles=_table(
        ("34gb", "67gb", "135gb", "269gb"),
        _named_guess(34),
        (None,) * 7,
        (None,) * 7,
    ),
)
GB300 = MigCard(
    key="gb300-288gb",
    name="GB300 288GB",
    device_ids=("0x31C210DE",),
    profiles=_table(
        ("35gb", "70gb", "139gb", "278gb"),
        _named_guess(35),
        (None,) * 7,
        (None,) * 7,
    ),
)
A30_24GB = MigCard(
    key="a30-24gb",
    name="A30 24GB",
    device_ids=("0x20B710DE",),
    max_instances=4,
    compute_slices=4,
    memory_slices=4,
    profiles=(
        MigProfile("1g.6gb", None, 1, 1, 5836, 4, (0, 1, 2, 3), 14, card_compute_slices=4),
        MigProfile("1g.6gb+me", None, 1, 1, 5836, 1, (0, 1, 2, 3), 14, True, card_compute_slices=4),
        MigProfile("2g.12gb", None, 2, 2, 11672, 2, (0, 2), 28, card_compute_slices=4),
        MigProfile("2g.12gb+me", None, 2, 2, 11672, 1, (0, 2), 28, True, card_compute_slices=4),
        MigProfile("4g.24gb", None, 4, 4, 23344, 1, (0,), 56, card_compute_slices=4),
    ),
)
_RTX_M2 = _shown_gib(46.50)
_QUARTERS = (0, 1, 2, 3)  # the A30's starts: none seen on this card (module notes)
RTX_PRO_6000 = MigCard(
    key="rtx-pro-6000-96gb",
    name="RTX PRO 6000 Blackwell 96GB",
    device_ids=("0x2BB510DE",),
    max_instances=4,
    compute_slices=4,
    memory_slices=4,
    profiles=(
        MigProfile("1g.24gb", 14, 1, 1, _shown_gib(23.12), 4, _QUARTERS, 46, card_compute_slices=4),
        MigProfile(
            "1g.24gb+me", 21, 1, 1, _shown_gib(23.12), 1, _QUARTERS, 46, True, card_compute_slices=4
        ),
        MigProfile("2g.48gb", 5, 2, 2, _RTX_M2, 2, (0, 2), 94, card_compute_slices=4),
        MigProfile("4g.96gb", None, 4, 4, 2 * _RTX_M2, 1, (0,), None, card_compute_slices=4),
    ),
)
CARDS: dict[str, MigCard] = {
    c.key: c
    for c in (
        A100_80GB,
        H100_80GB,
        A100_40GB,
        A30_24GB,
        H100_94GB,
        H100_96GB,
        GH200_144GB,
        H200,
        H200_NVL,
        B200,
        GB200,
        B300,
        GB300,
        RTX_PRO_6000,
    )
}

# By the model name, spaced ("NVIDIA A100-SXM4-80GB" as "NVIDIA A100 SXM4 80GB"); first match
# wins. The names are the driver's (module notes): "GB200" and "GH200" are one word, so \bB200
# and \bH200 do not match them; "NVIDIA H800" and "NVIDIA GB300" carry no size. The "NVIDIA
# H20-3e" (232C) and "NVIDIA H20 NVL16" (230E) are other devices, not in the operator's H20 group.
_BY_MODEL: tuple[tuple[re.Pattern[str], MigCard], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), card)
    for pattern, card in (
        (r"\ba[18]00\b.*\b80\s*gb", A100_80GB),
        (r"\ba[18]00\b.*\b40\s*gb", A100_40GB),
        (r"\bh100\b(?!.*\bnvl\b).*\b80\s*gb", H100_80GB),
        (r"\bh800\b(?!.*\bnvl\b)", H100_80GB),
        (r"\bh[18]00\b.*(?:\bnvl\b|\b94\s*gb)", H100_94GB),
        (r"\bh100\b.*\b96\s*gb", H100_96GB),
        (r"\bh20\b(?!\s*(?:3e|nvl))", H100_96GB),
        (r"\bgh200\b.*\b144\s*g", GH200_144GB),
        (r"\bgh200\b", H100_96GB),
        (r"\bh200\b.*\bnvl\b", H200_NVL),
        (r"\bh200\b", H200),
        (r"\bb200\b", B200),
        (r"\bgb200\b", GB200),
        (r"\bb300\b", B300),
        (r"\bgb300\b", GB300),
        (r"\ba30\b", A30_24GB),
        (r"\brtx\s+pro\s+6000\b.*\bblackwell\b", RTX_PRO_6000),
    )
)


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
    for pattern, card in _BY_MODEL:
        if pattern.search(spaced):
            return card
    return None
